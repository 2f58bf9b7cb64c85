"""Quantization-aware training against quantizing afterwards, on the default model and the demo data: held-out loss
of the same SFT run trained without and with --qat, each then quantized the same way (torchao's scheme), against
the unquantized model (docs/sft.md, "Quantization-aware training", reports its output).

    python -m benchmarks.qat_compare [--scheme int8_int4|int4] [--finetuning_type full|lora] [--steps 30] [--batch_size 4]

Both runs share every flag (seed, data order, steps, learning rate); the QAT run's quantized model is read back
from its output_dir/quantized/ as a user would load it. The held-out rows are --val_size's (the same rows in both
runs); the loss is the mean over their trained tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

from tunesmith.models.qat import QUANTIZED_DIR, quantized_copy
from tunesmith.sft.command import run


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, trainer) -> float:
    """Mean cross-entropy over the held-out rows' trained tokens (labels shifted as the model's own loss does)."""
    model.eval()
    total, tokens = 0.0, 0
    for batch in trainer.get_eval_dataloader():
        labels = batch.pop("labels")
        logits = model(**batch).logits[:, :-1].float()
        target = labels[:, 1:]
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100,
                                                   reduction="sum").item()
        tokens += int((target != -100).sum())
    return total / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheme", default="int8_int4", choices=["int8_int4", "int4"])
    parser.add_argument("--finetuning_type", default="full", choices=["full", "lora"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--learning_rate", type=float, default=None, help="default: 1e-5 full, 2e-4 lora")
    parser.add_argument("--group_size", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--max_seq_length", type=int, default=512)
    parser.add_argument("--val_size", default="0.1", help="the held-out share of the demo rows")
    parser.add_argument("--output_dir", default=None, help="default: a temporary folder")
    cli = parser.parse_args()
    lr = cli.learning_rate or (1e-5 if cli.finetuning_type == "full" else 2e-4)
    root = cli.output_dir or tempfile.mkdtemp(prefix="qat_compare_")
    common = ["--data_path", "data/demo/sft.jsonl", "--val_size", cli.val_size, "--finetuning_type", cli.finetuning_type,
              "--max_steps", str(cli.steps), "--per_device_train_batch_size", str(cli.batch_size),
              "--per_device_eval_batch_size", "8", "--learning_rate", str(lr),
              "--lora_dropout", "0", "--max_seq_length", str(cli.max_seq_length), "--save_strategy", "no", "--eval_strategy", "no",
              "--plot_loss", "false", "--report_to", "none", "--seed", "0", "--overwrite_output_dir", "true"]

    start = time.perf_counter()
    plain = run(common + ["--output_dir", os.path.join(root, "plain")])
    plain_model = plain.accelerator.unwrap_model(plain.model)
    results = {"trained without QAT, unquantized": held_out_loss(plain_model, plain),
               "trained without QAT, then quantized": held_out_loss(
                   quantized_copy(plain_model, cli.scheme, cli.group_size), plain)}
    if cli.finetuning_type == "lora":  # the untrained default model on the same rows
        with plain_model.disable_adapter():
            results["default model (untrained), unquantized"] = held_out_loss(plain_model, plain)
    del plain_model

    qat_dir = os.path.join(root, "qat")
    qat = run(common + ["--output_dir", qat_dir, "--qat", cli.scheme, "--qat_group_size", str(cli.group_size)])
    results["trained with QAT, fake-quantized (its training forward)"] = held_out_loss(
        qat.accelerator.unwrap_model(qat.model), qat)
    served = AutoModelForCausalLM.from_pretrained(os.path.join(qat_dir, QUANTIZED_DIR))
    results["trained with QAT, quantized (output_dir/quantized, reloaded)"] = held_out_loss(served, qat)

    unquantized = results["trained without QAT, unquantized"]
    gap_ptq = results["trained without QAT, then quantized"] - unquantized
    gap_qat = results["trained with QAT, quantized (output_dir/quantized, reloaded)"] - unquantized
    print(json.dumps({"scheme": cli.scheme, "finetuning_type": cli.finetuning_type, "steps": cli.steps,
                      "val_size": cli.val_size, "batch_size": cli.batch_size, "max_seq_length": cli.max_seq_length, "learning_rate": lr, "group_size": cli.group_size, "held_out_loss": results,
                      "gap_without_qat": gap_ptq, "gap_with_qat": gap_qat,
                      "gap_recovered": (gap_ptq - gap_qat) / gap_ptq if gap_ptq else None,
                      "seconds": round(time.perf_counter() - start)}, indent=2))


if __name__ == "__main__":
    main()
