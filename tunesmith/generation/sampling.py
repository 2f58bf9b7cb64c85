"""How a reply is generated, in one dataclass, and the one function that turns a batch's next-token
logits into tokens (greedy rows, seeded rows and the rest sampled together) with the log-probabilities
the caller asked for.

The order of the logit processors is transformers' (`generate()`): penalties, temperature, top-k,
top-p, min-p. Log-probabilities are the model's own (log-softmax of the raw logits, before any
processor), as OpenAI and vLLM report them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..hparams import GenerationArguments

_DEFAULTS = GenerationArguments()


@dataclass(frozen=True)
class SamplingParams:
    """One request's (or one caller's) generation settings. Defaults are the generation flags' defaults
    (`tunesmith chat --help`): every caller starts from the same ones.

    temperature 0 means greedy. top_k 0, top_p 1, min_p 0 and penalties at their neutral value turn
    that step off. `repetition_penalty` (transformers') divides the positive logits (multiplies the
    negative ones) of every token in the prompt or the reply so far; `presence_penalty` and
    `frequency_penalty` (OpenAI's) subtract a constant, and a constant per occurrence, from the logits of
    tokens already in the reply. `seed` gives the request a generator of its own, so its replies repeat
    whatever else is in the batch. `stop` strings end a reply (the text is cut before them);
    `stop_token_ids` end it after those tokens, beside the model's end-of-turn tokens.
    `logprobs`: record each generated token's log-probability, with `top_logprobs` alternatives;
    `prompt_logprobs`: the same for the prompt's tokens (the first one has none). Log-probabilities are
    the model's own unless `processed_logprobs` (vLLM's "processed" mode): then they are those of the
    distribution the token was drawn from, after penalties, temperature and truncation (what an RL
    update compares against). `num_beams` > 1 is beam search (offline callers only: chat, compare).
    `banned_strings`: text the reply never holds, and `banned_openings`: text it never opens with (leading
    whitespace aside): at each step the tokens that would complete one are banned (bans.py; the server's
    tool_choice "none" keeps a call's opening out this way); not with beam search."""

    temperature: float = _DEFAULTS.temperature
    top_p: float = _DEFAULTS.top_p
    top_k: int = _DEFAULTS.top_k
    min_p: float = _DEFAULTS.min_p
    repetition_penalty: float = _DEFAULTS.repetition_penalty
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_new_tokens: int = _DEFAULTS.max_new_tokens
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    num_beams: int = _DEFAULTS.num_beams
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    processed_logprobs: bool = False
    banned_strings: tuple[str, ...] = ()
    banned_openings: tuple[str, ...] = ()

    @classmethod
    def from_arguments(cls, args: GenerationArguments, **overrides: Any) -> SamplingParams:
        """The generation flags as sampling settings (--do_sample false: greedy)."""
        settings = {"temperature": args.temperature if args.do_sample else 0.0, "top_p": args.top_p,
                    "top_k": args.top_k, "min_p": args.min_p, "repetition_penalty": args.repetition_penalty,
                    "max_new_tokens": args.max_new_tokens, "num_beams": args.num_beams}
        return cls(**(settings | overrides))

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def bans(self) -> bool:
        return bool(self.banned_strings or self.banned_openings)

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt: torch.Tensor, reply: torch.Tensor
                    ) -> torch.Tensor:
    """One row's logits [V] with the repetition (prompt and reply), presence and frequency (reply) penalties."""
    if params.repetition_penalty != 1.0:
        seen = torch.cat([prompt, reply])
        scores = logits.gather(0, seen)
        scores = torch.where(scores < 0, scores * params.repetition_penalty, scores / params.repetition_penalty)
        logits = logits.scatter(0, seen, scores)
    if (params.presence_penalty or params.frequency_penalty) and reply.numel():
        counts = torch.bincount(reply, minlength=logits.numel()).to(logits.dtype)
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [B, V] of rows that share `params`, scaled by the temperature and with the tokens outside
    top-k / top-p / min-p set to -inf (transformers' warpers: the most likely token always stays)."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.size(-1):
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1)
        remove = ordered.softmax(-1).cumsum(-1) <= 1 - params.top_p
        remove[..., -1] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    if params.min_p > 0:
        probs = logits.softmax(-1)
        remove = probs < params.min_p * probs.max(-1, keepdim=True).values
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def choose_tokens(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                  prompts: list[torch.Tensor] | None = None, replies: list[torch.Tensor] | None = None,
                  banned: list[list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of every row of a batch's float32 logits [B, V], and the logits each was chosen
    from (after bans, penalties, temperature and truncation).

    Greedy rows take the argmax; a row with a generator of its own (a seeded request) draws from it;
    every other sampled row is drawn in one `torch.multinomial` over those rows from the global
    generator, as transformers' `generate()` draws a batch, so a seeded caller's random stream is the
    one `generate()` would consume. `prompts`/`replies` (ids per row) feed the penalties; `banned` (ids per
    row) are ruled out first (-inf), so no row, greedy or sampled, can choose them."""
    processed = logits
    if banned is not None and any(banned):
        width = logits.size(-1)  # a tokenizer may know tokens the model's head lacks: it never chooses them
        pairs = [(k, i) for k, ids in enumerate(banned) for i in ids if i < width]
        rows = torch.tensor([k for k, _ in pairs], device=logits.device, dtype=torch.long)
        columns = torch.tensor([i for _, i in pairs], device=logits.device, dtype=torch.long)
        processed = logits.index_put((rows, columns), torch.tensor(float("-inf"), device=logits.device))
    if any(p.penalised for p in params):
        processed = torch.stack([apply_penalties(row, p, prompts[k], replies[k]) if p.penalised else row
                                 for k, (row, p) in enumerate(zip(processed, params))])
    tokens = processed.argmax(-1)
    sampled = [k for k, p in enumerate(params) if not p.greedy]
    if not sampled:
        return tokens, processed
    shared: list[int] = []
    for group in _groups(params, sampled):  # rows with equal settings are warped together
        warped = warp(processed[group], params[group[0]])
        for k, row in zip(group, warped):
            if generators[k] is not None:
                tokens[k] = torch.multinomial(row.softmax(-1), 1, generator=generators[k])[0]
        shared += [k for k in group if generators[k] is None]
        processed = processed.index_copy(0, torch.tensor(group, device=logits.device), warped)
    if shared:
        index = torch.tensor(sorted(shared), device=logits.device)
        tokens[index] = torch.multinomial(processed[index].softmax(-1), 1).squeeze(-1)
    return tokens, processed


def _groups(params: list[SamplingParams], rows: list[int]) -> list[list[int]]:
    groups: dict[tuple, list[int]] = {}
    for k in rows:
        p = params[k]
        groups.setdefault((p.temperature, p.top_k, p.top_p, p.min_p), []).append(k)
    return list(groups.values())


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                                  torch.Tensor | None]:
    """(log-probability of each chosen token [N], top-`top` log-probabilities [N, top] and their ids), from
    float32 logits [N, V]; the alternatives are None when top is 0."""
    logprobs = logits.log_softmax(-1)
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    if top <= 0:
        return chosen, None, None
    values, ids = logprobs.topk(top, dim=-1)
    return chosen, values, ids
