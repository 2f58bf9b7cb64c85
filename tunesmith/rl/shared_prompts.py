"""Log-prob forwards that run each distinct prompt once.

GRPO and RLOO sample several replies to every prompt (`--samples_per_prompt`), and every forward that scores
them (the rollout's policy and reference log-probs, the update's policy logits) would otherwise run the same
prompt once per reply: with configs/grpo_demo.yaml's 8 replies of about 13 tokens to prompts of about 55,
three quarters of those forwards' tokens were copies of a prompt. Here each group of rows with the same prompt
runs the prompt once (all distinct prompts in one forward), and the replies (all rows in a second forward)
continue from their prompt's KV cache, repeated for the group's rows. The maths is the one forward's:
attention sees the same keys and values at the same positions (`position_ids` counting real tokens, as the
rollout generated them), so the logits agree up to floating-point summation order, and gradients flow through
the repeated cache into the shared prompt, summed over its replies, as they would into the copies.

Used when the rows average at least two per prompt (`MIN_ROWS_PER_PROMPT`); PPO's one reply per prompt keeps
the single batched forward, which one prompt per forward would only slow down.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.kv_cache import empty_cache

MIN_ROWS_PER_PROMPT = 2


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct left-padded prompt [G], each row's prompt among them [B]); None when the rows
    average fewer than MIN_ROWS_PER_PROMPT per prompt."""
    keyed = torch.where(prompt_mask.bool(), prompt_ids, -1)
    _, group = torch.unique(keyed, dim=0, return_inverse=True)
    count = int(group.max()) + 1
    if group.numel() < MIN_ROWS_PER_PROMPT * count:
        return None
    rows = torch.arange(group.numel(), device=group.device)
    firsts = torch.full((count,), group.numel(), device=group.device).scatter_reduce(0, group, rows, "amin")
    return firsts, group


def shared_prompt_logits(causal_lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, context_length: int,
                         groups: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The logits that predict tokens context_length ... end of every row [B, R, V] in two forwards: the
    distinct prompts (still left-padded to context_length), giving their KV cache and the logits of each
    reply's first token, then every row's reply but its last token, continuing from its prompt's cache."""
    firsts, group = groups
    cache_kwargs = empty_cache(causal_lm)
    (cache,) = cache_kwargs.values()
    prompts = causal_lm(input_ids=input_ids[firsts, :context_length], attention_mask=attention_mask[firsts, :context_length],
                        position_ids=position_ids[firsts, :context_length], use_cache=True, logits_to_keep=1,
                        **cache_kwargs)
    logits = prompts.logits[group]
    if input_ids.size(1) - context_length > 1:
        cache.batch_select_indices(group)  # each row's prompt, repeated: gradients sum back into the one prompt
        replies = causal_lm(input_ids=input_ids[:, context_length:-1], attention_mask=attention_mask[:, :-1],
                            position_ids=position_ids[:, context_length:-1], use_cache=True, **cache_kwargs)
        logits = torch.cat([logits, replies.logits], dim=1)
    return logits
