"""Muon against AdamW, each at its own best learning rate, on the same steps of the LoRA demo (docs/optimizers.md).

    .venv/bin/python -m benchmarks.muon_sweep [--steps 30] [--rates 1e-4,3e-4,1e-3,3e-3] [--optims adamw_torch,muon]
        [--tiny HIDDEN,LAYERS] [--out outputs/muon_sweep] [-- extra tunesmith sft flags, e.g. --finetuning_type full]

Each run: `tunesmith sft configs/sft_lora_demo.yaml --optim O --learning_rate R --max_steps N`, same seed, data
order and held-out split (15 conversations); prints the mean training loss of the last 5 logged steps and the
held-out loss at the end, one row a run, then each optimizer's best rate. --tiny: instead of the default model, a
random Llama of that width and depth (SmolLM2's architecture and tokenizer), made once in the output folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import ROOT
from tunesmith.sft.command import run as sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rates", default="1e-4,3e-4,1e-3,3e-3")
    parser.add_argument("--optims", default="adamw_torch,muon")
    parser.add_argument("--out", default="outputs/muon_sweep")
    parser.add_argument("--tiny", default=None, help="HIDDEN,LAYERS of a random Llama to train instead")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.tiny:
        hidden, layers = (int(x) for x in args.tiny.split(","))
        extra = ["--model_name_or_path", tiny_model(Path(args.out) / f"tiny-{hidden}x{layers}", hidden, layers), *extra]
    results = []
    for optim in args.optims.split(","):
        for rate in args.rates.split(","):
            out = Path(args.out) / f"{optim}-{rate}"
            trainer = sft([str(ROOT / "configs" / "sft_lora_demo.yaml"), "--optim", optim, "--learning_rate", rate,
                           "--max_steps", str(args.steps), "--logging_steps", "1", "--save_strategy", "no",
                           "--plot_loss", "false", "--report_to", "none", "--output_dir", str(out), *extra])
            train = [r["loss"] for r in trainer.state.log_history if "loss" in r]
            held_out = json.loads((out / "eval_results.json").read_text())["eval_loss"]
            row = {"optim": optim, "lr": float(rate), "first_loss": train[0], "last5_loss": sum(train[-5:]) / 5,
                   "eval_loss": held_out}
            results.append(row)
            print(json.dumps(row), flush=True)
    print("| --optim | --learning_rate | first step loss | last 5 steps' loss | held-out loss |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| `{r['optim']}` | {r['lr']:g} | {r['first_loss']:.3f} | {r['last5_loss']:.3f} | {r['eval_loss']:.3f} |")
    for optim in args.optims.split(","):
        best = min((r for r in results if r["optim"] == optim), key=lambda r: r["eval_loss"])
        print(f"best {optim}: lr {best['lr']:g}, held-out loss {best['eval_loss']:.3f}")


def tiny_model(path: Path, hidden: int, layers: int) -> str:
    """A random LlamaForCausalLM with the default model's tokenizer (as tests/helpers/tiny_models.py builds them), seed 0."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tunesmith.hparams import ModelArguments
    from tunesmith.models.default_model import ensure_default_model
    from tunesmith.models.loader import load_tokenizer

    if (path / "config.json").exists():
        return str(path)
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=str(ensure_default_model())))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


if __name__ == "__main__":
    main()
