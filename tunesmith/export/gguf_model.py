"""Write a model as one GGUF file with the gguf package's writer (architectures, tensor names and metadata
keys from its constants: see gguf_arch), and read it back with transformers' GGUF loader to check what was
written. Norms and biases stay f32 in every --dtype (as llama.cpp's converter writes them); q8_0 applies
to matrices whose rows are whole blocks of 32, f16 to any other matrix. The k-quants are llama.cpp's own
quantizer's work on an f16 file (gguf_llama_cpp).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch

from ..errors import ExportError
from ..utils.config_facts import config_fact
from .gguf_arch import add_model_metadata, architecture, gguf_tensors
from .gguf_vocab import add_vocab, gguf_vocab

__all__ = ["ExportError", "write_gguf", "read_back", "compare_round_trip", "source_logits", "RoundTrip"]

_T = gguf.GGMLQuantizationType
# The types written in Python; the others (k-quants) come from llama.cpp's quantizer on an f16 file.
TENSOR_TYPES = {"f32": _T.F32, "f16": _T.F16, "bf16": _T.BF16, "q8_0": _T.Q8_0}
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def tensor_type(array: np.ndarray, dtype: str) -> gguf.GGMLQuantizationType:
    if array.ndim == 1 or dtype == "f32":
        return _T.F32
    if dtype == "bf16":
        return _T.BF16
    block = gguf.GGML_QUANT_SIZES[_T.Q8_0][0]
    if dtype == "q8_0" and array.shape[-1] % block == 0:
        return _T.Q8_0
    return _T.F16


@contextlib.contextmanager
def gguf_file(path: str, arch_name: str, kind: str, name: str) -> Iterator[gguf.GGUFWriter]:
    """A GGUFWriter for `path` with the keys every file starts with (its type: model, mmproj or adapter, and its
    name); the block adds metadata and tensors, and on leaving it the file is written. Closed either way."""
    writer = gguf.GGUFWriter(path, arch_name)
    try:
        writer.add_type(kind)
        writer.add_name(name)
        yield writer
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def add_tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def write_gguf(model: Any, tokenizer: Any, path: str, dtype: str, name: str,
               extra_metadata: dict[str, str] | None = None, state_dict: dict[str, torch.Tensor] | None = None,
               drop_sliding_window: bool = False) -> None:
    """Write `model` (one of gguf_arch.ARCHITECTURES; its weights, or `state_dict`) and `tokenizer` (with its
    chat template) to `path` as GGUF with weight matrices in `dtype` (f32, f16, bf16 or q8_0). A sliding window
    llama.cpp cannot apply for the architecture is refused unless `drop_sliding_window`."""
    spec = architecture(model, drop_sliding_window)
    vocab = gguf_vocab(tokenizer, config_fact(model.config, "vocab_size"))
    with gguf_file(path, spec.name, gguf.GGUFType.MODEL, name) as writer:
        writer.add_file_type(FILE_TYPES[dtype])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_model_metadata(writer, spec, model.config)
        add_vocab(writer, vocab)
        for key, value in (extra_metadata or {}).items():
            writer.add_string(key, value)
        for tensor_name, array in gguf_tensors(model, spec, state_dict):
            add_tensor(writer, tensor_name, array, tensor_type(array, dtype))


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
