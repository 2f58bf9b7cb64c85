"""Base model vs fine-tuned adapter, side by side, on held-out prompts.

    python -m tunesmith.evaluation.compare --adapter outputs/sft_demo --prompts data/demo/identity_heldout.jsonl

One model in memory: the base answers come from the same PeftModel with its adapter disabled.
Greedy decoding, so the comparison is repeatable.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int) -> str:
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": question}])])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def compare(args: CompareArguments) -> list[tuple[str, str, str]]:
    model, tokenizer = load_for_inference(inference_model_args(args.adapter))
    rows = []
    for row in read_rows(args.prompts):
        question = row.data.get("prompt")
        if not isinstance(question, str):
            raise row.error("expected a string", "prompt")
        tuned = greedy_answer(model, tokenizer, question, args.max_new_tokens)
        with model.disable_adapter():
            base = greedy_answer(model, tokenizer, question, args.max_new_tokens)
        rows.append((question, base, tuned))
    return rows


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
