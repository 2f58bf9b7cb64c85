"""What each exportable architecture is in llama.cpp: its gguf.MODEL_ARCH (whose tensor name map, from the
gguf package, names every tensor), how its weights differ from Hugging Face's, and the metadata its
loader reads beyond the common keys. The choices follow llama.cpp's own convert_hf_to_gguf.py:

- llama, mistral (written as llama, as llama.cpp's converter does): Q and K rows reordered per head, since
  HF's rotary embedding rotates the two halves of each head and ggml's "normal" rope rotates adjacent pairs.
- qwen2 (q/k/v biases), qwen3 (q/k norms): ggml's "neox" rope is HF's layout already; nothing reordered.
- gemma2, gemma3 (text): HF's RMSNorm multiplies by (1 + w), ggml's by w, so 1 is added to every norm;
  soft-capping and the sliding-window layers are written; llama.cpp scales queries by 1/sqrt(head_dim),
  so a query_pre_attn_scalar other than head_dim is refused.

Sliding windows: llama.cpp's gemma2 and gemma3 read `{arch}.attention.sliding_window` and the per-layer
pattern; its llama, qwen2 and qwen3 graphs read no window at all (src/models/*.cpp at the vendored commit),
so a Mistral or a Qwen2/Qwen3 with use_sliding_window whose window masks anything is refused by name
unless --drop_sliding_window accepts a file that attends to the whole context.

A vision-language model's language model is written through the same table (LANGUAGE_MODELS, by model_type, from
the llama.cpp architecture its registry entry names, families.py; the mmproj file beside it is gguf_vision's): Qwen2-VL's as llama.cpp's qwen2vl (qwen2 plus M-RoPE's
`rope.dimension_sections`, padded to four as the converter pads them), Gemma 3's as gemma3, Idefics3's as llama.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch

from ..errors import ConfigError, ExportError
from ..families import FAMILIES, types_where
from ..utils.config_facts import config_fact, text_config


@dataclass(frozen=True)
class Architecture:
    arch: gguf.MODEL_ARCH
    llama_rope: bool = False  # reorder Q/K rows for ggml's adjacent-pair rope
    norm_shift: float = 0.0  # added to every *norm.weight
    activation: str = "silu"  # the only hidden activation llama.cpp's graph for it computes
    metadata: Callable[[gguf.GGUFWriter, Any], None] | None = None
    # transformers' GGUF loader rebuilds this architecture with every setting the file carries, so its
    # read-back is a check; for Gemma 2/3 it drops query_pre_attn_scalar, the soft-caps, the sliding-layer
    # pattern and the local rope base (0.024 and 0.62 max |logit difference| on f32 files of tiny random
    # models that llama.cpp computes within 7e-4), so only llama.cpp checks those.
    transformers_reads_back: bool = True
    # llama.cpp's graph for it applies the window, per layer, from the file (see _sliding_layers)
    writes_sliding_window: bool = False

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]


def _rope_parameters(config: Any, layer_type: str | None = None) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type and layer_type in params:  # gemma3: one set per layer type
        return params[layer_type] or {}
    return params.get("full_attention", params) if "full_attention" in params else params


def rope_theta(config: Any, layer_type: str | None = None) -> float:
    return float(_rope_parameters(config, layer_type).get("rope_theta") or getattr(config, "rope_theta", 10000.0))


def head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _sliding_layers(writer: gguf.GGUFWriter, config: Any) -> None:
    """The window and which layers use it (per layer, from HF's layer_types), as llama.cpp's iSWA reads them."""
    layer_types = getattr(config, "layer_types", None)
    if getattr(config, "sliding_window", None) and layer_types:
        writer.add_sliding_window(config.sliding_window)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in layer_types])


def _gemma_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    if getattr(config, "attn_logit_softcapping", None):
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    if getattr(config, "final_logit_softcapping", None):
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    _sliding_layers(writer, config)
    local = _rope_parameters(config, "sliding_attention")
    if local.get("rope_theta"):
        writer.add_rope_freq_base_swa(float(local["rope_theta"]))


def _mrope_metadata(writer: gguf.GGUFWriter, config: Any) -> None:
    """M-RoPE's sections (how many rotary pairs follow time, height and width), padded to four as llama.cpp's
    qwen2vl loader reads them; llama.cpp gives text tokens one position in all sections, as transformers does."""
    sections = list(_rope_parameters(config)["mrope_section"])
    writer.add_rope_dimension_sections((sections + [0, 0, 0, 0])[:4])


_LLAMA = Architecture(gguf.MODEL_ARCH.LLAMA, llama_rope=True)
_GEMMA = {"norm_shift": 1.0, "activation": "gelu_pytorch_tanh", "metadata": _gemma_metadata,
          "transformers_reads_back": False, "writes_sliding_window": True}
ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": Architecture(gguf.MODEL_ARCH.QWEN2),
    "Qwen3ForCausalLM": Architecture(gguf.MODEL_ARCH.QWEN3),
    "Gemma2ForCausalLM": Architecture(gguf.MODEL_ARCH.GEMMA2, **_GEMMA),
    "Gemma3ForCausalLM": Architecture(gguf.MODEL_ARCH.GEMMA3, **_GEMMA),
}
# How a vision-language model's language model is written, by the llama.cpp architecture its registry entry names
# (families.Family.gguf_language), as llama.cpp's converter writes it; transformers' GGUF loader has no qwen2vl.
_LANGUAGE_WRITERS: dict[str, Architecture] = {a.name: a for a in (
    Architecture(gguf.MODEL_ARCH.QWEN2VL, metadata=_mrope_metadata, transformers_reads_back=False),
    ARCHITECTURES["Gemma3ForCausalLM"],
    _LLAMA,
)}
# The language model of each vision-language model whose GGUF files are written, by model_type.
LANGUAGE_MODELS: dict[str, Architecture] = {t: _LANGUAGE_WRITERS[FAMILIES[t].gguf_language]
                                            for t in types_where("gguf_language")}


def sliding_window(config: Any) -> tuple[int, list[bool]] | None:
    """(window, which layers apply it) as transformers' attention does, or None where no layer's window masks
    anything: no window, or one no shorter than max_position_embeddings (a query never sees a key that far
    back). Mistral applies its window on every layer; Qwen2/3 and Gemma name the sliding layers in layer_types
    (Qwen2/3 only with use_sliding_window, from max_window_layers on)."""
    config = text_config(config)
    window = getattr(config, "sliding_window", None)
    if not window or window >= config.max_position_embeddings:
        return None
    layer_types = getattr(config, "layer_types", None)
    layers = [t == "sliding_attention" for t in layer_types] if layer_types else [True] * config.num_hidden_layers
    return (window, layers) if any(layers) else None


def _window_refusal(name: str, spec: Architecture, config: Any, window: tuple[int, list[bool]]) -> str:
    size, layers = window
    return (f"export_gguf: {name} has sliding_window {size} on {sum(layers)} of {len(layers)} layers (config.json), "
            f"shorter than its max_position_embeddings {config.max_position_embeddings}, and llama.cpp's "
            f"{spec.name} architecture, which it is written as, has no sliding window: pass --drop_sliding_window "
            f"to write it without one (llama.cpp then attends to the whole context, as the model does only up to "
            f"{size} tokens)")


def architecture(model: Any, drop_sliding_window: bool = False) -> Architecture:
    """The model's Architecture, or a ConfigError naming the supported ones and any setting llama.cpp's graph
    for it does not compute (a sliding window it cannot apply, unless `drop_sliding_window`). A vision-language
    model's language model (gguf_vision.LanguageModel) carries its own Architecture and name."""
    config, name = text_config(model.config), getattr(model, "display_name", type(model).__name__)
    spec = getattr(model, "gguf_architecture", None) or ARCHITECTURES.get(name)
    if spec is None:
        raise ConfigError(f"export_gguf supports {', '.join(ARCHITECTURES)}; this model is {name}")
    rope_type = _rope_parameters(config).get("rope_type", "default")
    activation = getattr(config, "hidden_activation", None) or config.hidden_act
    unsupported = {"rope_type": (rope_type, "default"), "hidden_act": (activation, spec.activation)}
    if spec.arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3):
        unsupported["query_pre_attn_scalar"] = (config.query_pre_attn_scalar, head_dim(config))
    for key, (value, supported) in unsupported.items():
        if value != supported:
            raise ConfigError(f"export_gguf writes {name} models with {key} {supported}; this one has {value}")
    window = sliding_window(config)
    if window and not spec.writes_sliding_window and not drop_sliding_window:
        raise ConfigError(_window_refusal(name, spec, config, window))
    return spec


