"""Base model vs fine-tuned adapter, side by side, on held-out prompts.

    tunesmith compare --adapter_name_or_path outputs/sft_demo --data_path data/demo/identity_heldout.jsonl \
        --count_word Tunesmith

One model in memory: the base answers come from the same PeftModel with its adapter disabled.
Greedy decoding, so the comparison is repeatable; all prompts go through generate() as one
left-padded batch per model (the same answers as one at a time, a few times faster on a CPU).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import torch

from ..boundary import entry_point
from ..data.prompts import Prompt, build_prompts
from ..errors import ConfigError
from ..hparams import parse_run
from ..models.loader import load_for_inference


@torch.no_grad()
def greedy_answers(model: Any, tokenizer: Any, prompts: list[Prompt], max_new_tokens: int) -> list[str]:
    """Each prompt rendered like training renders it, answered greedily."""
    batch = tokenizer.pad({"input_ids": [list(p.input_ids) for p in prompts]}, padding_side="left",
                          return_tensors="pt").to(model.device)
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, top_p=None, top_k=None,
                         temperature=None, pad_token_id=tokenizer.pad_token_id)
    width = batch["input_ids"].shape[1]
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]


def compare(model: Any, tokenizer: Any, prompts: list[Prompt], max_new_tokens: int) -> list[tuple[str, str, str]]:
    """(question, base answer, fine-tuned answer) per prompt."""
    tuned = greedy_answers(model, tokenizer, prompts, max_new_tokens)
    with model.disable_adapter():
        base = greedy_answers(model, tokenizer, prompts, max_new_tokens)
    return [(p.messages[-1]["content"], b, t) for p, b, t in zip(prompts, base, tuned)]


def print_side_by_side(rows: list[tuple[str, str, str]], width: int) -> None:
    for question, base, tuned in rows:
        print(f"\nQ: {question}")
        left = textwrap.wrap(base, width) or [""]
        right = textwrap.wrap(tuned, width) or [""]
        print(f"  {'base model':<{width}} | fine-tuned")
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else ""
            b = right[i] if i < len(right) else ""
            print(f"  {a:<{width}} | {b}")


def run(argv: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    args = parse_run("compare", argv, __doc__)
    if not args.model.adapter_name_or_path:
        raise ConfigError("--adapter_name_or_path is required: the fine-tuned LoRA adapter to compare with its base")
    model, tokenizer = load_for_inference(args.model)
    prompts = build_prompts(tokenizer, args.data, "eval")
    rows = compare(model, tokenizer, prompts, args.compare.max_new_tokens)
    print_side_by_side(rows, args.compare.width)
    word = args.compare.count_word
    if word:
        before = sum(word.lower() in base.lower() for _, base, _ in rows)
        after = sum(word.lower() in tuned.lower() for _, _, tuned in rows)
        print(f"\nanswers containing {word!r}: base {before}/{len(rows)} -> fine-tuned {after}/{len(rows)}")
    return rows


main = entry_point(run)
