"""Strings a reply must not hold, kept out while it is sampled (the server's tool_choice "none" keeps a
tool call's tag out this way). At every step the tokens that would complete a banned string are banned,
their logits set to -inf; the tokens before them stay free. So a string of several ordinary tokens
(`<tool_call` is four of SmolLM2's: "<", "tool", "_", "call") is banned as a sequence: a "<" is still
ordinary text, and only the token that would finish the string is refused. A string that is one token is
simply that token, banned everywhere; a token that holds the string inside a longer text is banned too.
Everything that starts with a banned string is out with it: ban `<tool_call` and `<tool_call>`,
`<tool_calls>` and `<tool_call*>` all are.

Matching is on text, not token ids: a token is banned when the reply's text so far followed by the
token's text would hold the string. Every spelling is caught (" <" + "tool..." as well as "<" + "tool...",
or one token holding all of it), which a ban of one tokenization (transformers' `bad_words_ids`, vLLM's
`bad_words`) would miss. An opening (a string the reply may not start with) is matched with whitespace
aside, anywhere in it: `{"name"` also keeps out ` { "name"` and `{\n  "name"`. The text is the reply's
released text: a string whose own characters are split over byte tokens is beyond it (tunesmith's are
ASCII)."""

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


def squeezed(text: str) -> str:
    """The text without its whitespace: how openings are matched."""
    return "".join(text.split())


@dataclass(frozen=True)
class _Index:
    """For one banned string s: the tokens whose text holds all of s (`inside`), and those whose text
    starts with s[j:] (`finishing[j]`: they complete a text that ends with s[:j]; `finishing[0]`: they
    start with s)."""

    inside: frozenset[int]
    finishing: tuple[frozenset[int], ...]


class Bans:
    """The banned tokens of one tokenizer's vocabulary, indexed per banned string on first use. `of`
    keeps one per tokenizer, so the vocabulary is decoded once per process (about half a second for 49k
    tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[bool, list[str]] = {}
        self._index: dict[tuple[str, bool], _Index] = {}

    @classmethod
    def of(cls, tokenizer: Any) -> Bans:
        if tokenizer not in _BY_TOKENIZER:
            _BY_TOKENIZER[tokenizer] = cls(tokenizer)
        return _BY_TOKENIZER[tokenizer]

    def texts(self, squeeze: bool = False) -> list[str]:
        """Each token's text in a reply (token_texts), or without its whitespace when `squeeze`."""
        if squeeze not in self._texts:
            self._texts[squeeze] = list(map(squeezed, self.texts())) if squeeze else token_texts(self.tokenizer)
        return self._texts[squeeze]

    def index(self, banned: str, squeeze: bool = False) -> _Index:
        """`banned`'s index over the token texts, or over the squeezed ones (for `banned` squeezed too)."""
        if (banned, squeeze) not in self._index:
            texts = list(enumerate(self.texts(squeeze)))
            self._index[banned, squeeze] = _Index(
                frozenset(i for i, t in texts if banned in t),
                tuple(frozenset(i for i, t in texts if t.startswith(banned[j:])) for j in range(len(banned))))
        return self._index[banned, squeeze]

    def tokens(self, text: str, anywhere: tuple[str, ...] = (), openings: tuple[str, ...] = ()) -> list[int]:
        """The tokens that may not follow a reply whose text so far is `text`: those that would complete
        one of `anywhere` in it, or would make it open with one of `openings` (whitespace aside)."""
        banned: set[int] = set()
        for s in anywhere:
            index = self.index(s)
            banned |= index.inside
            banned.update(*(index.finishing[j] for j in range(1, len(s)) if text.endswith(s[:j])))
        head = squeezed(text)
        for s in map(squeezed, openings):
            if len(head) < len(s) and s.startswith(head):
                banned |= self.index(s, squeeze=True).finishing[len(head)]
        return sorted(banned)