def add_model_metadata(writer: gguf.GGUFWriter, spec: Architecture, config: Any) -> None:
    """The hyperparameters llama.cpp's loader reads for this architecture (keys from gguf.Keys, through the
    writer's add_* methods)."""
    config = text_config(config)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_rope_dimension_count(head_dim(config))
    if getattr(config, "head_dim", None) or head_dim(config) * config.num_attention_heads != config.hidden_size:
        writer.add_key_length(head_dim(config))
        writer.add_value_length(head_dim(config))
    writer.add_vocab_size(config.vocab_size)
    if spec.metadata:
        spec.metadata(writer, config)


def llama_rope_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """Q/K rows (or bias) from HF's rotate-half layout to ggml's adjacent-pair layout: in each head, rows
    i and i + head_dim/2 become rows 2i and 2i + 1."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def gguf_tensors(model: Any, spec: Architecture, state_dict: dict[str, torch.Tensor] | None = None,
                 ) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in PyTorch's (out, in) layout) of every weight, in state-dict order."""
    config = text_config(model.config)
    names = gguf.get_tensor_name_map(spec.arch, config.num_hidden_layers)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for hf_name, tensor in (model.state_dict() if state_dict is None else state_dict).items():
        if hf_name == "lm_head.weight" and config_fact(model.config, "tie_word_embeddings", False):
            continue  # llama.cpp uses token_embd when there is no `output`
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(f"no GGUF tensor name for {hf_name} in the {spec.name} architecture")
        array = tensor.detach().to(torch.float32).cpu().numpy()
        if spec.norm_shift and hf_name.endswith("norm.weight"):
            array = array + np.float32(spec.norm_shift)
        projection = hf_name.rsplit(".", 2)[-2]
        if spec.llama_rope and projection in heads:
            array = llama_rope_order(array, heads[projection])
        yield name, array
