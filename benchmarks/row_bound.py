"""What one huge row costs the data step: peak memory (over the process with its tokenizer loaded) and time, for an
SFT conversation, a DPO pair, a KTO row and a `tunesmith pt` .txt document of a given size, each built into its
tokenized dataset as the run builds it (data/dataset.py's build_dataset, a fresh cache), in its own subprocess.

    .venv/bin/python -m benchmarks.row_bound [--mb 60] [--kinds sft,dpo,kto,pt] [--max_seq_length 1024]
        [--model DIR]

The row is the one of issue 64: a single user turn `"x " * (mb * 500_000)` (mb MB) and a short reply (a pair: two
short replies; pt: the same text as one .txt document). Peak memory is the child's ru_maxrss after the build minus
its ru_maxrss once the tokenizer and the data modules are loaded (the run's own peak is higher still: its model)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import child_env

CHILD = r"""
import json, logging, os, resource, sys, time
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(message)s")
kind, folder, model, max_seq_length = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
from tunesmith.hparams import ModelArguments
from tunesmith.models.loader import load_tokenizer
tokenizer = load_tokenizer(ModelArguments(model_name_or_path=model))
from tunesmith.data.dataset import SFT_CONVERSATIONS, build_dataset
from tunesmith.data.preference import PREFERENCE_PAIRS
from tunesmith.data.unpaired import JUDGED_REPLIES
from tunesmith.hparams import SFTDataArguments, TrainDataArguments
from tunesmith.pretrain.args import PretrainDataArguments
from tunesmith.pretrain.documents import text_kind
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before = rss_mb()
start = time.perf_counter()
error = None
try:
    if kind == "pt":
        args = PretrainDataArguments(data_path=[str(folder / "doc.txt")], max_seq_length=max_seq_length)
        dataset = build_dataset(text_kind(args), tokenizer, args.data_path, args)
    else:
        data_kind = {"sft": SFT_CONVERSATIONS, "dpo": PREFERENCE_PAIRS, "kto": JUDGED_REPLIES}[kind]
        arguments = SFTDataArguments if kind == "sft" else TrainDataArguments
        args = arguments(data_path=[str(folder / "rows.jsonl")], max_seq_length=max_seq_length)
        dataset = build_dataset(data_kind, tokenizer, args.data_path, args)
    outcome = f"{len(dataset)} records"
except Exception as e:  # the run's own outcome (nothing kept: exit 2), reported as it is
    outcome = f"{type(e).__name__}: {str(e)[:120]}"
print(json.dumps({"seconds": time.perf_counter() - start, "peak_mb_over_tokenizer": rss_mb() - before,
                  "tokenizer_mb": before, "outcome": outcome}))
"""


def write_data(kind: str, folder: Path, mb: float) -> None:
    text = "x " * int(mb * 500_000)
    if kind == "pt":
        (folder / "doc.txt").write_text(text, encoding="utf-8")
        return
    short = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
    if kind == "sft":
        rows = [{"messages": short}, {"messages": [{"role": "user", "content": text},
                                                   {"role": "assistant", "content": "Hi!"}]}]
    elif kind == "dpo":
        rows = [{"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No."},
                {"prompt": text, "chosen": "Hi!", "rejected": "No."}]
    else:
        rows = [{"prompt": "Say hi.", "completion": "Hi!", "label": True},
                {"prompt": text, "completion": "Hi!", "label": False}]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=60)
    parser.add_argument("--kinds", default="sft,dpo,kto,pt")
    parser.add_argument("--max_seq_length", type=int, default=1024)
    parser.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M)")
    args = parser.parse_args()
    if args.model is None:
        from tunesmith.models.default_model import ensure_default_model

        args.model = str(ensure_default_model())
    for kind in args.kinds.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_data(kind, folder, args.mb)
            env = child_env(TUNESMITH_CACHE=str(folder / "cache"), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                            HF_HUB_OFFLINE="1")
            done = subprocess.run([sys.executable, "-c", CHILD, kind, str(folder), args.model,
                                   str(args.max_seq_length)], env=env, capture_output=True, text=True)
            result = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-600:]
            print(f"{kind} {args.mb:g} MB, --max_seq_length {args.max_seq_length}: {result}", flush=True)


if __name__ == "__main__":
    main()
