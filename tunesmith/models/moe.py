"""Mixture-of-experts models: the router's load-balancing loss their forward can add, their routers, and the
expert weights that transformers 5 stores fused as one 3-D parameter per projection ([experts, out, in], or
[experts, in, out] for gpt-oss) instead of one nn.Linear per expert.

A MoE causal LM of transformers 5 (Qwen2/3-MoE, Mixtral, gpt-oss, OLMoE, Granite-MoE, Jamba, DBRX, ...) computes
the Switch Transformer load-balancing loss from its router logits when called with `output_router_logits=True`,
returns it as `aux_loss`, and adds `self.router_aux_loss_coef * aux_loss` to `loss` (JetMoE names it
`aux_loss_coef`). Those with auxiliary-loss-free balancing (DeepSeek-V3, GLM-4-MoE: a routing bias) have the
config flag but no coefficient and no loss to add.

How the experts compute (`--experts_implementation`) is transformers' experts interface
(`transformers/integrations/moe.py`): the model classes decorated with `use_experts_implementation` look their
experts' forward up by `config._experts_implementation` on every call: eager (a loop over the experts hit),
grouped_mm (the rows sorted by expert, one `torch.nn.functional.grouped_mm` per projection) or batched_mm (each
token's chosen experts' weights gathered, then `torch.bmm`). They compute the same sums in another order. torch's
grouped_mm needs every matrix's rows to be a multiple of 16 bytes (it raises "strides should be multiple of 16 bytes"
otherwise, on CPU and CUDA alike), which transformers checks only for torch <= 2.10."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..utils.config_facts import text_config

logger = logging.getLogger(__name__)

# The attribute of the causal LM whose value multiplies the aux loss its forward adds to `loss`.
COEFFICIENT_ATTRIBUTES = ("router_aux_loss_coef", "aux_loss_coef")
# Config fields that count the routed experts, across families (DBRX's sits in its ffn_config).
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "moe_num_experts", "n_routed_experts")
# --experts_implementation's choices beside auto, all transformers' own (sonicmoe and deepgemm are CUDA kernels
# fetched from the hub at run time, which tunesmith does not do).
EXPERTS_IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")
GROUPED_MM_ALIGNMENT = 16  # bytes: torch's grouped_mm refuses matrices whose rows are not a multiple of it


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT model (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def router_loss_attribute(model: nn.Module) -> str | None:
    """The name of the attribute holding the coefficient of the router loss the model's forward adds; None for a
    model that defines no such loss (dense, or a MoE balanced without one)."""
    base = causal_lm(model)
    if not hasattr(getattr(base, "config", None), "output_router_logits"):
        return None
    for name in COEFFICIENT_ATTRIBUTES:
        value = getattr(base, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return name
    return None


def expert_count(config: object) -> int | None:
    """How many routed experts each MoE layer has, from the (text) config; None for a dense model."""
    config = text_config(config)
    for source in (config, getattr(config, "ffn_config", None)):
        for name in EXPERT_COUNT_FIELDS:
            value = getattr(source, name, None)
            if isinstance(value, int) and value > 1:
                return value
    return None


def is_router(name: str, module: nn.Module, experts: int | None) -> bool:
    """A linear layer of a MoE model, named as a router or gate, that routes (one output per expert: DBRX's and
    JetMoE's router.layer, AFMoE's gate) or gates a shared expert (one output: Qwen2-MoE's shared_expert_gate).
    Most MoE families of transformers 5 keep their router as a bare weight parameter, which no target list reaches."""
    if experts is None or not isinstance(module, nn.Linear) or module.out_features not in (experts, 1):
        return False
    return any(part in ("router", "gate") or part.endswith("_gate") for part in name.split("."))


def fused_expert_parameters(model: nn.Module) -> list[str]:
    """PEFT `target_parameters` names ("experts.gate_up_proj", ...) of the expert weights stacked as one 3-D
    [experts, ., .] parameter outside any linear or convolution layer (Mamba's conv1d weight is 3-D too): what
    `target_modules` cannot reach. Their biases (2-D) are not adapted."""
    experts = expert_count(causal_lm(model).config) if hasattr(causal_lm(model), "config") else None
    if experts is None:
        return []
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            continue
        for param_name, param in module.named_parameters(recurse=False):
            shape = getattr(param, "ds_shape", param.shape)  # under ZeRO-3 the parameter in memory is empty
            if len(shape) == 3 and shape[0] == experts and param.dtype.is_floating_point:
                leaf = module_name.rsplit(".", 1)[-1]
                names.add(f"{leaf}.{param_name}" if leaf else param_name)
    return sorted(names)


def expert_lora_parameters(model: nn.Module, lora_dropout: float) -> list[str]:
    """The fused expert weights `--lora_target all` adapts. PEFT's LoRA on a parameter folds B @ A into the weight
    before the experts run, so it has no input to drop out and refuses any lora_dropout: with one, the experts
    stay untrained, and one line says which and how to train them."""
    names = fused_expert_parameters(model)
    if names and lora_dropout > 0:
        logger.warning("LoRA leaves the experts' fused weights untrained (%s): PEFT's LoRA on a parameter takes no "
                       "dropout; --lora_dropout 0 trains them too", ", ".join(names))
        return []
    if names:
        logger.info("LoRA on the experts' fused weights too: %s (the routers stay frozen)", ", ".join(names))
    return names


def model_class(config: Any) -> type | None:
    """The transformers class a causal-LM (or image-text-to-text) load of this config builds; None when transformers
    does not know it (remote code)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    )

    for mapping in (MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING):
        try:
            return mapping[type(config)]
        except (KeyError, ValueError):
            continue
    return None


def experts_load_kwargs(requested: str, config: Any) -> dict[str, str]:
    """What from_pretrained takes for --experts_implementation `requested` on a model of `config`: nothing for a
    dense model (a kernel named there does nothing, which a warning says) or a class transformers does not know;
    auto: grouped_mm where the class dispatches its experts through transformers' interface, else eager (the
    alignment grouped_mm needs is checked on the loaded weights: `settle_experts_implementation`). A kernel named
    for a MoE class that does not dispatch is refused in one line: it would silently run eager."""
    if expert_count(config) is None:
        if requested != "auto":
            logger.warning("--experts_implementation %s does nothing: %s is not a mixture of experts", requested,
                           config.model_type)
        return {}
    cls = model_class(config)
    if cls is None:
        return {} if requested == "auto" else {"experts_implementation": requested}
    takes = cls._can_set_experts_implementation()
    if requested == "auto":
        return {"experts_implementation": "grouped_mm" if takes else "eager"}
    if requested != "eager" and not takes:
        raise ConfigError(f"--experts_implementation {requested}: {cls.__name__} runs its experts in its own loop, "
                          "not through transformers' experts interface; use eager (or auto)")
    return {"experts_implementation": requested}


def misaligned_expert_weights(model: nn.Module) -> list[str]:
    """'name [shape] dtype' of every fused expert weight with a matrix row (either of its last two dimensions) that
    is not a multiple of 16 bytes: what torch's grouped_mm cannot multiply."""
    base = causal_lm(model)
    experts = expert_count(base.config) if hasattr(base, "config") else None
    if experts is None:
        return []
    found = []
    for name, param in base.named_parameters():
        shape = tuple(getattr(param, "ds_shape", param.shape))  # under ZeRO-3 the parameter in memory is empty
        if len(shape) != 3 or shape[0] != experts:
            continue
        if any(dim * param.element_size() % GROUPED_MM_ALIGNMENT for dim in shape[1:]):
            found.append(f"{name} {list(shape)} {str(param.dtype).removeprefix('torch.')}")
    return found


def settle_experts_implementation(model: nn.Module, requested: str) -> str | None:
    """The experts implementation the loaded model runs (None for a dense one), logged once: grouped_mm on weights
    it cannot multiply is refused in one line when named, and falls back to eager under auto."""
    base = causal_lm(model)
    config = getattr(base, "config", None)
    if config is None or expert_count(config) is None:
        return None
    chosen = getattr(config, "_experts_implementation", None) or "eager"
    misaligned = misaligned_expert_weights(base) if chosen == "grouped_mm" else []
    if misaligned and requested == "grouped_mm":
        raise ConfigError(f"--experts_implementation grouped_mm: torch's grouped_mm needs each expert matrix's rows "
                          f"to be a multiple of {GROUPED_MM_ALIGNMENT} bytes, and {misaligned[0]} is not; use eager "
                          "or batched_mm (or auto)")
    if misaligned:
        base.set_experts_implementation("eager")
        logger.info("experts: eager (auto: grouped_mm cannot multiply %s, whose rows are not a multiple of %d bytes)",
                    misaligned[0], GROUPED_MM_ALIGNMENT)
        return "eager"
    logger.info("experts: %s (--experts_implementation %s)", chosen, requested)
    return chosen
