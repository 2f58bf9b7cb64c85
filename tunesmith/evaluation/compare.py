"""Base model vs fine-tuned adapter, side by side, on held-out prompts.

    python -m tunesmith.evaluation.compare --adapter outputs/sft_demo --prompts data/demo/identity_heldout.jsonl

One model in memory: the base answers come from the same PeftModel with its adapter disabled.
Greedy decoding, so the comparison is repeatable; all prompts go through generate() as one
left-padded batch per model (the same answers as one at a time, a few times faster on a CPU).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import parse_args
from ..data.formats import read_rows
from ..data.template import encode_prompt
from ..models.loader import inference_model_args, load_for_inference


@dataclass
class CompareArguments:
    adapter: str = field(metadata={"help": "The fine-tuned LoRA adapter directory."})
    prompts: str = field(default="data/demo/identity_heldout.jsonl", metadata={"help": "JSONL of {\"prompt\": ...}."})
    max_new_tokens: int = field(default=48, metadata={"help": "Longest answer."})
    width: int = field(default=48, metadata={"help": "Column width when printing."})


@torch.no_grad()
def greedy_answers(model: Any, tokenizer: Any, questions: list[str], max_new_tokens: int) -> list[str]:
    """Each question as a one-turn chat, rendered like training renders it, answered greedily."""
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    batch = tokenizer.pad({"input_ids": prompts}, padding_side="left", return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, top_p=None, top_k=None,
                         temperature=None, pad_token_id=tokenizer.pad_token_id)
    width = batch["input_ids"].shape[1]
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]


def compare(args: CompareArguments) -> list[tuple[str, str, str]]:
    model, tokenizer = load_for_inference(inference_model_args(args.adapter))
    questions = []
    for row in read_rows(args.prompts):
        question = row.data.get("prompt")
        if not isinstance(question, str):
            raise row.error("expected a string", "prompt")
        questions.append(question)
    tuned = greedy_answers(model, tokenizer, questions, args.max_new_tokens)
    with model.disable_adapter():
        base = greedy_answers(model, tokenizer, questions, args.max_new_tokens)
    return list(zip(questions, base, tuned))


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


def main(argv: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    (args,) = parse_args((CompareArguments,), argv)
    rows = compare(args)
    print_side_by_side(rows, args.width)
    named = sum("tunesmith" in tuned.lower() for _, _, tuned in rows)
    named_before = sum("tunesmith" in base.lower() for _, base, _ in rows)
    print(f"\nanswers naming Tunesmith: base {named_before}/{len(rows)} -> fine-tuned {named}/{len(rows)}")
    return rows


if __name__ == "__main__":
    main()
