"""Mixture-of-experts models: the router's load-balancing loss their forward can add, their routers, and the
expert weights that transformers 5 stores fused as one 3-D parameter per projection ([experts, out, in], or
[experts, in, out] for gpt-oss) instead of one nn.Linear per expert.

A MoE causal LM of transformers 5 (Qwen2/3-MoE, Mixtral, gpt-oss, OLMoE, Granite-MoE, Jamba, DBRX, ...) computes
the Switch Transformer load-balancing loss from its router logits when called with `output_router_logits=True`,
returns it as `aux_loss`, and adds `self.router_aux_loss_coef * aux_loss` to `loss` (JetMoE names it
`aux_loss_coef`). Those with auxiliary-loss-free balancing (DeepSeek-V3, GLM-4-MoE: a routing bias) have the
config flag but no coefficient and no loss to add."""

from __future__ import annotations

import logging

from torch import nn

from ..utils.config_facts import text_config

logger = logging.getLogger(__name__)

# The attribute of the causal LM whose value multiplies the aux loss its forward adds to `loss`.
COEFFICIENT_ATTRIBUTES = ("router_aux_loss_coef", "aux_loss_coef")
# Config fields that count the routed experts, across families (DBRX's sits in its ffn_config).
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "moe_num_experts", "n_routed_experts")


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
