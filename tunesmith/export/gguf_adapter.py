"""A LoRA adapter alone as GGUF, in the layout llama.cpp loads over a base GGUF (`llama-cli -m base.gguf
--lora adapter.gguf`; Ollama's ADAPTER), so one base file serves several adapters. As llama.cpp's own
convert_lora_to_gguf.py writes it: general.type "adapter", adapter.type "lora", adapter.lora.alpha, and for
each adapted matrix W (by its GGUF name) the tensors "W.lora_a" (r x in) and "W.lora_b" (out x r), with
the base architecture's own row changes applied to B (llama's Q/K order). llama.cpp scales by alpha / r,
so an rsLoRA adapter (alpha / sqrt(r)) is written with alpha * sqrt(r).
"""

from __future__ import annotations

import math
from typing import Any

import gguf
import torch

from ..errors import ConfigError, ExportError
from ..utils.config_facts import text_config
from .gguf_arch import architecture, llama_rope_order
from .gguf_model import add_tensor, gguf_file


def base_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    """The base model's own weights under their plain names (PEFT's LoRA layers left out)."""
    state = {}
    for name, tensor in peft_model.get_base_model().state_dict().items():
        if ".lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = tensor
    return state


def _check_config(config: Any) -> float:
    """The alpha to write, or a ConfigError naming what llama.cpp's adapter format does not carry."""
    unsupported = {"use_dora": bool(getattr(config, "use_dora", False)),
                   "rank_pattern": bool(getattr(config, "rank_pattern", None)),
                   "alpha_pattern": bool(getattr(config, "alpha_pattern", None)),
                   "modules_to_save": bool(getattr(config, "modules_to_save", None)),
                   "trainable_token_indices": bool(getattr(config, "trainable_token_indices", None))}
    for key, present in unsupported.items():
        if present:
            raise ConfigError(f"--adapter_only writes plain LoRA adapters; this one sets {key}, which llama.cpp's "
                              "adapter GGUF does not carry: export it merged (leave out --adapter_only)")
    alpha = float(config.lora_alpha)
    return alpha * math.sqrt(config.r) if getattr(config, "use_rslora", False) else alpha


def write_adapter_gguf(peft_model: Any, path: str, dtype: str, name: str, drop_sliding_window: bool = False) -> None:
    """Write the (single, default) LoRA adapter of `peft_model` to `path` with its matrices in f32 or f16 (a base
    whose sliding window llama.cpp cannot apply is refused unless `drop_sliding_window`, as its GGUF is)."""
    from peft import get_peft_model_state_dict

    base = peft_model.get_base_model()
    spec = architecture(base, drop_sliding_window)
    config = peft_model.peft_config[peft_model.active_adapter]
    alpha = _check_config(config)
    text = text_config(base.config)
    names = gguf.get_tensor_name_map(spec.arch, text.num_hidden_layers)
    heads = {"q_proj": text.num_attention_heads, "k_proj": text.num_key_value_heads}
    qtype = gguf.GGMLQuantizationType.F32 if dtype == "f32" else gguf.GGMLQuantizationType.F16
    with gguf_file(path, spec.name, gguf.GGUFType.ADAPTER, name) as writer:
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for key, tensor in get_peft_model_state_dict(peft_model).items():
            module, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
            if part not in ("A.weight", "B.weight"):
                raise ExportError(f"--adapter_only: {key} is not a LoRA A or B matrix, which llama.cpp's adapter "
                                  "GGUF does not carry; export it merged instead")
            target = names.get_name(module + ".weight", try_suffixes=(".weight",))
            if target is None or target.startswith(("token_embd", "output.")):
                raise ConfigError(f"--adapter_only: the adapter changes {module}, which llama.cpp's adapter GGUF "
                                  "cannot apply here (embeddings and the LM head); export it merged instead")
            array = tensor.detach().to(torch.float32).cpu().numpy()
            projection = module.rsplit(".", 1)[-1]
            if part == "B.weight" and spec.llama_rope and projection in heads:
                array = llama_rope_order(array, heads[projection])
            suffix = ".lora_a" if part == "A.weight" else ".lora_b"
            add_tensor(writer, target + suffix, array, qtype)
