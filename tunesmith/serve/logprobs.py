"""Log-probabilities as OpenAI answers them: {"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}, ...]}, ...], "refusal": null}, from the engine's TokenLogprob records.

A token's `token` is its own decoded text; its `bytes` are the bytes it stands for. For a byte-level
BPE tokenizer (GPT-2's, SmolLM2's, Llama 3's, Qwen's) a token can hold part of a character, whose
decoded text is only U+FFFD: its bytes come from the byte-level alphabet itself, so the bytes of a
reply's tokens, joined, are the reply's UTF-8. Other tokenizers give the UTF-8 of the decoded text."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..generation import TokenLogprob


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: each printable stand-in character to the byte it encodes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"


class TokenTexts:
    """Each token id's (text, bytes), decoded once per request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_level = _byte_level(tokenizer)
        self.added = set(getattr(tokenizer, "added_tokens_decoder", {}))  # stored as text, not byte-level
        self._seen: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._seen:
            text = self.tokenizer.decode([token_id])
            data = text.encode("utf-8")
            if self.byte_level and token_id not in self.added:
                piece, decoder = self.tokenizer.convert_ids_to_tokens(token_id), _byte_decoder()
                if isinstance(piece, str) and all(c in decoder for c in piece):
                    data = bytes(decoder[c] for c in piece)
            self._seen[token_id] = (text, list(data))
        return self._seen[token_id]

    def entry(self, token_id: int, logprob: float) -> dict:
        text, data = self(token_id)
        return {"token": text, "logprob": logprob, "bytes": data}


def content(records: list[TokenLogprob], texts: TokenTexts) -> list[dict]:
    """OpenAI's `logprobs.content` for these tokens; top_logprobs most likely first, as many as asked."""
    return [{**texts.entry(r.token_id, r.logprob), "top_logprobs": [texts.entry(i, v) for i, v in r.top]}
            for r in records]


def choice_logprobs(records: list[TokenLogprob], texts: TokenTexts) -> dict:
    return {"content": content(records, texts), "refusal": None}
