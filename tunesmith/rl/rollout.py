"""Rollouts: sample replies to prompts (the generation engine), score them, and record what the PPO update
needs (log-probs under the policy and the reference, values, per-token rewards, advantages).

Layout: `query` is [B, P] left-padded (every prompt ends where generation starts), `response`
is [B, R] right-padded and cut after the first EOS; the model sees cat(query, response)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..constants import ASSISTANT
from ..data.formats import offered_tools
from ..data.prompts import Prompt
from ..data.template import render_text
from ..generation import Completion, Engine, SamplingParams, stop_token_ids
from ..models.scoring import score_sequences
from .losses import entropy_from_logits, logprobs_from_logits

# reward_fn(prompts_ids, responses_ids) -> one score per reply. Responses hold the reply tokens up to
# and including the first EOS (when the reply ended).
RewardFn = Callable[[list[list[int]], list[list[int]]], Sequence[float] | torch.Tensor]


def rollout_sampling(max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     greedy: bool = False) -> SamplingParams:
    """Every sampling setting explicit (no repetition penalty, no min-p), whatever the flags' defaults."""
    return SamplingParams(temperature=0.0 if greedy else temperature, top_k=top_k, top_p=top_p, min_p=0.0,
                          repetition_penalty=1.0, max_new_tokens=max_new_tokens, num_beams=1)


