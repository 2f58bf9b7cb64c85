"""A few SFT steps on a tiny random Llama with the real tokenizer: full, LoRA, QLoRA 4-bit and 8-bit;
loss is finite, trainable weights move, frozen ones stay bit-identical; resume continues the run."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest
import torch
from safetensors.torch import load_file

from tunesmith.sft.command import run as sft_main

CONVERSATIONS = [
    [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
     {"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "You're welcome."}]
    for a in range(4) for b in range(4)
]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    return str(path)


def sft_flags(model_dir, data, out, *extra: str) -> list[str]:
    """A short LoRA run on the tiny model (later flags override earlier ones)."""
    return [
        "--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
        "--max_steps", "3", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
        "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", *extra,
    ]


def run_sft(model_dir, data, out, *extra: str):
    return sft_main(sft_flags(model_dir, data, out, *extra))


def losses(trainer) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


def test_lora_moves_adapters_and_keeps_base(tiny_model_dir, sft_data, tmp_path):
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    trainer = run_sft(tiny_model_dir, sft_data, tmp_path / "out")
    assert all(math.isfinite(x) for x in losses(trainer)) and len(losses(trainer)) == 3
    state = trainer.model.state_dict()
    lora_b = {k: v for k, v in state.items() if "lora_B" in k}
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b.values())  # B starts at zero
    frozen = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
              for k, v in state.items() if "lora_" not in k}
    compared = [k for k in base if k in frozen]
    assert len(compared) == len(base) - ("lm_head.weight" in base)
    # --bf16 auto loads a LoRA base in bf16 where the CPU computes it natively: unchanged, in that dtype
    base_dtype = torch.bfloat16 if trainer.args.bf16 else torch.float32
    for key in compared:
        assert frozen[key].dtype == base_dtype and torch.equal(frozen[key], base[key].to(base_dtype)), key
    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert saved and all(t.numel() > 0 for t in saved.values())
    assert (tmp_path / "out" / "tunesmith_config.json").exists()
    assert trainer.state.log_history[0]["trained_tokens"] > 0


def test_full_finetune_moves_every_weight(tiny_model_dir, sft_data, tmp_path):
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    trainer = run_sft(tiny_model_dir, sft_data, tmp_path / "out", "--finetuning_type", "full")
    state = trainer.model.state_dict()
    moved = [k for k in base if not torch.equal(state[k], base[k])]
    assert len(moved) == len(base)
    reloaded = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(reloaded["model.norm.weight"], state["model.norm.weight"])


@pytest.mark.parametrize("bits", [4, 8])
def test_qlora_trains_adapters_on_quantized_base(tiny_model_dir, sft_data, tmp_path, bits):
    import bitsandbytes as bnb

    trainer = run_sft(tiny_model_dir, sft_data, tmp_path / "out", "--quantization_bit", str(bits))
    assert all(math.isfinite(x) for x in losses(trainer))
    quantized = bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt
    assert any(isinstance(m, quantized) for m in trainer.model.modules())
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(v.abs().sum() > 0 for k, v in trainer.model.state_dict().items() if "lora_B" in k)


@pytest.mark.parametrize("bf16", ["true", "false"])
def test_qlora_under_bf16_keeps_the_frozen_weights_and_activations_in_bf16(tiny_model_dir, sft_data, tmp_path, bf16):
    """PEFT's prepare_model_for_kbit_training upcasts embeddings and norms to float32; under bf16 autocast that
    makes every 4-bit layer's output (and what backward saves) float32. With --bf16 they stay bf16; without,
    PEFT's upcast stands. LoRA's own weights are float32 either way."""
    import bitsandbytes as bnb

    outputs = []

    def record_output_dtype(trainer):
        layer = next(m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit))
        layer.register_forward_hook(lambda module, args, out: outputs.append(out.dtype))

    from tunesmith.train.stage_trainer import StageTrainer
    original = StageTrainer.train
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StageTrainer, "train", lambda self, *a, **k: record_output_dtype(self) or original(self, *a, **k))
        trainer = run_sft(tiny_model_dir, sft_data, tmp_path / "out", "--quantization_bit", "4", "--bf16", bf16)
    frozen = torch.bfloat16 if bf16 == "true" else torch.float32
    named = dict(trainer.model.named_parameters())
    assert named["base_model.model.model.embed_tokens.weight"].dtype == frozen
    assert named["base_model.model.model.norm.weight"].dtype == frozen
    assert {p.dtype for n, p in named.items() if "lora_" in n} == {torch.float32}
    assert outputs and set(outputs) == {frozen}
    assert all(math.isfinite(x) for x in losses(trainer))
    assert all(v.abs().sum() > 0 for k, v in trainer.model.state_dict().items() if "lora_B" in k)


def test_steps_skip_the_train_mode_walk_yet_train_every_module_after_an_evaluation(tiny_model_dir, sft_data, tmp_path):
    """The Trainer calls model.train() at every step; tunesmith's returns at once while every module trains. After
    an evaluation (model.eval()) the next step still trains every module. total_flos is transformers' own count."""
    from transformers import Trainer

    from tunesmith.train.stage_trainer import StageTrainer

    every_module_training, walks = [], []
    original_loss, full_train = StageTrainer.compute_loss, torch.nn.Module.train

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            every_module_training.append(all(m.training for m in model.modules()))
        return original_loss(self, model, inputs, *args, **kwargs)

    def counted_train(self, mode=True):
        if type(self).__name__.startswith("Peft"):
            walks.append(mode)
        return full_train(self, mode)

    flags = ("--max_steps", "4", "--eval_data_path", sft_data, "--eval_strategy", "steps", "--eval_steps", "2")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StageTrainer, "compute_loss", compute_loss)
        patch.setattr(torch.nn.Module, "train", counted_train)
        trainer = run_sft(tiny_model_dir, sft_data, tmp_path / "out", *flags)
    assert every_module_training == [True] * 4
    assert False in walks  # evaluations set eval mode ...
    assert walks.count(True) <= 2  # ... and only the start and the step after one walked back (without: every step)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StageTrainer, "floating_point_ops", Trainer.floating_point_ops)
        recounted = run_sft(tiny_model_dir, sft_data, tmp_path / "recounted", *flags)
    assert trainer.state.total_flos == recounted.state.total_flos > 0


