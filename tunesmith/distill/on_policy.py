"""GKD's on-policy data (arXiv 2306.13649, Algorithm 1): with probability lambda, an optimizer step trains on the
student's own replies instead of the data's. Each example's last reply is replaced by one the student samples,
through the one generation engine (tunesmith/generation/), from the same prompt (the conversation up to that
reply); the new reply's tokens, its end-of-turn token included, are the trained ones, and the teacher scores them
in the loss as it scores the data's. Earlier replies of a multi-turn example stay in the prompt, untrained, as the
prompt TRL's GKD samples from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..constants import IGNORE_INDEX
from ..generation import Engine, SamplingParams

Example = dict[str, list[int]]


def examples_of(batch: dict[str, Any]) -> list[Example]:
    """The {"input_ids", "labels"} examples a batch was collated from: a padded batch's rows (their attended
    tokens), or the conversations of a packed row (cut at cu_seq_lens_q)."""
    ids, labels = batch["input_ids"].cpu(), batch["labels"].cpu()
    if "cu_seq_lens_q" in batch:
        bounds = batch["cu_seq_lens_q"].tolist()
        return [{"input_ids": ids[0, a:b].tolist(), "labels": labels[0, a:b].tolist()} for a, b in zip(bounds, bounds[1:])]
    lengths = batch["attention_mask"].sum(-1).tolist()
    return [{"input_ids": ids[i, :n].tolist(), "labels": labels[i, :n].tolist()} for i, n in enumerate(lengths)]


def last_reply_start(labels: Sequence[int]) -> int | None:
    """Where the example's last trained run of tokens (its last reply) starts; None when nothing trains."""
    end = next((i for i in range(len(labels) - 1, -1, -1) if labels[i] != IGNORE_INDEX), None)
    if end is None:
        return None
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return start


def sampled_examples(engine: Engine, examples: list[Example], params: SamplingParams) -> list[Example]:
    """Each example with its last reply replaced by the student's sample (the reply's tokens and the end-of-turn
    token that ended it, all trained); an example with nothing trained stays as it is."""
    starts = [last_reply_start(e["labels"]) for e in examples]
    asked = [i for i, start in enumerate(starts) if start]
    completions = engine.generate([examples[i]["input_ids"][:starts[i]] for i in asked], params)
    out = list(examples)
    for i, (completion, *_) in zip(asked, completions):
        prompt = examples[i]["input_ids"][:starts[i]]
        reply = completion.ids_with_stop
        out[i] = {"input_ids": prompt + reply, "labels": [IGNORE_INDEX] * len(prompt) + reply}
    return out


def on_policy_batch(model: torch.nn.Module, tokenizer: Any, batch: dict[str, Any], params: SamplingParams,
                    collate: Callable[[list[Example]], dict[str, Any]], synced: bool = False,
                    engine: Any = None) -> dict[str, Any]:
    """The batch collated again (by the run's own collator: padded or packed as the data's) with the student's
    replies, sampled in eval mode (no dropout) without gradients, by tunesmith's engine on `model`, or by `engine`
    (a vLLM server holding the student's weights: generation/vllm_client.py). `synced` under ZeRO-3: each of the
    student's forwards gathers its sharded weights from every rank, so a rank whose replies are done keeps
    stepping until all are (the engine's synced generation, as PPO's rollouts)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            engine = engine or Engine(model, tokenizer, synced=synced)
            examples = sampled_examples(engine, examples_of(batch), params)
    finally:
        model.train(was_training)
    return collate(examples)
