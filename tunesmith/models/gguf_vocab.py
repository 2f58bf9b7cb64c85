"""A tokenizer as GGUF metadata: llama.cpp's byte-level BPE vocabulary ("gpt2": tokens, token types,
merges), the special token ids, whether a BOS/EOS is added, the pre-tokenizer's name, and the chat
template training used.

Only the byte-level BPE tokenizers of the SmolLM2/GPT-2 family are written, and only with a
pre-tokenizer that llama.cpp has a name for; anything else is refused by name rather than written
as a file whose tokenizer splits text differently from training (the round-trip check compares ids,
but only on the few conversations it encodes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gguf

from ..errors import ConfigError, TemplateError

# HF pre-tokenizer (its tokenizer.json shape) -> llama.cpp's `tokenizer.ggml.pre`, and the same split as
# one regex for Ollama's own engine, which reads `tokenizer.ggml.pretokenizer` and otherwise falls back
# to Llama 3's split. gpt2: GPT-2's split, what HF's ByteLevel(use_regex=true) does. smollm: each digit
# on its own first (Digits(individual_digits=true)), then GPT-2's split.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
_DIGITS = {"type": "Digits", "individual_digits": True}
PRE_TOKENIZERS = {
    "gpt2": ([_BYTE_LEVEL], _GPT2_SPLIT),
    "smollm": ([_DIGITS, _BYTE_LEVEL], r"\p{N}|" + _GPT2_SPLIT.replace(r"| ?\p{N}+", "")),
}
OLLAMA_PRETOKENIZER_KEY = "tokenizer.ggml.pretokenizer"


@dataclass
class GGUFVocab:
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special_ids: dict[str, int]  # bos, eos, unk, pad: those the tokenizer has
    add_bos: bool
    add_eos: bool
    chat_template: str


def _describe(pre: dict | None) -> str:
    if not pre:
        return "none"
    if pre.get("type") == "Sequence":
        return "Sequence[" + ", ".join(_describe(p) for p in pre.get("pretokenizers", [])) + "]"
    return pre.get("type", "?")


def _matches(step: dict, shape: dict) -> bool:
    return all(step.get(key) == value for key, value in shape.items())


def pre_tokenizer_name(backend: dict) -> str:
    """llama.cpp's name for the tokenizer.json's pre-tokenizer, or a ConfigError that names it."""
    model, pre = backend.get("model") or {}, backend.get("pre_tokenizer")
    if model.get("type") != "BPE" or model.get("byte_fallback") or backend.get("normalizer"):
        kind = f"{model.get('type')}{' with byte fallback' if model.get('byte_fallback') else ''}"
        normalizer = f" and a {backend['normalizer'].get('type')} normalizer" if backend.get("normalizer") else ""
        raise ConfigError(f"export_gguf writes byte-level BPE tokenizers (SmolLM2's family); this one is {kind}"
                          f"{normalizer} (a SentencePiece-style vocabulary), which it does not translate")
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    for name, (shape, _) in PRE_TOKENIZERS.items():
        if len(steps) == len(shape) and all(_matches(s, want) for s, want in zip(steps, shape)):
            return name
    raise ConfigError(f"export_gguf knows the pre-tokenizers {' and '.join(PRE_TOKENIZERS)} (llama.cpp's names); "
                      f"this tokenizer's is {_describe(pre)}, which llama.cpp would split differently")


def gguf_vocab(tokenizer: Any, vocab_size: int) -> GGUFVocab:
    """The GGUF tokenizer metadata of a transformers fast tokenizer, padded to the model's vocab_size
    (the embedding's rows) with unused tokens, as llama.cpp requires one token per row."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    pre = pre_tokenizer_name(backend)
    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    if max(by_id) >= vocab_size:
        raise ConfigError(f"the tokenizer has ids up to {max(by_id)} but the model only {vocab_size} embedding rows")
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL if i not in added else
                         gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"].get("merges", [])]
    special_ids = {name: getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "unk", "pad")}
    special_ids = {name: i for name, i in special_ids.items() if i is not None}
    # llama.cpp adds BOS/EOS when the file says so (Ollama assumes BOS when it does not say): write what
    # the tokenizer does to a plain text.
    plain = tokenizer("a")["input_ids"]
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise TemplateError("the tokenizer has no chat template (or several) to embed: pass --chat_template")
    return GGUFVocab(pre, tokens, [int(t) for t in types], merges, special_ids,
                     add_bos="bos" in special_ids and plain[:1] == [special_ids["bos"]],
                     add_eos="eos" in special_ids and plain[-1:] == [special_ids["eos"]], chat_template=template)


def add_vocab(writer: gguf.GGUFWriter, vocab: GGUFVocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_string(OLLAMA_PRETOKENIZER_KEY, PRE_TOKENIZERS[vocab.pre][1])
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id, "unk": writer.add_unk_token_id,
              "pad": writer.add_pad_token_id}
    for name, token_id in vocab.special_ids.items():
        adders[name](token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    writer.add_chat_template(vocab.chat_template)
