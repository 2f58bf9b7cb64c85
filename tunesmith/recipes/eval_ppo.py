"""Did PPO help: held-out prompts answered by the SFT policy and by the PPO policy, scored by the reward
model. Replies are greedy by default, or sampled with a fixed seed; KL(ppo || sft) per reply is estimated
from replies sampled from the PPO policy at temperature 1 (the mean of log p_ppo - log p_sft over
them, an unbiased estimate; a log-ratio on greedy replies would not be one).

    python scripts/eval_ppo.py --sft outputs/sft_demo --ppo outputs/ppo_demo --reward_model outputs/rm_demo
    python scripts/eval_ppo.py ... --data_path data/demo/prompts_eval.jsonl --do_sample true --seed 0

prints e.g.
    50 prompts, greedy replies: PPO higher on 30, lower on 15, tied on 5; mean reply length 22.7 -> 23.6 tokens
    mean reward: sft -1.902 -> ppo -1.211 (change +0.691 ± 0.348, paired standard error)
    KL(ppo || sft): 2.969 nats/reply (50 replies sampled from PPO at temperature 1)
--sft and --ppo are adapter directories (their base comes from adapter_config.json) or full model directories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..boundary import entry_point
from ..data.prompts import Prompt, build_prompts, left_pad
from ..hparams import EvalArguments, parse_run
from ..models.loader import inference_model_args, load_for_inference
from ..ppo.core import logprobs_from_logits
from ..ppo.models import response_logits
from ..ppo.rollout import (
    RewardModelScorer,
    eos_token_ids,
    generate_responses,
    generation_config,
    reply_tokens,
    sequence_inputs,
)
from ..utils.io import atomic_write_jsonl


@torch.no_grad()
def answer(model: nn.Module, tokenizer: Any, prompts: list[Prompt], args: EvalArguments, sample: bool,
           temperature: float) -> tuple[list[list[int]], list[tuple[torch.Tensor, ...]]]:
    """Replies (token lists), and per batch the (query ids, query mask, response ids, response mask)."""
    config = generation_config(tokenizer, eos_token_ids(tokenizer, model), args.max_new_tokens,
                               temperature=temperature, greedy=not sample)
    torch.manual_seed(args.seed)
    replies, batches = [], []
    for start in range(0, len(prompts), args.batch_size):
        chunk = prompts[start:start + args.batch_size]
        query_ids, query_mask = left_pad([p.input_ids for p in chunk], tokenizer.pad_token_id)
        response_ids, response_mask, _ = generate_responses(model, query_ids, query_mask, config,
                                                            tokenizer.pad_token_id)
        replies += reply_tokens(response_ids, response_mask)
        batches.append((query_ids, query_mask, response_ids, response_mask))
    return replies, batches


@torch.no_grad()
def reply_logprobs(model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, response_ids: torch.Tensor,
                   response_mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probability (temperature 1) of each reply under `model`."""
    input_ids, attention_mask, position_ids = sequence_inputs(query_ids, query_mask, response_ids, response_mask)
    logits = response_logits(model, input_ids, attention_mask, position_ids, query_ids.size(1))
    logprobs = logprobs_from_logits(logits.float(), response_ids)
    return torch.where(response_mask.bool(), logprobs, 0.0).sum(1)


def run(argv: Sequence[str] | None = None) -> dict[str, float]:
    parsed = parse_run("eval_ppo", argv, __doc__)
    args, data = parsed.evaluation, parsed.data
    sft, tokenizer = load_for_inference(inference_model_args(args.sft))
    ppo, _ = load_for_inference(inference_model_args(args.ppo))
    reward_model, reward_tokenizer = load_for_inference(inference_model_args(args.reward_model), task="reward")
    scorer = RewardModelScorer(reward_model, reward_tokenizer, tokenizer, batch_size=args.batch_size)
    prompts = build_prompts(tokenizer, data, "eval")

    sft_replies, _ = answer(sft, tokenizer, prompts, args, args.do_sample, args.temperature)
    ppo_replies, _ = answer(ppo, tokenizer, prompts, args, args.do_sample, args.temperature)
    sft_scores, ppo_scores = scorer(prompts, sft_replies), scorer(prompts, ppo_replies)
    _, kl_batches = answer(ppo, tokenizer, prompts, args, sample=True, temperature=1.0)
    kl = torch.cat([reply_logprobs(ppo, *b) - reply_logprobs(sft, *b) for b in kl_batches])
    gain = ppo_scores - sft_scores
    result = {"prompts": len(prompts), "sft_reward": sft_scores.mean().item(), "ppo_reward": ppo_scores.mean().item(),
              "reward_change": gain.mean().item(),
              "reward_change_stderr": (gain.std() / len(prompts) ** 0.5).item() if len(prompts) > 1 else 0.0,
              "kl_ppo_sft": kl.mean().item(),
              "ppo_higher": int((gain > 0).sum()), "ppo_lower": int((gain < 0).sum()),
              "sft_reply_length": float(sum(len(r) for r in sft_replies) / len(sft_replies)),
              "ppo_reply_length": float(sum(len(r) for r in ppo_replies) / len(ppo_replies))}
    if args.output_file:
        atomic_write_jsonl(args.output_file, [
            {"source": f"{p.row.path}:{p.row.line}", "prompt": p.messages[-1]["content"],
             "sft": tokenizer.decode(s, skip_special_tokens=True), "sft_score": float(ss),
             "ppo": tokenizer.decode(q, skip_special_tokens=True), "ppo_score": float(qs), "kl_sample": float(k)}
            for p, s, ss, q, qs, k in zip(prompts, sft_replies, sft_scores, ppo_replies, ppo_scores, kl)
        ])
    decoding = f"sampled (seed {args.seed}, temperature {args.temperature})" if args.do_sample else "greedy"
    tied = len(prompts) - result["ppo_higher"] - result["ppo_lower"]
    print(f"{len(prompts)} prompts, {decoding} replies: PPO higher on {result['ppo_higher']}, lower on "
          f"{result['ppo_lower']}, tied on {tied}; mean reply length {result['sft_reply_length']:.1f} -> "
          f"{result['ppo_reply_length']:.1f} tokens")
    print(f"mean reward: sft {result['sft_reward']:.3f} -> ppo {result['ppo_reward']:.3f} "
          f"(change {result['reward_change']:+.3f} ± {result['reward_change_stderr']:.3f}, paired standard error)")
    print(f"KL(ppo || sft): {result['kl_ppo_sft']:.3f} nats/reply ({len(prompts)} replies sampled from PPO at "
          f"temperature 1)")
    return result



main = entry_point(run)
