"""Strings a reply must not hold, kept out while it is sampled (the server's tool_choice "none" keeps a
tool call's opening tag out this way). At every step the tokens that would complete a banned string are
banned, their logits set to -inf; the tokens before them stay free. So a string of several ordinary
tokens (`<tool_call>` is five of SmolLM2's: "<", "tool", "_", "call", ">") is banned as a sequence: a "<"
is still ordinary text, and only the token that would finish the string is refused. A string that is one
token (Qwen's `<tool_call>`) is simply that token, banned everywhere.

Matching is on text, not token ids: a token is banned when the reply's text so far followed by the
token's text would hold the string. Every spelling is caught (" <" + "tool..." as well as "<" + "tool...",
or one token holding all of it), which a ban of one tokenization (transformers' `bad_words_ids`, vLLM's
`bad_words`) would miss. The text is the reply's released text: a string whose own characters are split
over byte tokens is beyond it (tunesmith's are ASCII)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

_BY_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_texts(tokenizer: Any) -> list[str]:
    """Each token's text as it reads inside a reply, special tokens kept: decoded after an anchor token and
    the anchor's text cut off, so a SentencePiece "▁<" reads " <", not "<" as it would alone."""
    ids = range(len(tokenizer))
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:]
    lead = tokenizer.decode(anchor, skip_special_tokens=False)
    alone = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    after = tokenizer.batch_decode([anchor + [i] for i in ids], skip_special_tokens=False)
    return [a[len(lead):] if a.startswith(lead) else s for s, a in zip(alone, after)]


@dataclass(frozen=True)
class _Index:
    """For one banned string s: the tokens whose text holds all of s (`inside`), those whose text starts
    with s[j:] (`finishing[j]`: they complete a text that ends with s[:j]), and those whose text, leading
    whitespace aside, starts with s (`opening`)."""

    inside: frozenset[int]
    finishing: tuple[frozenset[int], ...]
    opening: frozenset[int]


class Bans:
    """The banned tokens of one tokenizer's vocabulary, indexed per banned string on first use. `of`
    keeps one per tokenizer, so the vocabulary is decoded once per process (about half a second for 49k
    tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: list[str] | None = None
        self._index: dict[str, _Index] = {}

    @classmethod
    def of(cls, tokenizer: Any) -> Bans:
        if tokenizer not in _BY_TOKENIZER:
            _BY_TOKENIZER[tokenizer] = cls(tokenizer)
        return _BY_TOKENIZER[tokenizer]

    def index(self, banned: str) -> _Index:
        if banned not in self._index:
            if self._texts is None:
                self._texts = token_texts(self.tokenizer)
            texts = list(enumerate(self._texts))
            self._index[banned] = _Index(
                frozenset(i for i, t in texts if banned in t),
                tuple(frozenset(i for i, t in texts if t.startswith(banned[j:])) if j else frozenset()
                      for j in range(len(banned))),
                frozenset(i for i, t in texts if t.lstrip().startswith(banned)))
        return self._index[banned]

    def tokens(self, text: str, anywhere: tuple[str, ...] = (), openings: tuple[str, ...] = ()) -> list[int]:
        """The tokens that may not follow a reply whose text so far is `text`: those that would complete
        one of `anywhere` in it, or would make it open (leading whitespace aside) with one of `openings`."""
        banned: set[int] = set()
        for s in anywhere:
            index = self.index(s)
            banned |= index.inside
            for j in range(1, len(s)):
                if text.endswith(s[:j]):
                    banned |= index.finishing[j]
        head = text.lstrip()
        for s in openings:
            if len(head) < len(s) and s.startswith(head):
                index = self.index(s)
                banned |= index.finishing[len(head)] if head else index.opening
        return sorted(banned)
