"""Whether two local models share a vocabulary, read from their files (config.json's vocab_size, tokenizer.json's
tokens and ids) without loading either: what distillation needs, since it compares their distributions over the
vocabulary position by position."""

from __future__ import annotations

import json
import os

from .paths import model_config

TOKENIZER_FILE = "tokenizer.json"


def logits_width(folder: str) -> int | None:
    """config.json's vocab_size (a vision-language model's text model's): the width of the model's logits."""
    config = model_config(folder)
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")


def tokenizer_vocabulary(folder: str) -> dict[str, int] | None:
    """{token: id} of the folder's tokenizer.json, added tokens included; None without a readable one."""
    try:
        with open(os.path.join(folder, TOKENIZER_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel
        tokens = dict(vocab)
    elif isinstance(vocab, list):  # Unigram: [piece, score] in id order
        tokens = {piece: i for i, (piece, _) in enumerate(vocab)}
    else:
        tokens = {}
    tokens.update({added["content"]: added["id"] for added in data.get("added_tokens") or []})
    return tokens


def tokenizer_folder(model: str, adapter: str | None) -> str:
    """Where a model's tokenizer is: the adapter's folder when training saved one there, else the model's."""
    if adapter and os.path.isfile(os.path.join(adapter, TOKENIZER_FILE)):
        return adapter
    return model


def vocabulary_difference(first: tuple[str, str | None], second: tuple[str, str | None]) -> str | None:
    """How two models' vocabularies differ, each given as (model folder, adapter folder or None); None when they
    do not (or a folder's files cannot tell)."""
    widths = logits_width(first[0]), logits_width(second[0])
    if None not in widths and widths[0] != widths[1]:
        return f"vocab_size {widths[0]} and {widths[1]} in their config.json"
    vocabularies = tokenizer_vocabulary(tokenizer_folder(*first)), tokenizer_vocabulary(tokenizer_folder(*second))
    if None in vocabularies or vocabularies[0] == vocabularies[1]:
        return None
    differing = sorted({token for token, i in vocabularies[0].items() if vocabularies[1].get(token) != i}
                       | {token for token, i in vocabularies[1].items() if vocabularies[0].get(token) != i})
    return f"{len(differing)} tokens of their tokenizers differ in id or presence, e.g. {differing[0]!r}"
