"""Evaluation during training, in every Trainer stage: with evaluation data (--eval_data_path or --val_size)
evaluation follows the checkpoints and runs once more at the end; SFT's eval_loss is the mean loss per
predicted token of the whole set and eval_perplexity its exp (checked against the saved model scored
here), reward and DPO log eval_accuracy and eval_margin; --load_best_model_at_end picks by them; the
settings that cannot evaluate are refused or said in one line."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.rows import POLITE, RUDE, write_jsonl
from tunesmith.constants import IGNORE_INDEX, LOSS_PLOT_FILE
from tunesmith.data.dataset import build_sft_datasets
from tunesmith.errors import ConfigError
from tunesmith.hparams import parse_run
from tunesmith.preference import command as dpo
from tunesmith.preference import reward
from tunesmith.sft import command as sft
from tunesmith.train.callbacks import logged_series

# Replies of very different lengths, so that a mean of per-batch means is not the mean per token.
CONVERSATIONS = [
    [{"role": "user", "content": f"Count to {n} in words, please."},
     {"role": "assistant", "content": " ".join(["one", "two", "three", "four", "five", "six"] * 4)[: 6 * n + 3]}]
    for n in range(1, 17)
]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> str:
    return write_jsonl(tmp_path_factory.mktemp("data") / "sft.jsonl", [{"messages": c} for c in CONVERSATIONS])


def sft_flags(model_dir: str, data: str, out, *extra: str) -> list[str]:
    """Four LoRA steps on the tiny model, a checkpoint every two, float32 (what the scoring below uses)."""
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--max_steps", "4",
            "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "2", "--learning_rate", "1e-2",
            "--save_steps", "2", "--logging_steps", "1", "--bf16", "false", "--report_to", "none",
            "--plot_loss", "false", "--seed", "0", *extra]


def evaluations(log_history: list[dict], key: str = "eval_loss") -> list[dict]:
    return [r for r in log_history if key in r]


def token_nll(model, rows) -> tuple[float, int, list[float]]:
    """(summed -log p of every predicted trained token, their count, each row's mean), one row at a time."""
    total, count, means = 0.0, 0, []
    with torch.no_grad():
        for row in rows:
            ids, labels = torch.tensor([row["input_ids"]]), torch.tensor(row["labels"])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
            trained = labels[1:] != IGNORE_INDEX
            nll = -logp[trained].gather(-1, labels[1:][trained][:, None]).sum().item()
            total, count = total + nll, count + int(trained.sum())
            means.append(nll / int(trained.sum()))
    return total, count, means


@pytest.mark.parametrize("packing", ["false", "true"])
def test_sft_evaluates_at_each_checkpoint_and_at_the_end(tiny_model_dir, tokenizer, sft_data, tmp_path, packing):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sft"
    trainer = sft.run(sft_flags(tiny_model_dir, sft_data, out, "--val_size", "0.25", "--packing", packing,
                                "--plot_loss", "true"))

    # Evaluated at the checkpoints (steps 2 and 4) and once more at the end, each record with both metrics.
    state = json.loads((out / "trainer_state.json").read_text())
    records = evaluations(state["log_history"])
    assert [r["step"] for r in records] == [2, 4, 4]
    for record in records:
        assert record["eval_perplexity"] == pytest.approx(math.exp(record["eval_loss"]), rel=1e-9)
    assert records[2]["eval_loss"] == pytest.approx(records[1]["eval_loss"], rel=1e-6)  # the same model
    results = json.loads((out / "eval_results.json").read_text())
    assert results["eval_perplexity"] == records[2]["eval_perplexity"]
    # The loss plot has the evaluation points beside the training loss.
    assert (out / LOSS_PLOT_FILE).is_file()
    plotted = logged_series(state["log_history"], ("loss", "eval_loss"))
    assert [[step for step, _ in points] for points in plotted.values()] == [[1, 2, 3, 4], [2, 4, 4]]

    # The held-out rows are a seeded draw: the same seed, the same rows; another seed, others.
    data = parse_run("sft", sft_flags(tiny_model_dir, sft_data, out, "--val_size", "0.25"), check_paths=False).data
    _, again = build_sft_datasets(tokenizer, data, seed=0)
    _, other = build_sft_datasets(tokenizer, data, seed=1)
    assert len(again) == 4 and again["input_ids"] == trainer.eval_dataset["input_ids"]
    assert other["input_ids"] != again["input_ids"]

    # eval_loss is the saved model's mean loss per predicted token over the held-out rows, not a mean of means.
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out)).eval()
    total, count, row_means = token_nll(model, again)
    assert results["eval_loss"] == pytest.approx(total / count, rel=1e-5)
    assert results["eval_perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)
    assert abs(sum(row_means) / len(row_means) - total / count) > 1e-3 * total / count  # the test can tell

    # Evaluation batches are not counted as trained tokens: after step 3 (one epoch) every training row, once.
    trained = sum(sum(label != IGNORE_INDEX for label in row["labels"]) for row in trainer.train_dataset)
    assert [r["trained_tokens"] for r in state["log_history"] if r.get("step") == 3 and "loss" in r] == [trained]


def test_eval_strategy_no_evaluates_once_at_the_end_and_says_so(tiny_model_dir, sft_data, tmp_path, caplog):
    out = tmp_path / "sft"
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        trainer = sft.run(sft_flags(tiny_model_dir, sft_data, out, "--eval_data_path", sft_data,
                                    "--eval_strategy", "no", "--max_steps", "2"))
    notes = [r.getMessage() for r in caplog.records if "--eval_strategy no" in r.getMessage()]
    assert notes == ["--eval_strategy no: the evaluation data is evaluated once, at the end of training; leave the "
                     "flag out to evaluate at every checkpoint too, or give --eval_strategy steps --eval_steps N"]
    assert [r["step"] for r in evaluations(trainer.state.log_history)] == [2]  # not at the checkpoint, at the end
    assert "eval_perplexity" in json.loads((out / "eval_results.json").read_text())


def test_without_checkpoints_evaluation_runs_at_the_end_only(tiny_model_dir, sft_data, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        trainer = sft.run(sft_flags(tiny_model_dir, sft_data, tmp_path / "sft", "--val_size", "0.25",
                                    "--save_strategy", "no", "--max_steps", "2"))
    assert [r["step"] for r in evaluations(trainer.state.log_history)] == [2]
    assert any(r.getMessage().startswith("evaluation data: evaluated once, at the end (--save_strategy no")
               for r in caplog.records)


@pytest.mark.parametrize("flags, message", [
    (["--eval_strategy", "steps"], r"^--eval_strategy steps has no evaluation data to evaluate: give --eval_data_path "
                                   r"FILE or --val_size 0.1 \(a held-out share of --data_path\), or drop --eval_strategy\.$"),
    (["--eval_strategy", "epoch"], r"^--eval_strategy epoch has no evaluation data"),
    (["--load_best_model_at_end", "true"], r"^--load_best_model_at_end picks the checkpoint with the best evaluation "
                                           r"metric: give evaluation data \(--eval_data_path FILE or --val_size 0.1\)"),
    (["--val_size", "0.1", "--eval_data_path", "e.jsonl"], r"^--val_size 0.1 and --eval_data_path both give evaluation "
                                                           r"data: keep one"),
    # transformers' own checks, on one line
    (["--val_size", "0.1", "--load_best_model_at_end", "true", "--eval_strategy", "no"],
     r"^--load_best_model_at_end requires the save and eval strategy to match.* Evaluation strategy: "
     r"IntervalStrategy.NO - Save strategy: SaveStrategy.STEPS$"),
    (["--val_size", "0.1", "--load_best_model_at_end", "true", "--save_steps", "3", "--eval_steps", "2"],
     r"^--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation steps"),
])
def test_settings_that_cannot_evaluate_are_refused_in_one_line(flags, message):
    with pytest.raises(ConfigError, match=message) as refused:
        parse_run("sft", ["--data_path", "x.jsonl", *flags], check_paths=False)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("flags, expected", [
    ([], ("no", None)),
    (["--val_size", "0.1"], ("steps", 100)),  # the checkpoints' schedule
    (["--val_size", "0.1", "--save_steps", "20"], ("steps", 20)),
    (["--val_size", "0.1", "--save_strategy", "epoch"], ("epoch", None)),
    (["--val_size", "0.1", "--save_strategy", "no"], ("no", None)),
    (["--val_size", "0.1", "--eval_strategy", "steps"], ("steps", 100)),
    (["--val_size", "0.1", "--eval_strategy", "steps", "--eval_steps", "7"], ("steps", 7)),
    (["--eval_data_path", "e.jsonl", "--eval_strategy", "no"], ("no", None)),
])
def test_the_evaluation_schedule_follows_the_checkpoints_unless_given(flags, expected):
    training = parse_run("sft", ["--data_path", "x.jsonl", *flags], check_paths=False).training
    assert (training.eval_strategy.value, training.eval_steps) == expected


@pytest.mark.parametrize("metric, greater", [("eval_perplexity", False), ("perplexity", False), ("loss", False),
                                             ("accuracy", True), ("eval_margin", True)])
def test_perplexity_and_loss_are_better_lower(metric, greater):
    training = parse_run("reward", ["--data_path", "x.jsonl", "--val_size", "0.2", "--load_best_model_at_end", "true",
                                    "--metric_for_best_model", metric], check_paths=False).training
    assert training.greater_is_better is greater


def test_deprecated_eval_split_ratio_still_holds_out(tmp_path, caplog):
    config = tmp_path / "run.yaml"
    config.write_text("data_path: x.jsonl\neval_split_ratio: 0.2\n")
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        flag = parse_run("sft", ["--data_path", "x.jsonl", "--eval_split_ratio", "0.3"], check_paths=False)
        key = parse_run("sft", [str(config)], check_paths=False)
    assert (flag.data.val_size, key.data.val_size) == (0.3, 0.2)
    assert flag.training.eval_strategy == "steps"  # and it turns evaluation on, as --val_size does
    assert "command line: --eval_split_ratio is deprecated, use --val_size" in caplog.text
    assert f"run config {config}:2: --eval_split_ratio is deprecated, use --val_size" in caplog.text


def test_load_best_model_at_end_keeps_the_checkpoint_of_lowest_perplexity(tiny_model_dir, sft_data, tmp_path):
    # A learning rate far too high for full fine-tuning: the first steps help, the later ones overshoot.
    out = tmp_path / "sft"
    trainer = sft.run(sft_flags(tiny_model_dir, sft_data, out, "--val_size", "0.25", "--finetuning_type", "full",
                                "--learning_rate", "0.2", "--lr_scheduler_type", "constant",
                                "--load_best_model_at_end", "true", "--metric_for_best_model", "eval_perplexity",
                                "--save_total_limit", "1"))
    at_step = {r["step"]: r["eval_perplexity"] for r in evaluations(trainer.state.log_history)[:2]}
    assert at_step[2] < at_step[4]  # the best checkpoint is not the last
    assert trainer.state.best_model_checkpoint == str(out / "checkpoint-2")
    assert trainer.state.best_metric == at_step[2]
    best, final = load_file(str(out / "checkpoint-2" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert best.keys() == final.keys() and all(torch.equal(best[k], final[k]) for k in best)
    end = json.loads((out / "eval_results.json").read_text())["eval_perplexity"]
    assert end == pytest.approx(at_step[2], rel=1e-6)


# ---- reward model and DPO ----

@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("pairs")
    questions = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice."]
    train = [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]} for i, q in enumerate(questions * 2)]
    held_out = [{"prompt": "How are you?", "chosen": POLITE[0], "rejected": RUDE[1]},
                {"prompt": "Tell me a joke.", "chosen": POLITE[2], "rejected": RUDE[2]}]
    return {"train": write_jsonl(folder / "train.jsonl", train), "eval": write_jsonl(folder / "eval.jsonl", held_out)}


@pytest.mark.parametrize("stage", [reward, dpo], ids=["reward", "dpo"])
def test_preference_stages_log_accuracy_and_margin_during_training(stage, tiny_model_dir, pairs, tmp_path):
    out = tmp_path / "run"
    trainer = stage.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", pairs["train"], "--eval_data_path", pairs["eval"],
        "--output_dir", str(out), "--lora_r", "8", "--lora_alpha", "16", "--max_seq_length", "64",
        "--per_device_train_batch_size", "4", "--max_steps", "4", "--save_steps", "2", "--learning_rate", "5e-3",
        "--logging_steps", "1", "--report_to", "none", "--plot_loss", "false"])
    records = evaluations(trainer.state.log_history, "eval_accuracy")
    assert [r["step"] for r in records] == [2, 4, 4]
    for record in records:
        assert record["eval_accuracy"] in (0.0, 0.5, 1.0) and math.isfinite(record["eval_margin"])
    assert records[0]["eval_margin"] != records[1]["eval_margin"]  # the model moved between the checkpoints
    assert records[2]["eval_margin"] == pytest.approx(records[1]["eval_margin"], abs=1e-6)  # and not after
    assert json.loads((out / "eval_results.json").read_text())["eval_margin"] == records[2]["eval_margin"]


def test_every_trainer_stage_keeps_its_metrics_file_in_step_with_the_trainer_state(tiny_model_dir, sft_data, tmp_path):
    """output_dir/metrics.jsonl: every logged record (training and evaluation) as it is logged; after a
    resume, the records up to the checkpoint and then the new ones, never the killed run's repeated."""
    from tunesmith.constants import METRICS_FILE

    out = tmp_path / "sft"
    flags = sft_flags(tiny_model_dir, sft_data, out, "--val_size", "0.25")
    first = sft.run([*flags[:flags.index("--max_steps") + 1], "3", *flags[flags.index("--max_steps") + 2:]])
    lines = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert lines == first.state.log_history
    assert {r["step"] for r in lines if "eval_loss" in r} == {2, 3} and lines[-1]["step"] == 3

    # The same command with more steps resumes from checkpoint-2: the run's records after step 2 (step 3 and
    # its end evaluation) are not in that checkpoint's state, so they must not stay in the file either.
    resumed = sft.run(flags)
    again = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert again == resumed.state.log_history
    assert [r["step"] for r in again if "loss" in r] == [1, 2, 3, 4]
