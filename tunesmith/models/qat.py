"""Quantization-aware training through torchao (`--qat`): the model trains with its linear layers' weights (and, for
int8_int4, their inputs) fake-quantized, rounded to the grid they will be served on and back to float in the forward,
with a straight-through gradient, so the weights learn to sit where quantization costs little; at the end torchao's
convert step makes the real quantized model, whose forward equals the fake-quantized one.

The schemes are torchao's post-training configs on CPU-servable tensors (IntxUnpackedToInt8Tensor: plain PyTorch ops),
and the fake quantizers are the ones torchao derives from them (`QATConfig(base_config, step="prepare")`), so training
and the converted model round the same way:

- int8_int4: `Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(g))`, int8
  activations quantized per token as they come (asymmetric) and int4 weights in groups of g inputs (symmetric): the
  scheme of torchao's Int8DynActInt4WeightQATQuantizer, which ExecuTorch's XNNPACK backend serves.
- int4: `IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup(g))`, int4 weights in groups, activations float.

What is quantized: every nn.Linear of the decoder, not the output head or the embeddings (which the head shares in
tied models such as SmolLM2), as torchao's and llama.cpp's int4 recipes leave them at higher precision.

With LoRA the trained forward of an adapted linear is `fq(W + s·B·A)` applied to `fq_act(x)`: the merged weight is
what gets quantized for serving, so that is what is fake-quantized, and the adapter learns whatever moves the
*quantized merged* weight towards a lower loss. Fake-quantizing only the frozen base and adding a float adapter
(QLoRA's shape) would train a model nobody serves: merging then re-rounds W + s·B·A to a different grid point. The
export of a LoRA QAT run is the adapter (as every LoRA run's) plus the merged, converted model in `quantized/`, whose
forward equals the trained one. The cost: each adapted linear forms W + s·B·A in every forward, a full-size weight
and its gradient, as full fine-tuning does.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
from peft.tuners.lora import Linear as LoraLinear
from torch import nn

from ..errors import ConfigError

logger = logging.getLogger(__name__)

QAT_SCHEMES = ("int8_int4", "int4")
QUANTIZED_DIR = "quantized"  # beside the run's float model in output_dir


def _torchao() -> Any:
    try:
        import torchao.quantization as quantization
    except ImportError:
        raise ConfigError("--qat needs torchao: pip install 'tunesmith[qat]' (torchao 0.18)") from None
    return quantization


def base_config(scheme: str, group_size: int) -> Any:
    """torchao's post-training config of a --qat scheme: what convert applies, and what prepare derives its fake
    quantizers from."""
    ao = _torchao()
    if scheme == "int8_int4":
        return ao.Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                        weight_granularity=ao.PerGroup(group_size))
    if scheme == "int4":
        return ao.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=ao.PerGroup(group_size))
    raise ConfigError(f"--qat {scheme}: not a scheme; choose one of {', '.join(QAT_SCHEMES)}")


_LEFT_FLOAT = {"lm_head", "score", "modules_to_save", "original_module"}


def _quantized_linear(module: nn.Module, name: str) -> bool:
    """torchao's filter: a decoder linear; not the output head (which shares the embeddings in tied models), not
    LoRA's own A and B (their product is quantized within the merged weight), not a PEFT modules_to_save copy."""
    parts = name.split(".")
    return (isinstance(module, nn.Linear) and not _LEFT_FLOAT.intersection(parts)
            and not any(part.startswith("lora_") for part in parts))


def _check_group_size(model: nn.Module, group_size: int) -> None:
    for name, module in model.named_modules():
        if _quantized_linear(module, name) and module.in_features % group_size:
            raise ConfigError(f"--qat_group_size {group_size} does not divide the {module.in_features} inputs of "
                              f"{name}: give a divisor of it (32 fits most models)")


