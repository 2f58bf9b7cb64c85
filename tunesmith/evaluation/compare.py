"""Two models side by side on held-out prompts: by default the base model and the fine-tuned adapter on it,
or any model or adapter given as --baseline against the --model_name_or_path/--adapter_name_or_path one.
Where a prompt row holds the tool call it should get (`expected_call`: {"name", "arguments"}), the calls
each column makes are scored too.

    tunesmith compare --adapter_name_or_path outputs/sft_demo --data_path data/demo/identity_heldout.jsonl \\
        --count_word Tunesmith
    tunesmith compare --baseline outputs/sft_demo --adapter_name_or_path outputs/dpo_demo --data_path F

Each column renders the prompts with its own chat template and answers them through the generation
engine, greedily so that the comparison is repeatable (--num_beams for beam search). Base
vs adapter keeps one model in memory: the base answers come from the same model with its adapter off.
Columns are laid out by display width, so Chinese, Japanese and emoji line up. With --output_path, the same
comparison is written as compare.json there (what the web UI shows).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import wcwidth

from ..boundary import entry_point
from ..data.call_scores import score_calls
from ..data.prompts import Prompt, build_prompts
from ..generation import BASE, Engine, SamplingParams
from ..hparams import parse_run
from ..models.loader import inference_model_args, load_for_inference
from ..utils.io import atomic_write_json


def answers(engine: Engine, prompts: list[Prompt], params: SamplingParams, adapter: str | None = None) -> list[str]:
    """Each prompt, rendered as training renders it, answered by one column's model."""
    return [c[0].text.strip() for c in engine.generate([p.input_ids for p in prompts], params, adapter=adapter)]


def print_side_by_side(rows: list[tuple[str, str, str]], width: int, labels: tuple[str, str]) -> None:
    for question, left_text, right_text in rows:
        print(f"\nQ: {question}")
        left, right = wcwidth.wrap(left_text, width) or [""], wcwidth.wrap(right_text, width) or [""]
        print(f"  {wcwidth.ljust(labels[0], width)} | {labels[1]}")
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else ""
            b = right[i] if i < len(right) else ""
            print(f"  {wcwidth.ljust(a, width)} | {b}".rstrip())


def run(argv: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    args = parse_run("compare", argv, __doc__)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.compare.max_new_tokens, num_beams=args.compare.num_beams)
    model, tokenizer = load_for_inference(args.model)
    prompts = build_prompts(tokenizer, args.data, "eval")
    engine = Engine(model, tokenizer)
    tuned = answers(engine, prompts, params)
    if args.compare.baseline:
        baseline, baseline_tokenizer = load_for_inference(inference_model_args(args.compare.baseline))
        baseline_prompts = build_prompts(baseline_tokenizer, args.data, "eval")
        base = answers(Engine(baseline, baseline_tokenizer), baseline_prompts, params)
        labels = (_name(args.compare.baseline), _name(args.model.adapter_name_or_path or args.model.model_name_or_path))
    else:
        base = answers(engine, prompts, params, adapter=BASE)
        labels = ("base", "fine-tuned")
    rows = [(p.messages[-1]["content"], b, t) for p, b, t in zip(prompts, base, tuned)]
    print_side_by_side(rows, args.compare.width, labels)
    record: dict = {"base": {"label": labels[0]}, "tuned": {"label": labels[1]},  # as eval's compare.json names them
                    "rows": [{"question": q, "base": b, "tuned": t} for q, b, t in rows]}
    expected = [p.row.data.get("expected_call") for p in prompts]
    if all(isinstance(e, dict) for e in expected):
        record["tool_calls"] = {}
        for key, column, replies in (("base", labels[0], base), ("tuned", labels[1], tuned)):
            counts = record["tool_calls"][key] = score_calls(replies, expected)
            print(f"tool calls, {column}: " + ", ".join(f"{k.replace('_', ' ')} {v}/{len(rows)}" for k, v in counts.items()))
    word = args.compare.count_word
    if word:
        before = sum(word.lower() in b.lower() for b in base)
        after = sum(word.lower() in t.lower() for t in tuned)
        record["count_word"] = {"word": word, "base": before, "tuned": after}
        print(f"\nanswers containing {word!r}: {labels[0]} {before}/{len(rows)} -> {labels[1]} {after}/{len(rows)}")
    if args.compare.output_path:
        write_compare_json(args.compare.output_path, record)
    return rows


def write_compare_json(folder: str, record: dict) -> str:
    """compare.json in `folder`: {"base": {"label"}, "tuned": {"label"}: the columns, "rows": [{"question", "base",
    "tuned"}: the answers], and where counted "tool_calls" and "count_word"}."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "compare.json")
    atomic_write_json(path, record)
    return path


def _name(path: str | None) -> str:
    return os.path.basename(os.path.normpath(path)) if path else "model"


main = entry_point(run)
