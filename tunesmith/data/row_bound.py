"""What a row may cost: the tokens a run can train of it, not the row's size.

A run trains at most --max_seq_length tokens of an example, yet today's encoding renders and tokenizes a row whole
(a 60 MB user turn: tens of millions of tokens, each with its offsets, in memory at once). Before a row is rendered,
every text of it too long to matter is shortened to a character budget, which the tokenizer's own vocabulary bounds:

    a token covers at most L characters, L = the longest string in the vocabulary (a byte-level BPE's strings hold
    one character per byte, so L bounds bytes too, and a character is at least one byte; SmolLM2: L = 81),

so (max_tokens + MARGIN_TOKENS) x L characters of a text hold at least max_tokens + MARGIN_TOKENS tokens wherever
it is cut. Of a text longer than that budget, only the budget's characters at the end that can train are tokenized:
its head for a conversation (training keeps an example's first tokens, --truncation), its tail for a preference
pair's context (a pair keeps the context's last tokens). The text is cut to the first (last) max_tokens +
MARGIN_TOKENS of those tokens and the row goes on with that (where the budget holds fewer tokens, for a tokenizer
whose normalizer shrinks text, the text stays whole, as before). Everything the cut changes lies more than max_tokens
tokens from the kept end, which is what the example is cut to anyway: the cut or drop that --truncation (or a pair's
rule) makes of the shortened row is the one it made of the whole row, at the cost of tokenizing the budget once per
long text, then a row of about max_tokens tokens per long text. A template that parses a text rather than printing
it could render a cut text otherwise: renders_alike checks that it does not (rendering a row whole is cheap), else
the row is tokenized whole. Pictures are left as they are: they only add tokens.

A row of many texts each under the budget is still rendered whole; --max_row_bytes bounds it."""

from __future__ import annotations

import logging
from typing import Any, Literal

from .formats import Message

logger = logging.getLogger(__name__)

# Tokens beyond max_tokens the shortened text must still hold: the few tokens a cut changes (a word cut in two, a
# merge across the cut) lie that far past anything an example keeps.
MARGIN_TOKENS = 64
# The message fields whose text a template renders and that a row may make arbitrarily long.
TEXT_FIELDS = ("content", "reasoning_content")
CHARS_PER_TOKEN_ATTRIBUTE = "_tunesmith_chars_per_token"

Keep = Literal["head", "tail"]


def chars_per_token(tokenizer: Any) -> int:
    """L: the most characters one token of this tokenizer covers (its longest vocabulary string), found once per
    tokenizer."""
    known = getattr(tokenizer, CHARS_PER_TOKEN_ATTRIBUTE, None)
    if known is None:
        known = max(map(len, tokenizer.get_vocab()), default=1)
        setattr(tokenizer, CHARS_PER_TOKEN_ATTRIBUTE, known)
    return known


def char_budget(tokenizer: Any, max_tokens: int) -> int:
    """Characters a text keeps: enough for max_tokens + MARGIN_TOKENS tokens, whatever the text."""
    return (max_tokens + MARGIN_TOKENS) * chars_per_token(tokenizer)


def _shortened(tokenizer: Any, text: str, budget: int, max_tokens: int, keep: Keep) -> str | None:
    """The text's `keep` end that holds max_tokens + MARGIN_TOKENS tokens, when the text is longer than `budget`
    characters; found by tokenizing that end's `budget` characters (the rest of the text is never tokenized)."""
    if len(text) <= budget:
        return None
    part = text[:budget] if keep == "head" else text[-budget:]
    wanted = max_tokens + MARGIN_TOKENS
    offsets = tokenizer(part, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) < wanted:
        return None  # the bound does not hold for this tokenizer (a normalizer that shrinks text): keep it whole
    return part[:offsets[wanted - 1][1]] if keep == "head" else part[offsets[-wanted][0]:]


def _bound_content(tokenizer: Any, content: Any, budget: int, max_tokens: int, keep: Keep) -> tuple[Any, list[int]]:
    """A content (a string or a list of parts) with its overlong texts shortened, and the lengths they had."""
    if isinstance(content, str):
        kept = _shortened(tokenizer, content, budget, max_tokens, keep)
        return (content, []) if kept is None else (kept, [len(content)])
    if not isinstance(content, list):
        return content, []
    parts, lengths = [], []
    for part in content:
        text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
        kept = _shortened(tokenizer, text, budget, max_tokens, keep) if isinstance(text, str) else None
        if kept is None:
            parts.append(part)
        else:
            parts.append({**part, "text": kept})
            lengths.append(len(text))
    return (parts, lengths) if lengths else (content, [])


def bound_messages(tokenizer: Any, messages: list[Message], max_tokens: int | None,
                   keep: Keep = "head") -> tuple[list[Message], list[str]]:
    """The messages with every text too long for max_tokens tokens to train shortened to its `keep` end (see the
    module), and what was shortened (`message 1's content: 60,000,000 characters`); nothing shortened: the very
    same list and no notes."""
    if max_tokens is None:
        return messages, []
    budget = char_budget(tokenizer, max_tokens)
    bounded, notes = [], []
    for i, m in enumerate(messages):
        for name in TEXT_FIELDS:
            value, lengths = _bound_content(tokenizer, m.get(name), budget, max_tokens, keep)
            if lengths:
                m = {**m, name: value}
                notes += [f"message {i}'s {name}: {n:,} characters" for n in lengths]
        bounded.append(m)
    return (bounded, notes) if notes else (messages, [])


def _kept_texts(original: list[Message], bounded: list[Message]) -> list[str]:
    """The texts bound_messages shortened, as kept."""
    kept = []
    for before, after in zip(original, bounded):
        for name in TEXT_FIELDS:
            value, was = after.get(name), before.get(name)
            if value is was:
                continue
            if isinstance(value, str):
                kept.append(value)
            else:
                kept += [part["text"] for part, old in zip(value, was) if part is not old]
    return kept


def renders_alike(tokenizer: Any, original: list[Message], bounded: list[Message], keep: Keep,
                  before: list[Message] = (), after: list[Message] = (), tools: list[dict] | None = None) -> bool:
    """Whether the chat template renders before + bounded + after as it renders before + original + after up to the
    end of the first text cut (head), or from the start of the last one (tail): true of a template that prints a
    message's text as it is; false of one that parses it (a `</think>` a head cut leaves out), whose row is then
    tokenized whole. Rendering the whole row is cheap: it is the tokenization that costs."""
    from .template import render_text

    kept = _kept_texts(original, bounded)
    whole = render_text(tokenizer, [*before, *original, *after], tools=tools)
    short = render_text(tokenizer, [*before, *bounded, *after], tools=tools)
    if keep == "head":
        found = [short.find(text) for text in kept]
        return min(found) >= 0 and whole.startswith(short[:min(f + len(t) for f, t in zip(found, kept))])
    found = [short.rfind(text) for text in kept]
    return min(found) >= 0 and whole.endswith(short[max(found):])


def log_bounded(where: str, notes: list[str], tokenizer: Any, max_tokens: int, rule: str) -> None:
    """The one line a shortened row gets: its file and line, what was long, and what decides the rest."""
    logger.warning("%s: %s; of each, only the part that holds %d tokens (more than --max_seq_length %d can train; "
                   "found in %s characters of it) is rendered and tokenized, and the row is %s", where,
                   ", ".join(notes), max_tokens + MARGIN_TOKENS, max_tokens,
                   f"{char_budget(tokenizer, max_tokens):,}", rule)