def trained_tokens(trainer) -> list[int]:
    return [r["trained_tokens"] for r in trainer.state.log_history if "loss" in r]


def test_resume_continues_the_same_trajectory(tiny_model_dir, sft_data, tmp_path, monkeypatch, caplog):
    from tunesmith.train.stage_trainer import StageTrainer

    common = ("--max_steps", "4", "--lr_scheduler_type", "constant", "--save_strategy", "steps", "--save_steps", "2",
              "--per_device_train_batch_size", "2", "--lora_dropout", "0.0")
    straight = run_sft(tiny_model_dir, sft_data, tmp_path / "straight", *common)
    # A run "killed" after its step-2 checkpoint: same command with max_steps 2 ...
    run_sft(tiny_model_dir, sft_data, tmp_path / "resumed", *common, "--max_steps", "2")
    # ... then the same command again, which finds checkpoint-2, says so and continues from it: it
    # computes only steps 3 and 4, and they match the uninterrupted run, trained-token count included.
    computed = []
    original = StageTrainer.compute_loss
    monkeypatch.setattr(StageTrainer, "compute_loss", lambda self, *a, **k: computed.append(1) or original(self, *a, **k))
    caplog.set_level(logging.INFO, logger="tunesmith")
    resumed = run_sft(tiny_model_dir, sft_data, tmp_path / "resumed", *common)
    assert f"resuming from {tmp_path / 'resumed' / 'checkpoint-2'} (step 2)" in caplog.messages
    assert len(computed) == 2
    assert [r["step"] for r in resumed.state.log_history if "loss" in r] == [1, 2, 3, 4]
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-4)
    assert trained_tokens(resumed)[3] > trained_tokens(resumed)[1] > 0
    assert trained_tokens(resumed) == trained_tokens(straight)

    # The same command once more: the run is complete, so nothing is trained (transformers alone would take a
    # fifth step) and nothing is rewritten (its report of that nothing would record train_loss 0.0): one line, and
    # exit status 0 (tests/cli/test_bad_values.py checks the outputs are left byte for byte).
    computed.clear()
    with pytest.raises(SystemExit) as exited:
        run_sft(tiny_model_dir, sft_data, tmp_path / "resumed", *common)
    assert exited.value.code == 0 and computed == []
    assert any("already holds this run, finished at step 4" in m for m in caplog.messages)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_incomplete_checkpoint_is_not_resumed(tiny_model_dir, sft_data, tmp_path, caplog):
    from tunesmith.train.checkpoints import last_complete_checkpoint

    out = tmp_path / "out"
    flags = ("--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1")
    run_sft(tiny_model_dir, sft_data, out, *flags)
    assert last_complete_checkpoint(str(out)).endswith("checkpoint-2")
    (out / "checkpoint-2" / "trainer_state.json").unlink()  # as if killed while saving
    assert last_complete_checkpoint(str(out)).endswith("checkpoint-1")
    assert "checkpoint-2/trainer_state.json: missing" in caplog.text

    # A state file cut short (a full disk, a copy interrupted): skipped with a warning that says why,
    # and the run continues from the checkpoint before it.
    state = out / "checkpoint-1" / "trainer_state.json"
    (out / "checkpoint-2" / "trainer_state.json").write_text(state.read_text()[:40])
    caplog.clear()
    caplog.set_level(logging.INFO, logger="tunesmith")
    resumed = run_sft(tiny_model_dir, sft_data, out, *flags)
    assert re.search(r"skipping .*checkpoint-2: .*checkpoint-2/trainer_state.json: not valid JSON", caplog.text)
    assert f"resuming from {out / 'checkpoint-1'} (step 1)" in caplog.messages
    assert [r["step"] for r in resumed.state.log_history if "loss" in r] == [1, 2]

    # With no readable checkpoint left, the run starts afresh.
    for checkpoint in out.glob("checkpoint-*"):
        (checkpoint / "trainer_state.json").write_text("{")
    assert last_complete_checkpoint(str(out)) is None
