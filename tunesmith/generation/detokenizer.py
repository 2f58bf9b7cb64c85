"""Turning generated tokens into streamed text: an incremental detokenizer that never splits a
character (CJK, emoji: a character over several byte tokens is released once its last byte comes), and
stop strings matched across token boundaries (a tail that may yet grow into a stop string is held back)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class IncrementalDecoder:
    """The text of a growing list of token ids, in pieces. A piece is released once its tokens decode
    to whole characters: a character split over several byte tokens decodes to U+FFFD until its last
    byte comes. Each step decodes a short window (from the last released boundary), not the whole reply.
    Special tokens are left out of a reply's text; `skip_special_tokens=False` keeps them (an echoed prompt)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: the boundary released before the last one
        self._read = 0  # ids up to here are released

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

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
