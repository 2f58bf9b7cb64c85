"""The policy evaluation's pieces (its command: evaluate_command.py): each prompt answered by a model (plain replies, or
agent trajectories with tools), the log-probability of those replies under a model (for KL(policy || baseline)), and
the paired comparison of two models' rewards."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..data.prompts import Prompt, left_pad
from ..generation import Engine
from ..utils.stats import paired_change
from .args import EvalArguments, ToolUseArguments
from .losses import logprobs_from_logits
from .models import response_logits
from .rollout import generate_responses, pad_replies, reply_tokens, rollout_sampling, sequence_inputs
from .tool_rollout import Trajectory, tool_rollout
from .toolbox import Toolbox


class Answers:
    """Each prompt's reply (token ids after the prompt; with tools the whole trajectory), and per batch the
    (query ids, query mask, response ids, response mask, trained mask) the log-probabilities are read from:
    the trained mask marks the tokens the model wrote (all of a plain reply; not a tool's result)."""

    def __init__(self) -> None:
        self.replies: list[list[int]] = []
        self.batches: list[tuple[torch.Tensor, ...]] = []
        self.trajectories: list[Trajectory] = []


def answer(engine: Engine, tokenizer: Any, prompts: list[Prompt], args: EvalArguments, sample: bool,
           temperature: float, tools: ToolUseArguments | None = None, toolbox: Toolbox | None = None) -> Answers:
    """The replies to every prompt, in batches of --batch_size; with a toolbox, agent trajectories (the tool loop)."""
    params = rollout_sampling(args.max_new_tokens, temperature, greedy=not sample)
    torch.manual_seed(args.seed)
    answers = Answers()
    for start in range(0, len(prompts), args.batch_size):
        chunk = prompts[start:start + args.batch_size]
        query_ids, query_mask = left_pad([p.input_ids for p in chunk], tokenizer.pad_token_id)
        if toolbox is None:
            response_ids, response_mask, _ = generate_responses(engine, [p.input_ids for p in chunk], params,
                                                                tokenizer.pad_token_id)
            answers.replies += reply_tokens(response_ids, response_mask)
            answers.batches.append((query_ids, query_mask, response_ids, response_mask, response_mask))
            continue
        trajectories = tool_rollout(engine, tokenizer, chunk, params, toolbox, tools.max_tool_calls,
                                    tools.max_trajectory_tokens)
        answers.trajectories += trajectories
        answers.replies += [t.token_ids for t in trajectories]
        response_ids, response_mask = pad_replies([t.token_ids for t in trajectories], tokenizer.pad_token_id, "cpu")
        trained = pad_replies([[int(m) for m in t.trained] for t in trajectories], 0, "cpu")[0]
        answers.batches.append((query_ids, query_mask, response_ids, response_mask, trained))
    return answers


@torch.no_grad()
def reply_logprobs(model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, response_ids: torch.Tensor,
                   response_mask: torch.Tensor, trained: torch.Tensor | None = None) -> torch.Tensor:
    """Summed log-probability (temperature 1) under `model` of each reply's tokens that `trained` marks (default:
    all of them): the model reads a tool's result but did not write it."""
    device = next(model.parameters()).device
    query_ids, query_mask, response_ids, response_mask = (t.to(device) for t in (query_ids, query_mask, response_ids,
                                                                                 response_mask))
    input_ids, attention_mask, position_ids = sequence_inputs(query_ids, query_mask, response_ids, response_mask)
    logits = response_logits(model, input_ids, attention_mask, position_ids, query_ids.size(1))
    logprobs = logprobs_from_logits(logits.float(), response_ids)
    counted = (response_mask if trained is None else trained.to(device)).bool()
    return torch.where(counted, logprobs, 0.0).sum(1)



def summarize(baseline_scores: torch.Tensor, policy_scores: torch.Tensor, kl: torch.Tensor,
              baseline_replies: list[list[int]], policy_replies: list[list[int]]) -> dict[str, float]:
    """The paired comparison: mean rewards, their change with its standard error, wins, KL and lengths."""
    gain, n = policy_scores - baseline_scores, len(policy_scores)
    change = paired_change(baseline_scores, policy_scores)
    return {"prompts": n, "baseline_reward": change["baseline"], "policy_reward": change["policy"],
            "reward_change": change["change"], "reward_change_stderr": change["change_stderr"],
            "kl_policy_baseline": kl.mean().item(),
            "policy_higher": int((gain > 0).sum()), "policy_lower": int((gain < 0).sum()),
            "baseline_reply_length": sum(map(len, baseline_replies)) / n,
            "policy_reply_length": sum(map(len, policy_replies)) / n}