def sequence_inputs(query_ids: torch.Tensor, query_mask: torch.Tensor, response_ids: torch.Tensor,
                    response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of prompt + reply. Positions count real tokens
    only, as generate() does with left padding, so a reply is scored where it was sampled."""
    input_ids = torch.cat([query_ids, response_ids], dim=1)
    attention_mask = torch.cat([query_mask, response_mask.to(query_mask.dtype)], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def generate_responses(engine: Engine, prompts: Sequence[Sequence[int]], params: SamplingParams, pad_token_id: int,
                       max_batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(response_ids, response_mask, ended) [B, R]: each reply with the end-of-turn token that ended it,
    right-padded; ended is False for a reply cut at max_new_tokens."""
    completions = [c[0] for c in engine.generate(prompts, params, max_batch_size=max_batch_size)]
    replies = [c.ids_with_stop for c in completions]
    response_ids, response_mask = pad_replies(replies, pad_token_id, engine.model.device)
    ended = torch.tensor([c.stop_token_id is not None for c in completions], device=engine.model.device)
    return response_ids, response_mask, ended


def pad_replies(replies: Sequence[Sequence[int]], pad_token_id: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, R]: the replies right-padded to the longest (at least one column)."""
    width = max(1, max(map(len, replies)))
    ids = torch.tensor([list(r) + [pad_token_id] * (width - len(r)) for r in replies], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in replies], device=device)
    return ids, mask


def reply_tokens(response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(response_ids, response_mask)]


class RewardModelScorer:
    """Scores replies with a sequence-classification reward model on the chat-template rendering of
    prompt + reply, re-rendered with the reward model's own tokenizer (which may differ from the
    policy's) -- the rendering the reward stage trained on -- and read where the reward stage reads
    scores (tunesmith.models.scoring.score_sequences: the last attended token)."""

    def __init__(self, model: nn.Module, tokenizer: Any, policy_tokenizer: Any, batch_size: int = 8) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.policy_tokenizer = policy_tokenizer
        self.batch_size = batch_size
        self.eos_ids = stop_token_ids(None, policy_tokenizer)

    def texts(self, prompts: Sequence[Prompt], responses: Sequence[Sequence[int]]) -> list[str]:
        texts = []
        for prompt, reply in zip(prompts, responses):
            reply = list(reply)
            if reply and reply[-1] in self.eos_ids:
                reply = reply[:-1]  # the template adds the end-of-turn token itself
            content = self.policy_tokenizer.decode(reply, skip_special_tokens=False)
            texts.append(render_text(self.tokenizer, [*prompt.messages, {"role": ASSISTANT, "content": content}],
                                     tools=offered_tools(prompt.row)))
        return texts

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[Sequence[int]]) -> torch.Tensor:
        encoded = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in self.texts(prompts, responses)]
        return torch.tensor(score_sequences(self.model, self.tokenizer, encoded, self.batch_size))


def completion_tokens(completion: Completion) -> tuple[list[int], list[float]]:
    """A reply's tokens with the end-of-turn token that ended it, and the rollout engine's log-probability of each
    (NaN where it gave none)."""
    ids = completion.ids_with_stop
    given = [t.logprob for t in completion.logprobs or []]
    if completion.stop_token_id is not None and completion.stop_logprob is not None:
        given.append(completion.stop_logprob.logprob)
    if len(given) != len(ids):  # none given (tunesmith's engine, unasked), or not one per token: none used
        given = [float("nan")] * len(ids)
    return ids, given


@dataclass
class Generated:
    """Replies to prompts, before scoring: per reply its tokens, which of them the policy sampled (all of a plain
    reply; not a tool's result), whether it ended, its tool calls and failed calls (0 without tools), and the
    rollout engine's log-probability of each token (None from tunesmith's engine, whose are the trainer's own)."""

    replies: list[list[int]]
    trained: list[list[bool]]
    ended: list[bool]
    tool_calls: list[int]
    failed_calls: list[int]
    logprobs: list[list[float]] | None = None

    @classmethod
    def of(cls, completions: Sequence[Completion], with_logprobs: bool = False) -> Generated:
        """Plain replies (no tools), one completion each."""
        tokens = [completion_tokens(c) for c in completions]
        replies = [ids for ids, _ in tokens]
        zeros = [0] * len(replies)
        return cls(replies, [[True] * len(r) for r in replies], [c.stop_token_id is not None for c in completions],
                   zeros, zeros, [lp for _, lp in tokens] if with_logprobs else None)


@dataclass
class Sampled:
    """Replies to prompts, scored: a rollout before any forward pass (Generated's fields, and the scores)."""

    prompts: list[Prompt]
    replies: list[list[int]]
    trained: list[list[bool]]
    ended: list[bool]
    scores: torch.Tensor  # [B]
    source_scores: torch.Tensor  # [B, sources]
    tool_calls: list[int]
    failed_calls: list[int]
    logprobs: list[list[float]] | None = None

    @classmethod
    def gather(cls, picked: Sequence[tuple[Sampled, int]]) -> Sampled:
        """The rows `(sampled, index)` picked from several samplings, in that order."""
        column = {f: [getattr(s, f)[i] for s, i in picked] for f in ("prompts", "replies", "trained", "ended",
                                                                       "tool_calls", "failed_calls")}
        logprobs = None if picked and picked[0][0].logprobs is None else [s.logprobs[i] for s, i in picked]
        return cls(**column, scores=torch.stack([s.scores[i] for s, i in picked]),
                   source_scores=torch.stack([s.source_scores[i] for s, i in picked]), logprobs=logprobs)


@dataclass
class Rollout:
    """One batch of episodes. Per-token tensors are [B, R] over the response positions."""

    query_ids: torch.Tensor
    query_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ended: torch.Tensor
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor | None  # None without a value model (GRPO, RLOO)
    entropy: torch.Tensor
    scores: torch.Tensor  # the weighted reward of the reward sources, before the missing-EOS penalty
    source_scores: torch.Tensor | None = None  # [B, sources]: each source's own score
    generate_seconds: float = 0.0
    rewards: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    action_mask: torch.Tensor | None = None  # [B, R]: the tokens the policy sampled (not a tool's result)
    loss_mask: torch.Tensor | None = None  # [B, R]: the tokens the policy loss trains (PPOTrainer.loss_mask)
    rollout_logprobs: torch.Tensor | None = None  # [B, R]: the rollout engine's own (a vLLM server's); NaN: none
    is_weights: torch.Tensor | None = None  # [B, R]: truncated importance weights of the policy loss (off_policy.py)
    sampling_stats: dict[str, float] = field(default_factory=dict)  # dynamic sampling's counts

    @property
    def context_length(self) -> int:
        return self.query_ids.size(1)

    def inputs(self, rows: torch.Tensor | slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return sequence_inputs(self.query_ids[rows], self.query_mask[rows], self.response_ids[rows],
                               self.response_mask[rows])


@torch.no_grad()
def policy_statistics(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor, context_length: int, response_ids: torch.Tensor,
                      chunk_size: int) -> dict[str, torch.Tensor]:
    """Log-probs of the sampled replies under the policy and the reference, per-token entropy of
    the policy, and the values (when the model has a value model) -- in chunks of chunk_size rows to
    bound activation memory."""
    parts: dict[str, list[torch.Tensor]] = {"logprobs": [], "ref_logprobs": [], "entropy": []}
    if getattr(model, "has_value_model", True):
        parts["values"] = []
    for start in range(0, input_ids.size(0), chunk_size):
        rows = slice(start, start + chunk_size)
        args = (input_ids[rows], attention_mask[rows], position_ids[rows], context_length)
        logits = model.policy_logits(*args)
        parts["logprobs"].append(logprobs_from_logits(logits, response_ids[rows]).float())
        parts["entropy"].append(entropy_from_logits(logits).float())
        del logits
        ref_logits = model.reference_logits(*args)
        parts["ref_logprobs"].append(logprobs_from_logits(ref_logits, response_ids[rows]).float())
        del ref_logits
        if "values" in parts:
            parts["values"].append(model.values(*args))
    return {k: torch.cat(v) for k, v in parts.items()}
