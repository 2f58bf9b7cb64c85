"""Did RL or DPO help: held-out prompts answered by the baseline (the SFT policy) and by the tuned policy,
scored by the reward model and/or reward functions (the accuracy and format compliance of verifiable
answers), each with the paired standard error of its change. Replies are greedy by default, or sampled with
a fixed seed; KL(policy || baseline) per reply is estimated from replies sampled from the policy at
temperature 1 (the mean of log p_policy - log p_baseline over them, an unbiased estimate; a log-ratio on
greedy replies would not be one).

    tunesmith eval --baseline outputs/sft_demo --policy outputs/dpo_demo --reward_model outputs/rm_demo
    tunesmith eval ... --data_path data/demo/prompts_eval.jsonl --do_sample true --seed 0
    tunesmith eval --policy outputs/grpo_demo --data_path data/demo/grpo_eval.jsonl \\
        --reward_funcs exact_answer answer_format --max_new_tokens 32

prints e.g.
    50 prompts, greedy replies: policy higher on 30, lower on 15, tied on 5; mean reply length 22.7 -> 23.6 tokens
    mean reward: baseline -1.902 -> policy -1.211 (change +0.691 ± 0.348, paired standard error)
    KL(policy || baseline): 2.969 nats/reply (50 replies sampled from the policy at temperature 1)
and with reward functions one line each (their mean is the accuracy of a 0/1 function), e.g.
    exact_answer: baseline 0.040 -> policy 0.520 (change +0.480 ± 0.051, paired standard error)
--baseline and --policy (formerly --sft and --ppo) are adapter directories (their base comes from
adapter_config.json) or full model directories; --baseline left out is the base under the --policy adapter.

With --tool_funcs package.module:function (a policy trained to call tools), both answer as agents: a reply that
is a call runs the function and the model goes on after its result, up to --max_tool_calls calls; the rewards
score the whole trajectory, the KL counts only the tokens the policy wrote, and the prompts are rendered with the
policy's chat template (the one that lists its tools), for both models:
    tunesmith eval --policy outputs/grpo_tools --data_path q.jsonl --reward_funcs exact_answer \
        --tool_funcs my_tools:add,my_tools:multiply --max_tool_calls 3
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..boundary import entry_point
from ..data.prompts import build_prompts
from ..generation import Engine
from ..hparams import parse_run
from ..models.loader import inference_model_args, load_for_inference
from ..utils.io import atomic_write_jsonl
from ..utils.paths import adapter_base_model
from ..utils.stats import paired_change
from .policy_eval import answer, reply_logprobs, summarize
from .reward_sources import Rewards, load_reward_function
from .rollout import RewardModelScorer
from .tool_rollout import encode_tool_prompts
from .toolbox import Toolbox


def run(argv: Sequence[str] | None = None) -> dict[str, float]:
    parsed = parse_run("eval_policy", argv, __doc__)
    args, data, tools = parsed.evaluation, parsed.data, parsed.tool_use
    reward_funcs = [load_reward_function(spec) for spec in args.reward_funcs]  # a bad name fails before loading
    toolbox = Toolbox.from_specs(tools.tool_funcs, tools.tool_timeout) if tools.enabled else None  # likewise
    baseline_path = args.baseline or adapter_base_model(args.policy)
    baseline, tokenizer = load_for_inference(inference_model_args(baseline_path))
    policy, policy_tokenizer = load_for_inference(inference_model_args(args.policy))
    if toolbox is not None:  # the template the policy was trained with lists its tools (a base's may list none)
        tokenizer = policy_tokenizer
    scorer = None
    if args.reward_model:
        reward_model, reward_tokenizer = load_for_inference(inference_model_args(args.reward_model), task="reward")
        scorer = RewardModelScorer(reward_model, reward_tokenizer, tokenizer, batch_size=args.batch_size)
    rewards = Rewards(tokenizer, reward_funcs, args.reward_weights, scorer, args.reward_model_weight)
    prompts = build_prompts(tokenizer, data, "eval")
    if toolbox is not None:
        prompts = encode_tool_prompts(tokenizer, prompts, toolbox, data.max_prompt_length, "eval")

    baseline_engine, policy_engine = Engine(baseline, tokenizer), Engine(policy, tokenizer)
    sides = [answer(engine, tokenizer, prompts, args, args.do_sample, args.temperature, tools, toolbox)
             for engine in (baseline_engine, policy_engine)]
    baseline_replies, policy_replies = sides[0].replies, sides[1].replies
    (baseline_scores, baseline_sources), (policy_scores, policy_sources) = (
        rewards(prompts, baseline_replies), rewards(prompts, policy_replies))
    kl_batches = answer(policy_engine, tokenizer, prompts, args, True, 1.0, tools, toolbox).batches
    kl = torch.cat([reply_logprobs(policy, *b) - reply_logprobs(baseline, *b) for b in kl_batches])
    result = summarize(baseline_scores, policy_scores, kl, baseline_replies, policy_replies)
    functions = rewards.names[:len(reward_funcs)]
    for i, name in enumerate(functions):
        result |= {f"{name}_{k}": v for k, v in paired_change(baseline_sources[:, i], policy_sources[:, i]).items()}
    if toolbox is not None:
        for side, answers in zip(("baseline", "policy"), sides):
            result[f"{side}_tool_calls"] = sum(t.tool_calls for t in answers.trajectories)
            result[f"{side}_failed_tool_calls"] = sum(t.failed_calls for t in answers.trajectories)
    if args.output_file:
        rows = []
        for i, (p, s, q) in enumerate(zip(prompts, baseline_replies, policy_replies)):
            rows.append({"source": f"{p.row.path}:{p.row.line}", "prompt": p.messages[-1]["content"],
                         "baseline": tokenizer.decode(s, skip_special_tokens=True),
                         "baseline_score": float(baseline_scores[i]),
                         "policy": tokenizer.decode(q, skip_special_tokens=True),
                         "policy_score": float(policy_scores[i]), "kl_sample": float(kl[i])})
            if len(rewards.names) > 1 or reward_funcs:  # each source's score too
                rows[-1] |= {f"{side}_{name}": float(scores[i, j]) for j, name in enumerate(rewards.names)
                             for side, scores in (("baseline", baseline_sources), ("policy", policy_sources))}
            if toolbox is not None:  # the turns as messages: the calls, the results, the answers
                for side, answers in zip(("baseline", "policy"), sides):
                    t = answers.trajectories[i]
                    rows[-1] |= {f"{side}_messages": t.new_messages, f"{side}_tool_calls": t.tool_calls,
                                 f"{side}_failed_tool_calls": t.failed_calls, f"{side}_finish": t.finish_reason}
        atomic_write_jsonl(args.output_file, rows)
    decoding = f"sampled (seed {args.seed}, temperature {args.temperature})" if args.do_sample else "greedy"
    for p, s, ss, q, qs in list(zip(prompts, baseline_replies, baseline_scores, policy_replies, policy_scores))[:args.show]:
        print(f"> {p.messages[-1]['content']}\n  baseline ({ss:+.2f}): {tokenizer.decode(s, skip_special_tokens=True)}"
              f"\n  policy   ({qs:+.2f}): {tokenizer.decode(q, skip_special_tokens=True)}")
    tied = len(prompts) - result["policy_higher"] - result["policy_lower"]
    print(f"{len(prompts)} prompts, {decoding} replies: policy higher on {result['policy_higher']}, lower on "
          f"{result['policy_lower']}, tied on {tied}; mean reply length {result['baseline_reply_length']:.1f} -> "
          f"{result['policy_reply_length']:.1f} tokens")
    print(f"mean reward: baseline {result['baseline_reward']:.3f} -> policy {result['policy_reward']:.3f} "
          f"(change {result['reward_change']:+.3f} ± {result['reward_change_stderr']:.3f}, paired standard error)")
    for name in functions:
        print(f"{name}: baseline {result[f'{name}_baseline']:.3f} -> policy {result[f'{name}_policy']:.3f} "
              f"(change {result[f'{name}_change']:+.3f} ± {result[f'{name}_change_stderr']:.3f}, paired standard error)")
    if toolbox is not None:
        print(f"tool calls: baseline {result['baseline_tool_calls']} ({result['baseline_failed_tool_calls']} failed) -> "
              f"policy {result['policy_tool_calls']} ({result['policy_failed_tool_calls']} failed), at most "
              f"{tools.max_tool_calls} per reply")
    print(f"KL(policy || baseline): {result['kl_policy_baseline']:.3f} nats/reply ({len(prompts)} replies sampled "
          "from the policy at temperature 1" + (", its own tokens only" if toolbox is not None else "") + ")")
    return result


main = entry_point(run)
