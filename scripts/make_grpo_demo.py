"""Write the GRPO demo task: small additions whose reply must end with the line `Answer: <number>`, with the
reference answer in each row, as data/demo/grpo_train.jsonl and data/demo/grpo_eval.jsonl (a held-out split:
no question of it is in the training file). Deterministic and offline: the same files on every run.

    python scripts/make_grpo_demo.py            # -> data/demo/grpo_{train,eval}.jsonl
    python scripts/make_grpo_demo.py --out /tmp/demo

Rows: {"messages": [{"role": "user", "content": "Add 7 and 5. ..."}], "answer": "12"} -- the shape
`--reward_funcs exact_answer answer_format` reads (tunesmith/data/reward_funcs.py).
Why this task: SmolLM2-135M-Instruct mostly knows these sums but rarely states them in the asked
format, and it gets some right in that format from the start, so GRPO's groups hold both rewarded and
unrewarded replies and a few minutes on a CPU can move the held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
HELD_OUT = 60  # questions in grpo_eval.jsonl; the rest train
QUESTION = 'Add {a} and {b}. End your reply with the line "Answer: N", where N is the sum.'


def questions() -> list[tuple[int, int]]:
    """Every (a, b) with a in 1..20 and b in 1..9, shuffled with a fixed seed."""
    pairs = [(a, b) for a in range(1, 21) for b in range(1, 10)]
    random.Random(SEED).shuffle(pairs)
    return pairs


def row(a: int, b: int) -> dict:
    return {"messages": [{"role": "user", "content": QUESTION.format(a=a, b=b)}], "answer": str(a + b)}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "data" / "demo"), help="Folder for the two files.")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = questions()
    write_jsonl(out / "grpo_eval.jsonl", [row(a, b) for a, b in pairs[:HELD_OUT]])
    write_jsonl(out / "grpo_train.jsonl", [row(a, b) for a, b in pairs[HELD_OUT:]])
    print(f"{out}/grpo_train.jsonl: {len(pairs) - HELD_OUT} rows; {out}/grpo_eval.jsonl: {HELD_OUT} rows")


if __name__ == "__main__":
    main()
