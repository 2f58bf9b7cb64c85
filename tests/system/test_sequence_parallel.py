"""--sequence_parallel_size 2 on two CPU ranks (gloo, DeepSpeed ZeRO-2): a packed row cut in two trains as one rank
trains it whole. The runs take plain SGD at learning rate 1 with no clipping, so a LoRA weight after a step is the
start minus the gradient: B starts at zero, so after the first step B is minus B's gradient, and after the second A
has moved by minus A's gradient. Equal adapters and logged losses (1e-5) are equal gradients and losses.

transformers' own SP loss fails this under ZeRO-2 (every gradient twice the one-rank one), as does DeepSpeed's
attention wrapped around plain sdpa (causal across the packed conversations, no window): train/sequence_parallel.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.arch_models import architecture_config, build_architecture
from tests.helpers.tiny_models import build_tiny_model_dir
from tests.system.test_distributed import ROOT, launch
from tunesmith.errors import ConfigError

pytestmark = pytest.mark.distributed
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def conversation(words: int, seed: int) -> dict:
    text = " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(words))
    return {"messages": [{"role": "user", "content": f"Repeat after me {seed}: {text[:len(text) // 3]}"},
                         {"role": "assistant", "content": text}]}


def write_conversations(path: Path, lengths: list[int]) -> str:
    path.write_text("".join(json.dumps(conversation(n, seed)) + "\n" for seed, n in enumerate(lengths)))
    return str(path)


def sgd_flags(model_dir: str, data: str, out: Path, *extra: str) -> list[str]:
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--packing", "true",
            "--max_seq_length", "4096", "--optim", "sgd", "--learning_rate", "1", "--max_grad_norm", "0",
            "--lr_scheduler_type", "constant", "--lora_dropout", "0.0", "--seed", "0", "--bf16", "false",
            "--plot_loss", "false", "--report_to", "none", "--logging_steps", "1", *extra]


def one_rank(model_dir: str, data: str, out: Path, *extra: str) -> None:
    """The reference: the whole row in one process, without DeepSpeed."""
    from tunesmith.sft import command as sft

    sft.run(sgd_flags(model_dir, data, out, "--save_strategy", "no", *extra))


def two_ranks(model_dir: str, data: str, out: Path, *extra: str, config: str = "ds_zero2.json") -> None:
    launch("sft/train.py", 2, *sgd_flags(model_dir, data, out, "--sequence_parallel_size", "2",
                                         "--deepspeed", str(ROOT / "configs" / config), *extra))


def logged_losses(out: Path) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [r["loss"] for r in history if "loss" in r]


def assert_same_training(sp: Path, reference: Path, steps: int) -> None:
    assert logged_losses(sp) == pytest.approx(logged_losses(reference), rel=1e-5)
    assert len(logged_losses(sp)) == steps
    ours, theirs = (load_file(str(out / "adapter_model.safetensors")) for out in (sp, reference))
    assert ours.keys() == theirs.keys()
    for name, weight in theirs.items():
        torch.testing.assert_close(ours[name], weight, rtol=0, atol=1e-5, msg=name)
    assert all(w.abs().sum() > 0 for name, w in ours.items() if "lora_B" in name)  # trained
    if (reference / "eval_results.json").exists():  # evaluated whole on each rank, its pieces not cut
        evaluated = [json.loads((out / "eval_results.json").read_text())["eval_loss"] for out in (sp, reference)]
        assert evaluated[0] == pytest.approx(evaluated[1], rel=1e-5)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer) -> str:
    return build_tiny_model_dir(tmp_path_factory.mktemp("sp") / "llama", tokenizer, initializer_range=0.2,
                                max_position_embeddings=4096, head_dim=16)


# packed rows: two rows of two conversations a step (the step's loss is over both rows' tokens), two epochs
@pytest.mark.parametrize("lengths, batch, accumulation", [([1500], 1, 1), ([300, 520, 250, 410], 2, 2)],
                         ids=["one-conversation", "packed-rows"])
def test_two_sequence_parallel_ranks_train_a_row_as_one_rank_does(llama_dir, tmp_path, lengths, batch,
                                                                   accumulation):
    data = write_conversations(tmp_path / "data.jsonl", lengths)
    flags = ("--max_steps", "2", "--per_device_train_batch_size", str(batch),
             "--gradient_accumulation_steps", str(accumulation), "--eval_data_path", data)
    one_rank(llama_dir, data, tmp_path / "one", *flags)
    two_ranks(llama_dir, data, tmp_path / "two", "--save_strategy", "no", *flags)
    assert_same_training(tmp_path / "two", tmp_path / "one", steps=2)


def test_sequence_parallel_keeps_a_sliding_window_under_zero3(tmp_path, tokenizer):
    """Mistral attends within 16 tokens: across the ranks' all-to-all too. Under ZeRO-3, whose reduce-scatter
    divides the summed gradients by the whole world (ZeRO-2 by the data-parallel size)."""
    model_dir = build_architecture(tmp_path / "mistral", "mistral", tokenizer, max_position_embeddings=4096)
    data = write_conversations(tmp_path / "data.jsonl", [700, 300])
    flags = ("--max_steps", "2", "--per_device_train_batch_size", "2")
    one_rank(model_dir, data, tmp_path / "one", *flags)
    two_ranks(model_dir, data, tmp_path / "two", "--save_strategy", "no", *flags, config="ds_zero3.json")
    assert_same_training(tmp_path / "two", tmp_path / "one", steps=2)


def test_sequence_parallel_run_saves_and_resumes(llama_dir, tmp_path):
    """Stopped after a checkpoint and run again, it continues to where the uninterrupted one-rank run gets."""
    data = write_conversations(tmp_path / "data.jsonl", [900])
    one_rank(llama_dir, data, tmp_path / "one", "--max_steps", "2")
    out = tmp_path / "two"
    two_ranks(llama_dir, data, out, "--max_steps", "1", "--save_steps", "1")
    assert (out / "checkpoint-1" / "adapter_model.safetensors").exists()
    stderr = launch("sft/train.py", 2, *sgd_flags(llama_dir, data, out, "--sequence_parallel_size", "2", "--deepspeed",
                                                  str(ROOT / "configs/ds_zero2.json"), "--max_steps", "2",
                                                  "--save_steps", "1"))
    assert "checkpoint-1" in stderr  # resumed
    assert_same_training(out, tmp_path / "one", steps=2)


@pytest.mark.parametrize("flags, message", [
    (("--sequence_parallel_size", "2", "--packing", "true"), "--sequence_parallel_size 2 runs on DeepSpeed"),
    (("--sequence_parallel_size", "2", "--deepspeed", "configs/ds_zero2.json"), "needs --packing true"),
    (("--sequence_parallel_size", "0",), "--sequence_parallel_size must be at least 1"),
])
def test_sequence_parallel_refuses_what_cannot_combine(llama_dir, tmp_path, flags, message):
    from tunesmith.hparams import parse_run

    with pytest.raises(ConfigError, match=message):
        parse_run("sft", ["--model_name_or_path", llama_dir, "--data_path", str(ROOT / "data/demo/sft.jsonl"),
                          "--output_dir", str(tmp_path / "out"), *flags], None)


def test_a_row_is_cut_into_shards_that_keep_its_targets_and_boundaries():
    """An odd row on two ranks: padded by a conversation of one token that trains nothing; each shard's targets are
    the whole row's (the last token of the first shard predicts the first of the second)."""
    from tunesmith.data.collator import PackingCollator
    from tunesmith.train.sequence_parallel import PADDING_TOKEN, packed_row_shard

    examples = [{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}, {"input_ids": [9, 10, 11], "labels": [-100, -100, 11]}]
    row = PackingCollator(trained_logits_only=False)(examples)
    shards = [packed_row_shard(row, rank, 2, trained_logits_only=False) for rank in (0, 1)]
    assert [s["input_ids"].tolist() for s in shards] == [[[5, 6, 7, 8]], [[9, 10, 11, PADDING_TOKEN]]]
    assert [s["position_ids"].tolist() for s in shards] == [[[0, 1, 2, 3]], [[0, 1, 2, 0]]]
    assert [s["shift_labels"].tolist() for s in shards] == [[[6, 7, 8, -100]], [[-100, 11, -100, -100]]]
    assert all(s["cu_seq_lens_q"].tolist() == [0, 4, 7, 8] and s["max_length_q"] == 4 for s in shards)
    trained = [packed_row_shard(row, rank, 2, trained_logits_only=True) for rank in (0, 1)]
    assert [(s["logits_to_keep"].tolist(), s["shift_labels"].tolist()) for s in trained] == [([0, 1, 2], [6, 7, 8]),
                                                                                             ([1], [11])]


@pytest.mark.parametrize("name, size, message", [
    ("llama", 3, "llama has 4 attention heads and 2 key/value heads, and each rank attends with 1/3 of them"),
    ("qwen3_moe", 2, r"mixture-of-experts model \(qwen3_moe\): its router's load-balancing loss"),
])
def test_sequence_parallel_refuses_a_model_it_cannot_cut(tokenizer, name, size, message):
    from transformers import AutoModelForCausalLM

    from tunesmith.train.sequence_parallel import parallelism_config

    model = AutoModelForCausalLM.from_config(architecture_config(name, tokenizer))
    with pytest.raises(ConfigError, match=message):
        parallelism_config(size, model)
