"""Optimizer-state memory per trained parameter, measured: each `--optim` that runs on this machine trains one step
of `tunesmith sft` (full fine-tuning: every weight trains) and the bytes of its state tensors are summed
(train/optimizers.optimizer_state_bytes); the others print the line the parser refuses them with.

    .venv/bin/python -m benchmarks.optimizer_memory [--model DIR] [--optims adamw_torch,adamw_8bit,...]

Without --model: the default model (SmolLM2-135M-Instruct). docs/optimizers.md has the table this printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from transformers.training_args import OptimizerNames

from tunesmith.errors import ConfigError
from tunesmith.models.default_model import ensure_default_model
from tunesmith.sft.command import run as sft
from tunesmith.train.optimizers import optimizer_state_bytes, trained_parameters

ROWS = [[{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"It is {a + b}."}]
        for a in range(4) for b in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--optims", default=",".join(o.value for o in OptimizerNames))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    model = args.model or str(ensure_default_model())
    work = Path(tempfile.mkdtemp(prefix="optim-memory-"))
    data = work / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in ROWS))
    print(f"model {model}: one full fine-tuning step per --optim\n")
    print("| --optim | state bytes / trained parameter | state MiB | step s |\n|---|---|---|---|")
    for name in args.optims.split(","):
        extra = ["--optim_target_modules", "all-linear"] if name.startswith(("galore", "apollo")) else []
        start = time.perf_counter()
        try:
            trainer = sft(["--model_name_or_path", model, "--data_path", str(data), "--output_dir", str(work / name),
                           "--finetuning_type", "full", "--optim", name, "--max_steps", "1",
                           "--per_device_train_batch_size", "2", "--save_strategy", "no", "--plot_loss", "false",
                           "--report_to", "none", "--overwrite_output_dir", "true", *extra])
        except ConfigError as e:
            print(f"| `{name}` | refused: {e} | | |", flush=True)
            continue
        state = optimizer_state_bytes(trainer.optimizer)
        params = trained_parameters(trainer.model)
        print(f"| `{name}` | {state / params:.2f} | {state / 2**20:.0f} | {time.perf_counter() - start:.0f} |",
              flush=True)
        for path in sorted((work / name).rglob("*.safetensors")):
            path.unlink()  # a 538 MB save per optimizer would fill the disk
        del trainer


if __name__ == "__main__":
    sys.exit(main())