def prepare_qat(model: nn.Module, scheme: str | None, group_size: int) -> nn.Module:
    """The model made to train fake-quantized (in place; returned for chaining). A PeftModel gets the LoRA forward
    above on each adapted linear and torchao's FakeQuantizedLinear on the others; a plain model gets
    FakeQuantizedLinear everywhere a linear is quantized. Records the scheme on the model for the save."""
    if not scheme:
        return model
    ao = _torchao()
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from torchao.quantization.qat import QATConfig
    from torchao.quantization.qat.fake_quantize_config import _infer_fake_quantize_configs
    from torchao.quantization.qat.fake_quantizer import FakeQuantizerBase

    config = base_config(scheme, group_size)
    _check_group_size(model, group_size)
    adapted: set[str] = set()
    if isinstance(model, PeftModel):
        act_config, weight_config = _infer_fake_quantize_configs(config)
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer) and not isinstance(module, LoraLinear):
                raise ConfigError(f"--qat with LoRA fake-quantizes adapted linears only, and {name} is a "
                                  f"{type(module).__name__}: drop it from --lora_target or drop --qat")
            if isinstance(module, LoraLinear):
                module.qat_weight_fake_quantizer = FakeQuantizerBase.from_config(weight_config)
                module.qat_activation_fake_quantizer = (
                    FakeQuantizerBase.from_config(act_config) if act_config is not None else None)
                module.__class__ = FakeQuantizedLoraLinear
                adapted.add(f"{name}.base_layer")
    ao.quantize_(model, QATConfig(config, step="prepare"),
                 filter_fn=lambda m, fqn: _quantized_linear(m, fqn) and fqn not in adapted)
    model.tunesmith_qat = (scheme, group_size)
    logger.info("--qat %s: %d linear layers fake-quantized (group size %d)", scheme,
                sum(1 for n, m in model.named_modules() if _quantized_linear(m, n)), group_size)
    return model


class FakeQuantizedLoraLinear(LoraLinear):
    """PEFT's LoRA linear whose forward is fq_act(x) @ fq(W + s·B·A)ᵀ + bias (prepare_qat swaps the class of each
    adapted linear; weights, state dict and merge are PEFT's). With the adapter off (a DPO reference), several
    adapters or a mixed batch, it is PEFT's own forward, unquantized."""

    qat_weight_fake_quantizer: nn.Module
    qat_activation_fake_quantizer: nn.Module | None

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        active = [name for name in self.active_adapters if name in self.lora_A]
        if self.disable_adapters or self.merged or len(active) != 1 or kwargs.get("adapter_names") is not None:
            return super().forward(x, *args, **kwargs)
        base = self.base_layer
        weight = base.weight + self.get_delta_weight(active[0]).to(base.weight.dtype)
        if self.qat_activation_fake_quantizer is not None:
            x = self.qat_activation_fake_quantizer(x)
        return nn.functional.linear(x, self.qat_weight_fake_quantizer(weight), base.bias)


def qat_scheme(model: nn.Module) -> tuple[str, int] | None:
    """(scheme, group size) of a model prepare_qat made, or None."""
    return getattr(model, "tunesmith_qat", None)


def converted_copy(model: nn.Module) -> nn.Module:
    """The real quantized model of a QAT-trained one (torchao's convert), the trained model left as it is."""
    return quantized_copy(model, *qat_scheme(model))


def quantized_copy(model: nn.Module, scheme: str, group_size: int) -> nn.Module:
    """A copy of the model quantized by a --qat scheme: LoRA merged into it, fake quantizers removed (torchao's
    convert) and the scheme's post-training quantization applied to the same linears; for a model trained without
    --qat, plain post-training quantization. It carries transformers' TorchAoConfig, so save_pretrained writes it and
    from_pretrained reads it back."""
    from peft import PeftModel
    from transformers import TorchAoConfig
    from transformers.quantizers.auto import AutoHfQuantizer

    ao = _torchao()
    from torchao.quantization.qat import QATConfig

    config = base_config(scheme, group_size)
    plain = copy.deepcopy(model)
    if isinstance(plain, PeftModel):
        plain = plain.merge_and_unload()  # W + s·B·A, the weight the adapted linears fake-quantized
    with torch.no_grad():
        ao.quantize_(plain, QATConfig(config, step="convert"), filter_fn=_quantized_linear)  # FakeQuantizedLinear
        ao.quantize_(plain, config,  # the merged linears, and every linear of a model trained without --qat
                     filter_fn=lambda m, fqn: _quantized_linear(m, fqn) and type(m.weight.data) is torch.Tensor)
    plain.__dict__.pop("tunesmith_qat", None)
    plain.config.quantization_config = TorchAoConfig(config, modules_to_not_convert=["lm_head"])
    plain.hf_quantizer = AutoHfQuantizer.from_config(plain.config.quantization_config, pre_quantized=True)
    return plain.eval()


def save_quantized(model: nn.Module, output_dir: str | Path, processing_class: Any = None) -> Path:
    """The converted model (and the tokenizer) in output_dir/quantized/, loadable by from_pretrained."""
    folder = Path(output_dir) / QUANTIZED_DIR
    converted = converted_copy(model)
    converted.save_pretrained(folder)
    if processing_class is not None:
        processing_class.save_pretrained(folder)
    return folder
