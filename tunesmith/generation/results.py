"""What the engine hands back: a finished reply (Completion) with its tokens' log-probabilities (TokenLogprob),
and what a request hears while it runs (Event). Its own module so that beam search, which returns completions
too, and the engine import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

BASE = "__base__"  # a request's adapter: the base model, every adapter off (peft's own name for it)


@dataclass
class TokenLogprob:
    """One token's log-probability under the model, with the most likely alternatives (most likely first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Completion:
    """One finished reply: its tokens (without the token that ended it, `stop_token_id`: an end-of-turn
    token or one of the request's stop_token_ids),
    its text (cut before a stop string), why it ended (stop, length, cancelled) and, when asked, each
    token's log-probability, and the end-of-turn token's in `stop_logprob` (the legacy completions API
    lists it: a loglikelihood client counts on one generated token after the echoed prompt)."""

    index: int
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_token_id: int | None = None
    logprobs: list[TokenLogprob] | None = None
    stop_logprob: TokenLogprob | None = None

    @property
    def ids_with_stop(self) -> list[int]:
        """The reply's tokens and the end-of-turn token that ended it (what a trainer trains on)."""
        return self.token_ids + ([self.stop_token_id] if self.stop_token_id is not None else [])


@dataclass
class Event:
    """What a request hears as it runs: text for reply `index` (with the log-probabilities of the tokens
    since the last event), its finish (with the reply's token count), or an error that ends the request."""

    index: int = 0
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None
