"""Write a Llama-architecture model as one GGUF file (llama.cpp's "llama" architecture) with the gguf
package's writer, and read it back with transformers' GGUF loader to check what was written.

What llama.cpp expects of a Hugging Face Llama, and why:
- tensor names: gguf's own HF -> GGUF name map for the llama architecture (the map transformers'
  loader reverses), so token_embd, blk.N.attn_q/k/v/output, ffn_gate/up/down, attn_norm, ffn_norm,
  output_norm; `output` only when the LM head is not tied to the embedding.
- Q and K rows reordered per head: HF's rotary embedding rotates the two halves of each head, ggml's
  (the "normal" rope that llama.cpp uses for llama) rotates adjacent pairs. The loader undoes it.
- norms and biases stay f32 in every --dtype (as llama.cpp's converter writes them); q8_0 applies to
  matrices whose rows are whole blocks of 32, f16 to any other matrix.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch

from ..errors import ConfigError, UserError
from .gguf_vocab import add_vocab, gguf_vocab

logger = logging.getLogger(__name__)

ARCHITECTURE = "llama"
TENSOR_TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
                "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


class ExportError(UserError, RuntimeError):
    """A GGUF that cannot be written, or whose read-back does not match the source model."""

    kind = "export error"


def check_llama(model: Any) -> None:
    """Refuse, by name, a model or a Llama setting that the llama architecture of GGUF does not carry."""
    config, name = model.config, type(model).__name__
    if name != "LlamaForCausalLM":
        raise ConfigError(f"export_gguf supports llama-family models (LlamaForCausalLM); this model is {name}")
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    unsupported = {"rope_type": (rope_type, "default"), "hidden_act": (config.hidden_act, "silu")}
    for key, (value, supported) in unsupported.items():
        if value != supported:
            raise ConfigError(f"export_gguf writes Llama models with {key} {supported}; this one has {value}")


def _rope_theta(config: Any) -> float:
    return float((getattr(config, "rope_parameters", None) or {}).get("rope_theta")
                 or getattr(config, "rope_theta", 10000.0))


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def llama_rope_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """Q/K rows (or bias) from HF's rotate-half layout to ggml's adjacent-pair layout: in each head, rows
    i and i + head_dim/2 become rows 2i and 2i + 1."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _tensors(model: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in PyTorch's (out, in) layout) of every weight, in state-dict order."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp uses token_embd when there is no `output`
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(f"no GGUF tensor name for {hf_name} in the llama architecture")
        array = tensor.detach().to(torch.float32).cpu().numpy()
        projection = hf_name.rsplit(".", 2)[-2]
        if projection in heads:
            array = llama_rope_order(array, heads[projection])
        yield name, array


def tensor_type(array: np.ndarray, dtype: str) -> gguf.GGMLQuantizationType:
    if array.ndim == 1 or dtype == "f32":
        return gguf.GGMLQuantizationType.F32
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    if dtype == "q8_0" and array.shape[-1] % block == 0:
        return gguf.GGMLQuantizationType.Q8_0
    return gguf.GGMLQuantizationType.F16


def _add_model_metadata(writer: gguf.GGUFWriter, config: Any, dtype: str, name: str) -> None:
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[dtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_rope_dimension_count(_head_dim(config))
    if _head_dim(config) * config.num_attention_heads != config.hidden_size:
        writer.add_key_length(_head_dim(config))
        writer.add_value_length(_head_dim(config))
    writer.add_vocab_size(config.vocab_size)


def write_gguf(model: Any, tokenizer: Any, path: str, dtype: str, name: str,
               extra_metadata: dict[str, str] | None = None) -> None:
    """Write `model` (a LlamaForCausalLM) and `tokenizer` (with its chat template) to `path` as GGUF with
    weight matrices in `dtype` (f32, f16 or q8_0)."""
    check_llama(model)
    vocab = gguf_vocab(tokenizer, model.config.vocab_size)
    writer = gguf.GGUFWriter(path, ARCHITECTURE)
    try:
        _add_model_metadata(writer, model.config, dtype, name)
        add_vocab(writer, vocab)
        for key, value in (extra_metadata or {}).items():
            writer.add_string(key, value)
        for tensor_name, array in _tensors(model):
            qtype = tensor_type(array, dtype)
            writer.add_tensor(tensor_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


@dataclass
class RoundTrip:
    """What the GGUF gives back, compared with the source on the same conversations."""

    max_abs_diff: float  # largest |logit difference| over every position of every conversation
    logit_scale: float  # the source's largest |logit| there
    top1_agreement: float  # fraction of positions whose most likely next token is the same
    token_mismatch: str | None  # the first conversation the GGUF's tokenizer encodes differently
    template_equal: bool  # the GGUF's chat template is the source's, character for character

    @property
    def relative_diff(self) -> float:
        return self.max_abs_diff / max(self.logit_scale, 1e-12)


def read_back(path: str) -> tuple[Any, Any]:
    """(model in float32, tokenizer) from a GGUF file, through transformers' GGUF loader."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    return model.eval(), tokenizer


def _first_id_difference(source: Any, other: Any, texts: list[str]) -> str | None:
    for k, text in enumerate(texts):
        for special in (False, True):
            a = source(text, add_special_tokens=special)["input_ids"]
            b = other(text, add_special_tokens=special)["input_ids"]
            if a != b:
                at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                return (f"conversation {k + 1} (add_special_tokens={special}) from token {at}: "
                        f"{a[at:at + 3]} in the source, {b[at:at + 3]} in the GGUF")
    return None


def compare_round_trip(path: str, tokenizer: Any, texts: list[str], expected: list[torch.Tensor]) -> RoundTrip:
    """Read the GGUF back and compare it with the source: its tokenizer's ids for the rendered `texts`,
    its chat template, and its logits on the source's ids against `expected` (the source's logits)."""
    gguf_model, gguf_tokenizer = read_back(path)
    mismatch = _first_id_difference(tokenizer, gguf_tokenizer, texts)
    max_diff, scale, agree, total = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for text, want in zip(texts, expected):
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            got = gguf_model(input_ids=ids).logits.float()
            max_diff = max(max_diff, (got - want).abs().max().item())
            scale = max(scale, want.abs().max().item())
            agree += (got.argmax(-1) == want.argmax(-1)).sum().item()
            total += want.shape[1]
    return RoundTrip(max_diff, scale, agree / max(total, 1), mismatch,
                     gguf_tokenizer.chat_template == tokenizer.chat_template)


def source_logits(model: Any, tokenizer: Any, texts: list[str]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([tokenizer(t, add_special_tokens=False)["input_ids"]],
                                             device=model.device)).logits.float().cpu() for t in texts]
