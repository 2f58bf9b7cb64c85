"""Per-reply pieces of batched generation: choosing the next token (greedy, or sampled with the
request's temperature/top_p and the server's top_k/repetition penalty, as transformers' warpers do),
and turning tokens into streamed text that never splits a character or shows part of a stop string."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """How one request's replies are generated. temperature 0: greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None


def next_token(logits: torch.Tensor, sampling: Sampling, seen: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> int:
    """The next token for one row's float32 logits; `seen` (prompt and reply ids so far) feeds the
    repetition penalty."""
    if sampling.repetition_penalty != 1.0 and seen is not None:
        scores = logits.gather(0, seen)
        scores = torch.where(scores < 0, scores * sampling.repetition_penalty, scores / sampling.repetition_penalty)
        logits = logits.scatter(0, seen, scores)
    if sampling.temperature == 0:
        return int(logits.argmax())
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(logits)
        remove = ordered.softmax(-1).cumsum(-1) <= 1 - sampling.top_p
        remove[-1] = False  # the most likely token always stays
        logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))


class IncrementalDecoder:
    """The text of a growing list of token ids, in pieces. A piece is released once its tokens decode
    to whole characters: a character split over several byte tokens decodes to U+FFFD until its last
    byte comes. Each step decodes a short window (from the last released boundary), not the whole reply."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # window start: the boundary released before the last one
        self._read = 0  # ids up to here are released

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return now[len(before):]

    def flush(self) -> str:
        """Whatever is still held back, at the end of the reply."""
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return now[len(before):]


@dataclass
class StopMatcher:
    """The reply's text so far, cut at the first stop string; `release()` hands out what can be shown
    now, holding back a tail that may yet grow into a stop string."""

    stops: tuple[str, ...]
    text: str = ""
    sent: int = 0
    stopped: bool = field(default=False)

    def feed(self, piece: str) -> None:
        if self.stopped or not piece:
            return
        start = max(0, len(self.text) - max(map(len, self.stops), default=0) + 1)
        self.text += piece
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if found:
            self.text, self.stopped = self.text[:min(found)], True

    def release(self, final: bool = False) -> str:
        end = len(self.text)
        if not (final or self.stopped):
            end -= max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        piece, self.sent = self.text[self.sent:end], max(self.sent, end)
        return piece
