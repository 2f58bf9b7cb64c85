"""A tokenizer as GGUF metadata: llama.cpp's byte-level BPE vocabulary ("gpt2": tokens, token types,
merges), the special token ids, whether a BOS/EOS is added, the pre-tokenizer's name, and the chat
template training used.

Byte-level BPE tokenizers (SmolLM2's, GPT-2's, Qwen2/Qwen3's, Llama 3's) are written, only with a
pre-tokenizer that llama.cpp has a name for, and SentencePiece-style BPE with byte fallback as llama.cpp's
"llama" tokenizer; anything else is refused by name rather than written as a file whose tokenizer splits
text differently from training (the round-trip check compares ids, but only on the few texts it encodes)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import gguf

from ..errors import ConfigError, TemplateError

# HF pre-tokenizer (its tokenizer.json shape) -> llama.cpp's `tokenizer.ggml.pre` (the names its
# llama-vocab.cpp knows), and the same split as one regex for Ollama's own engine, which reads
# `tokenizer.ggml.pretokenizer` and otherwise falls back to Llama 3's split. gpt-2: GPT-2's split, what HF's
# ByteLevel(use_regex=true) does. smollm: each digit on its own first (Digits(individual_digits=true)), then
# GPT-2's split. qwen2 and llama-bpe: their tokenizer.json's Split regex, then ByteLevel without a regex.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
_BYTES_ONLY = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
_DIGITS = {"type": "Digits", "individual_digits": True}


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


PRE_TOKENIZERS = {
    "gpt-2": ([_BYTE_LEVEL], _GPT2_SPLIT),
    "smollm": ([_DIGITS, _BYTE_LEVEL], r"\p{N}|" + _GPT2_SPLIT.replace(r"| ?\p{N}+", "")),
    "qwen2": ([_split(_QWEN2_SPLIT), _BYTES_ONLY], _QWEN2_SPLIT),
    "llama-bpe": ([_split(_LLAMA3_SPLIT), _BYTES_ONLY], _LLAMA3_SPLIT),
}
# llama.cpp's converter names a pre-tokenizer by the sha256 of the ids its tokenizer gives CHECK_TEXT
# (convert_hf_to_gguf.py, get_vocab_base_pre); these are its entries for the families above. A known
# tokenizer gets the name llama.cpp's converter would write (SmolLM2's converted tokenizer, whose
# tokenizer.json says only ByteLevel, splits digits exactly as "smollm" does); any other falls back to
# the tokenizer.json's shape.
CHECK_TEXT = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ '
              '🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ '
              '------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, '
              '\'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL')
KNOWN_HASHES = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
}
OLLAMA_PRETOKENIZER_KEY = "tokenizer.ggml.pretokenizer"
# Normalizers llama.cpp does not apply and its converter writes no trace of, so written as it writes them:
# NFC, which every Qwen2/Qwen2.5/Qwen3 tokenizer applies first (transformers' Qwen2Tokenizer sets it). Text
# already in NFC, as keyboards, the web and nearly all data produce it, is unchanged by it; text that is
# not (a decomposed "é", e + U+0301) is split uncomposed by llama.cpp, in every Qwen GGUF alike.
IGNORED_NORMALIZERS = ({"type": "NFC"},)


SPM = "spm"  # pre_tokenizer_name's answer for a SentencePiece-style vocabulary (llama.cpp's "llama" model)
_SPACE = "\u2581"  # SentencePiece's word boundary, ▁


@dataclass
class GGUFVocab:
    pre: str  # llama.cpp's pre-tokenizer name, or SPM
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special_ids: dict[str, int]  # bos, eos, unk, pad: those the tokenizer has
    add_bos: bool
    add_eos: bool
    chat_template: str
    scores: list[float] | None = None  # SPM: llama.cpp merges the pair whose token scores highest first
    add_space_prefix: bool = False  # SPM: a ▁ before the text, as SentencePiece's "add dummy prefix"


def _describe(pre: dict | None) -> str:
    if not pre:
        return "none"
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or pre.get("normalizers") or []  # a pre-tokenizer's or a normalizer's
        return "Sequence[" + ", ".join(_describe(p) for p in steps) + "]"
    return pre.get("type", "?")


def _matches(step: dict, shape: dict) -> bool:
    return all(step.get(key) == value for key, value in shape.items())


def _spm_prefix(backend: dict) -> bool | None:
    """For a SentencePiece-style tokenizer.json (BPE with byte fallback, spaces as ▁ by its normalizer or a
    Metaspace pre-tokenizer that does not split), whether it puts a ▁ before the text; None for any other."""
    model, normalizer, pre = backend.get("model") or {}, backend.get("normalizer"), backend.get("pre_tokenizer")
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        return None
    steps = normalizer.get("normalizers", []) if normalizer and normalizer.get("type") == "Sequence" else (
        [normalizer] if normalizer else [])
    kinds = [step.get("type") for step in steps]
    replaces = any(step.get("type") == "Replace" and step.get("pattern", {}).get("String") == " "
                   and step.get("content") == _SPACE for step in steps)
    if replaces and set(kinds) <= {"Replace", "Prepend"} and pre is None:
        return "Prepend" in kinds
    if not steps and pre and pre.get("type") == "Metaspace" and not pre.get("split", True):
        return pre.get("prepend_scheme", "always") in ("always", "first")
    return None


def pre_tokenizer_name(backend: dict) -> str:
    """llama.cpp's name for the tokenizer.json's pre-tokenizer (SPM for a SentencePiece-style one), or a
    ConfigError that names it."""
    model, pre, normalizer = backend.get("model") or {}, backend.get("pre_tokenizer"), backend.get("normalizer")
    if _spm_prefix(backend) is not None:
        return SPM
    if normalizer in IGNORED_NORMALIZERS:
        normalizer = None
    if model.get("type") != "BPE" or model.get("byte_fallback") or normalizer:
        kind = f"{model.get('type')}{' with byte fallback' if model.get('byte_fallback') else ''}"
        normalizer = f" and a {_describe(normalizer)} normalizer" if normalizer else ""
        raise ConfigError(f"export_gguf writes byte-level BPE tokenizers (SmolLM2's family) and SentencePiece-style "
                          f"ones (BPE with byte fallback, spaces as \u2581); this one is {kind}{normalizer}, which it "
                          "does not translate")
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    for name, (shape, _) in PRE_TOKENIZERS.items():
        if len(steps) == len(shape) and all(_matches(s, want) for s, want in zip(steps, shape)):
            return name
    raise ConfigError(f"export_gguf knows the pre-tokenizers {', '.join(PRE_TOKENIZERS)} (llama.cpp's names); "
                      f"this tokenizer's is {_describe(pre)}, which llama.cpp would split differently")


def gguf_vocab(tokenizer: Any, vocab_size: int) -> GGUFVocab:
    """The GGUF tokenizer metadata of a transformers fast tokenizer, padded to the model's vocab_size
    (the embedding's rows) with unused tokens, as llama.cpp requires one token per row."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    pre = pre_tokenizer_name(backend)  # refuses what llama.cpp cannot split, whatever the hash says
    if pre != SPM:
        digest = hashlib.sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
        pre = KNOWN_HASHES.get(digest, pre)
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
            if pre == SPM and re.fullmatch(r"<0x[0-9A-F]{2}>", by_id[i]) and by_id[i] in backend["model"]["vocab"]:
                types[-1] = gguf.TokenType.BYTE  # byte fallback's token: llama.cpp decodes it to its byte
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"].get("merges", [])]
    scores = None
    if pre == SPM:
        # The token each merge makes scores minus its rank, so that llama.cpp's SentencePiece tokenizer,
        # which joins the adjacent pair whose joined token scores highest, merges in BPE's order.
        ranks = {}
        for rank, merge in enumerate(merges):
            ranks.setdefault(merge.replace(" ", "", 1), rank)
        scores = [-float(ranks.get(token, len(merges))) for token in tokens]
        if tokenizer.unk_token_id is not None:
            types[tokenizer.unk_token_id] = gguf.TokenType.UNKNOWN
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
                     add_eos="eos" in special_ids and plain[-1:] == [special_ids["eos"]], chat_template=template,
                     scores=scores, add_space_prefix=bool(_spm_prefix(backend)))


def add_vocab(writer: gguf.GGUFWriter, vocab: GGUFVocab) -> None:
    if vocab.pre == SPM:
        writer.add_tokenizer_model("llama")  # llama.cpp's SentencePiece tokenizer: tokens, scores, types
        writer.add_tokenizer_pre("default")
        writer.add_token_list(vocab.tokens)
        writer.add_token_scores(vocab.scores)
        writer.add_token_types(vocab.token_types)
        writer.add_add_space_prefix(vocab.add_space_prefix)
    else:
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
