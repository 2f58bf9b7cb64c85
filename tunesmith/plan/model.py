"""The model an SFT run trains, built from its folder's config.json alone: the architecture on the meta device,
quantized and given its adapter by the same code as models/loader.load_model (transformers' bitsandbytes quantizer,
models/loader.attach_adapter: prepare_model_for_kbit_training, get_peft_model, the casts), then every weight made a
fake tensor of its real shape and dtype (a 4-bit weight packed by bitsandbytes' own quantize op)."""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from torch import nn

from ..errors import ConfigError, PathError
from ..families import is_vision_language
from ..models.loader import (
    attach_adapter,
    quantization_config,
    resolve_attn_implementation,
    resolve_dtype,
    resolve_model_path,
)
from ..models.moe import experts_load_kwargs, settle_experts_implementation
from ..utils.config_facts import text_config


@dataclass
class GpuRun:
    """The settings of the run as they resolve on a GPU (`tunesmith sft` resolves --bf16 and
    --gradient_checkpointing left out from the hardware it runs on; the plan is for a GPU)."""

    bf16: bool
    checkpointing: bool
    offload: bool
    by_budget: bool = False  # --gradient_checkpointing auto: the forward budget chooses each layer's mode
    ranks: int = 1  # --sequence_parallel_size: the row's tokens are cut over this many ranks
    zero3_world: int = 0  # ZeRO-3: the ranks its states are sharded over (0: not ZeRO-3)

    def training_view(self) -> Any:
        """What the loader reads of the training arguments, as a GPU run has them."""
        return types.SimpleNamespace(gradient_checkpointing=self.checkpointing, bf16=self.bf16, fp16=False,
                                     deepspeed=None, use_cpu=False)


@contextlib.contextmanager
def as_on_a_gpu() -> Iterator[None]:
    """For the decisions the loader and the flag parser take from the hardware: a CUDA GPU with bf16 is there.
    Nothing is run on it inside."""
    with mock.patch.object(torch.cuda, "is_available", lambda: True), \
            mock.patch.object(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True):
        yield


def read_config(model_args: Any) -> Any:
    from transformers import AutoConfig

    path = resolve_model_path(model_args)  # none given: the embedded default model, as every command takes it
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise PathError(f"--model_name_or_path {path}: no config.json in it; give a model folder (the plan reads "
                        "its config.json alone, no weights)")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    except (OSError, ValueError) as e:
        raise PathError(f"--model_name_or_path {path}: its config.json cannot be read ({str(e).splitlines()[0]})") \
            from e


def build_on_meta(config: Any, model_args: Any, finetuning_args: Any, gpu: GpuRun) -> nn.Module:
    """The trained model with no storage: every step of load_model that shapes memory, on the meta device."""
    from transformers import AutoModelForCausalLM
    from transformers.quantizers.auto import AutoHfQuantizer

    if is_vision_language(config) or text_config(config) is not config:
        raise ConfigError(f"tunesmith plan: {config.model_type} is a vision-language model; the plan covers causal "
                          "language models so far")
    view = gpu.training_view()
    with as_on_a_gpu():
        dtype = resolve_dtype(model_args, view, trains_base=finetuning_args.finetuning_type == "full")
        config._attn_implementation = resolve_attn_implementation(model_args)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=model_args.trust_remote_code,
                                                 **experts_load_kwargs(model_args.experts_implementation, config))
    # grouped_mm and batched_mm (whose per-token copies of the experts' weights are activations) run on fake
    # tensors; eager's loop asks which experts real tokens picked (nonzero), which a fake tensor cannot say.
    if settle_experts_implementation(model, model_args.experts_implementation) == "eager":
        raise ConfigError(f"tunesmith plan: {config.model_type}'s eager experts loop depends on which experts real "
                          "tokens pick, which the plan's fake tensors do not have; plan --experts_implementation "
                          "grouped_mm or batched_mm")
    quant = quantization_config(model_args, dtype)
    if quant is not None:
        quantizer = AutoHfQuantizer.from_config(quant, pre_quantized=False)
        quantizer.preprocess_model(model, device_map={"": 0})
        quantizer.postprocess_model(model)
        model.hf_quantizer = quantizer
    if finetuning_args.adapter:
        with as_on_a_gpu():  # the GPU's casts and dropout, not the CPU's (loader.attach_adapter)
            model = attach_adapter(model, model_args, finetuning_args, view)
    return model


def materialize(model: nn.Module) -> None:
    """Every meta parameter and buffer as a fake tensor of its shape and dtype (run under FakeTensorMode); a 4-bit
    weight packed by bitsandbytes' quantize op, with its quantization state (absmax, nested constants, code map)."""
    import bitsandbytes as bnb
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if "dynamic" not in bnb.functional.name2qmap:  # the nested quantization's code map, made from real values
        with unset_fake_temporarily():
            bnb.functional.name2qmap["dynamic"] = bnb.functional.create_dynamic_map()
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if isinstance(param, bnb.nn.Params4bit):
                module._parameters[name] = fake_4bit(param)
            elif isinstance(param, bnb.nn.Int8Params):
                module._parameters[name] = fake_8bit(param)
            else:
                module._parameters[name] = nn.Parameter(torch.empty(param.shape, dtype=param.dtype),
                                                        requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype)


def fake_4bit(param: Any) -> nn.Parameter:
    """A Params4bit's weight as bitsandbytes stores it after quantizing, as a plain parameter carrying the
    attributes its Linear4bit and PEFT read (a FakeTensor cannot be made a Params4bit)."""
    from bitsandbytes.functional import quantize_4bit

    weight = torch.empty(param.shape, dtype=torch.bfloat16)
    packed, state = quantize_4bit(weight, blocksize=param.blocksize, compress_statistics=param.compress_statistics,
                                  quant_type=param.quant_type, quant_storage=param.quant_storage)
    fake = nn.Parameter(packed, requires_grad=False)
    fake.quant_state = state
    for attribute in ("blocksize", "compress_statistics", "quant_type", "quant_storage", "bnb_quantized"):
        setattr(fake, attribute, getattr(param, attribute, True))
    return fake


def fake_8bit(param: Any) -> nn.Parameter:
    """An Int8Params' weight as bitsandbytes stores it after quantizing: int8 rows (CB) and a float32 scale a row (SCB)."""
    from bitsandbytes.functional import int8_vectorwise_quant

    rows, scales, _ = int8_vectorwise_quant(torch.empty(param.shape, dtype=torch.float16))
    fake = nn.Parameter(rows, requires_grad=False)
    fake.CB, fake.SCB, fake.has_fp16_weights = rows, scales, False
    return fake


def four_bit_constants(model: nn.Module) -> list[torch.Tensor]:
    """Every 4-bit weight's quantization constants (absmax, code map, the nested ones, the offset)."""
    found = []
    for param in model.parameters():
        state = getattr(param, "quant_state", None)
        while state is not None:
            found += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if torch.is_tensor(t)]
            state = getattr(state, "state2", None)
    return found


def row_scales(model: nn.Module) -> list[torch.Tensor]:
    """Every 8-bit weight's row scales (bitsandbytes' SCB), on the weight or, after the first forward, its layer's
    state."""
    found = []
    for module in model.modules():
        held = [getattr(getattr(module, "state", None), "SCB", None)]
        held += [getattr(p, "SCB", None) for p in module.parameters(recurse=False)]
        found += [t for t in held if torch.is_tensor(t)]
    return found


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors of every quantization state, resident beside the weights."""
    return four_bit_constants(model) + row_scales(model)
