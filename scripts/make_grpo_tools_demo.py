"""Write the tool-use GRPO demo task: multiplications a 135M model cannot do in its head (a three-digit number
times a two-digit one), to be answered with the calculator tool, with the reference answer in each row, as
data/demo/grpo_tools_train.jsonl and data/demo/grpo_tools_eval.jsonl (a held-out split: no question of it is in
the training file). Deterministic and offline: the same files on every run.

    python scripts/make_grpo_tools_demo.py      # -> data/demo/grpo_tools_{train,eval}.jsonl
    python scripts/make_grpo_tools_demo.py --out /tmp/demo

Rows: {"messages": [{"role": "user", "content": "What is 347 times 29?"}], "answer": "10063"}, read by
`--reward_funcs final_number` (tunesmith/data/reward_funcs.py) with `--tool_funcs
tunesmith.rl.tool_funcs:calculate` offering the calculator (configs/grpo_tools_demo.yaml).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_grpo_demo import write_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
TRAIN, HELD_OUT = 240, 60
# A few phrasings, so that the policy learns to read the numbers rather than one sentence.
QUESTIONS = ("What is {a} times {b}?", "Multiply {a} by {b}.", "How much is {a} * {b}?",
             "Compute the product of {a} and {b}.")


def questions() -> list[tuple[int, int, str]]:
    """TRAIN + HELD_OUT distinct (a, b, phrasing) with a in 100..999 and b in 11..99, neither a multiple of 10,
    drawn with a fixed seed."""
    rng = random.Random(SEED)
    seen: set[tuple[int, int]] = set()
    picked = []
    while len(picked) < TRAIN + HELD_OUT:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        if (a, b) not in seen and a % 10 and b % 10:  # no trailing zero: nothing to do by hand
            seen.add((a, b))
            picked.append((a, b, rng.choice(QUESTIONS)))
    return picked


def row(a: int, b: int, question: str) -> dict:
    return {"messages": [{"role": "user", "content": question.format(a=a, b=b)}], "answer": str(a * b)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "data" / "demo"), help="Folder for the two files.")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [row(*q) for q in questions()]
    write_jsonl(out / "grpo_tools_eval.jsonl", rows[:HELD_OUT])
    write_jsonl(out / "grpo_tools_train.jsonl", rows[HELD_OUT:])
    print(f"{out}/grpo_tools_train.jsonl: {TRAIN} rows; {out}/grpo_tools_eval.jsonl: {HELD_OUT} rows")


if __name__ == "__main__":
    main()
