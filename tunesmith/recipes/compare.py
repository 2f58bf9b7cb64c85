"""Base model vs fine-tuned adapter, side by side, on held-out prompts. Where a prompt row holds the
tool call it should get (`expected_call`: {"name", "arguments"}), the calls each column makes are
scored too.

    tunesmith compare --adapter_name_or_path outputs/sft_demo --data_path data/demo/identity_heldout.jsonl \
        --count_word Tunesmith

One model in memory: the base answers come from the same PeftModel with its adapter disabled.
Greedy decoding, so the comparison is repeatable; all prompts go through generate() as one
left-padded batch per model (the same answers as one at a time, a few times faster on a CPU).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

import torch

from ..boundary import entry_point
from ..data.prompts import Prompt, build_prompts
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


def first_call(text: str) -> dict | None:
    """The first JSON object with a string `name` in a reply (how every tool-call format writes it)."""
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            return value
    return None


def score_calls(answers: list[str], expected: list[dict]) -> dict[str, int]:
    """How many replies hold a well-formed call (a JSON object with a name and object arguments), the
    expected function, and the expected arguments too."""
    counts = {"well_formed": 0, "right_function": 0, "right_arguments": 0}
    for answer, want in zip(answers, expected):
        call = first_call(answer)
        if call is None or not isinstance(call.get("arguments", {}), dict):
            continue
        counts["well_formed"] += 1
        if call["name"] == want["name"]:
            counts["right_function"] += 1
            counts["right_arguments"] += _same(call.get("arguments", {}), want.get("arguments", {}))
    return counts


def _same(got: dict, want: dict) -> bool:
    """Equal arguments, numbers compared as numbers (5 == 5.0)."""
    return got.keys() == want.keys() and all(
        float(got[k]) == float(want[k]) if isinstance(want[k], int | float) and isinstance(got[k], int | float)
        else got[k] == want[k] for k in want)


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
    model, tokenizer = load_for_inference(args.model)
    prompts = build_prompts(tokenizer, args.data, "eval")
    rows = compare(model, tokenizer, prompts, args.compare.max_new_tokens)
    print_side_by_side(rows, args.compare.width)
    expected = [p.row.data.get("expected_call") for p in prompts]
    if all(isinstance(e, dict) for e in expected):
        for column, answers in (("base", [b for _, b, _ in rows]), ("fine-tuned", [t for _, _, t in rows])):
            counts = score_calls(answers, expected)
            print(f"tool calls, {column}: " + ", ".join(f"{k.replace('_', ' ')} {v}/{len(rows)}" for k, v in counts.items()))
    word = args.compare.count_word
    if word:
        before = sum(word.lower() in base.lower() for _, base, _ in rows)
        after = sum(word.lower() in tuned.lower() for _, _, tuned in rows)
        print(f"\nanswers containing {word!r}: base {before}/{len(rows)} -> fine-tuned {after}/{len(rows)}")
    return rows


main = entry_point(run)
