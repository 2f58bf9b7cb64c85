"""FSDP2 (torch's fully_shard, through accelerate) on two CPU ranks (gloo), with the one file
configs/fsdp2.yaml under both launchers (accelerate launch --config_file, torchrun with --fsdp_config):
SFT (QLoRA 4-bit and full), the reward model and DPO train as one rank does at the same global batch, saves
gather the full state dict (outputs load with plain transformers/peft, every tensor whole), and a run
resumes from its checkpoint. The refusals (FSDP with DeepSpeed, with 8-bit, under PPO) are in test_config."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.system import test_distributed
from tests.system.test_distributed import ROOT, dpo_flags, free_port, launch
from tunesmith.train.checkpoints import empty_tensors

pytestmark = pytest.mark.distributed
# test_distributed's fixtures: the SFT conversations, the preference pairs, DPO's one-process losses
data, preference_data = test_distributed.data, test_distributed.preference_data
one_process_dpo_losses = test_distributed.one_process_dpo_losses
FSDP2 = ROOT / "configs" / "fsdp2.yaml"
SHARDED = "FSDP2 (fully_shard) on 2 process(es), state dict FULL_STATE_DICT"


def accelerate_launch(script: str, ranks: int, *args: str) -> str:
    """Run a stage script under `accelerate launch --config_file configs/fsdp2.yaml`; its stderr."""
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(FSDP2),
           "--num_processes", str(ranks), "--main_process_port", str(free_port()), str(ROOT / script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def sft_flags(model_dir: str, data: str, out: Path, batch: int, *extra: str) -> list[str]:
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--max_steps", "3",
            "--per_device_train_batch_size", str(batch), "--learning_rate", "5e-3", "--lr_scheduler_type", "constant",
            "--save_strategy", "no", "--plot_loss", "false", "--lora_dropout", "0.0", "--seed", "0", *extra]


def logged(out: Path, key: str = "loss") -> list[dict]:
    return [r for r in json.loads((out / "trainer_state.json").read_text())["log_history"] if key in r]


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in logged(out)]


def assert_complete_adapter(model_dir: str, out: Path) -> None:
    """Gathered on the first process: every tensor whole (peft refuses a shape that differs), B trained, and the
    adapter loads with plain peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(out))
    lora = {k: v.shape for k, v in model.state_dict().items() if "lora_" in k}
    assert len(lora) == len(saved) and sorted(lora.values()) == sorted(v.shape for v in saved.values())


def test_fsdp_without_a_launcher_is_refused_before_anything_loads(tiny_model_dir, data, tmp_path, monkeypatch):
    from tunesmith.errors import ConfigError
    from tunesmith.sft import command as sft

    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigError, match=r"FSDP shards the model over several processes: start the run with "
                                          r"`accelerate launch --config_file configs/fsdp2.yaml` or `torchrun"):
        sft.run(sft_flags(tiny_model_dir, data, tmp_path / "one", 2, "--fsdp_config", str(FSDP2)))


def test_sft_qlora_under_accelerate_launch_follows_one_rank_and_saves_a_complete_adapter(tiny_model_dir, data,
                                                                                        tmp_path):
    """QLoRA 4-bit: the packed weights are stored in the compute dtype (bnb_4bit_quant_storage), so fully_shard
    shards them like any tensor."""
    from tunesmith.sft import command as sft

    out, qlora = tmp_path / "two", ("--quantization_bit", "4")
    assert SHARDED in accelerate_launch("sft/train.py", 2, *sft_flags(tiny_model_dir, data, out, 2, *qlora))
    sft.run(sft_flags(tiny_model_dir, data, tmp_path / "one", 4, *qlora))
    one = losses(tmp_path / "one")
    assert losses(out) == pytest.approx(one, rel=2e-3) and one[-1] < one[0]

    assert_complete_adapter(tiny_model_dir, out)


def test_sft_full_saves_the_whole_model_and_resumes(tiny_model_dir, data, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    full = ("--finetuning_type", "full", "--learning_rate", "1e-3", "--fsdp_config", str(FSDP2))
    stderr = launch("sft/train.py", 2, *sft_flags(tiny_model_dir, data, out, 2, *full),
                    "--save_strategy", "steps", "--save_steps", "2")
    assert SHARDED in stderr
    assert empty_tensors(str(out)) == []
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in before.items()}
    assert not torch.equal(after["model.layers.0.self_attn.q_proj.weight"], before["model.layers.0.self_attn.q_proj.weight"])
    # the head tied to the embeddings is written once, as a one-process save writes it (the gathered state dict held
    # it as a copy of its own, which transformers' save kept: the file held the embeddings twice)
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
    assert torch.equal(after["lm_head.weight"], after["model.embed_tokens.weight"])

    # checkpoint-2 holds the gathered model and FSDP's optimizer state: step 3 again, the same step.
    resumed = tmp_path / "resumed"
    launch("sft/train.py", 2, *sft_flags(tiny_model_dir, data, resumed, 2, *full),
           "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert [r["step"] for r in logged(resumed)] == [1, 2, 3]  # the first two from the checkpoint's history
    assert [logged(resumed)[-1][k] for k in ("loss", "grad_norm")] == pytest.approx(
        [logged(out)[-1][k] for k in ("loss", "grad_norm")], rel=1e-4)


@pytest.mark.heavy  # FSDP2's save and resume are in the default tier (SFT full, QLoRA); reward and DPO on DeepSpeed too
def test_reward_model_saves_its_trained_score_head(tiny_model_dir, preference_data, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, set_seed

    out = tmp_path / "rm"
    stderr = launch("reward/train.py", 2, "--model_name_or_path", tiny_model_dir, "--data_path",
                    preference_data["train"], "--eval_data_path", preference_data["eval"], "--output_dir", str(out),
                    "--max_steps", "2", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
                    "--learning_rate", "5e-3", "--lora_r", "8", "--lora_dropout", "0.0", "--max_seq_length", "64",
                    "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none", "--seed", "0",
                    "--fsdp_config", str(FSDP2))
    assert SHARDED in stderr
    assert empty_tensors(str(out)) == []
    head = [v for k, v in load_file(str(out / "adapter_model.safetensors")).items() if "score" in k]
    assert len(head) == 1 and head[0].shape == (1, 64)
    set_seed(0)  # the head drawn at the start of the run, moved by two Adam steps (see test_distributed)
    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    assert 1e-3 < (head[0] - base.score.weight).abs().max() < 1e-2
    PeftModel.from_pretrained(base, str(out))
    metrics = json.loads((out / "eval_results.json").read_text())
    assert math.isfinite(metrics["eval_loss"]) and 0 <= metrics["eval_accuracy"] <= 1


@pytest.mark.heavy  # as the reward model above
def test_dpo_follows_one_rank_and_saves_a_complete_adapter(tiny_model_dir, preference_data, one_process_dpo_losses,
                                                          tmp_path):
    """The reference is the model without its adapter, sharded like the policy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "dpo"
    stderr = launch("dpo/train.py", 2, *dpo_flags(tiny_model_dir, preference_data, out, 2), "--fsdp_config", str(FSDP2))
    assert SHARDED in stderr
    two = losses(out)
    assert two[0] == pytest.approx(math.log(2), abs=1e-4)
    assert two == pytest.approx(one_process_dpo_losses, rel=2e-3) and two[-1] < two[0]
    assert empty_tensors(str(out)) == []
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out))


# --------------------------------------------------------------------------- continued pre-training (tunesmith pt)

PT_DOCUMENTS = [f"Document {i}: the river Quenn runs through Veloria, whose bridges are made of blue stone number {i}."
                for i in range(8)]


@pytest.fixture(scope="module")
def pt_text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pt") / "corpus.txt"
    path.write_text("\n\n".join(PT_DOCUMENTS) + "\n", encoding="utf-8")
    return str(path)


def pt_flags(model_dir: str, text: str, out: Path, batch: int, *extra: str) -> list[str]:
    return [*sft_flags(model_dir, text, out, batch, *extra), "--document_separator", "blank_line",
            "--max_seq_length", "16", "--report_to", "none"]


def test_pt_lora_follows_one_rank_and_saves_a_complete_adapter(tiny_model_dir, pt_text, tmp_path):
    """`tunesmith pt` under torchrun with --fsdp_config: each rank packs its half of the global batch's pieces into
    one row, and the loss per token over both ranks is the one-rank loss of the whole batch."""
    from tunesmith.pretrain.command import run

    out = tmp_path / "two"
    assert SHARDED in launch("pt/train.py", 2, *pt_flags(tiny_model_dir, pt_text, out, 2, "--fsdp_config", str(FSDP2)))
    run(pt_flags(tiny_model_dir, pt_text, tmp_path / "one", 4))
    one = losses(tmp_path / "one")
    assert losses(out) == pytest.approx(one, rel=2e-3) and one[-1] < one[0]

    assert_complete_adapter(tiny_model_dir, out)


@pytest.mark.heavy  # the gathered full save (tied head once) is the default tier's in the SFT full test; pt's LoRA too
def test_pt_full_follows_one_rank_and_saves_the_whole_model(tiny_model_dir, pt_text, tmp_path):
    from transformers import AutoModelForCausalLM

    from tunesmith.pretrain.command import run

    full = ("--finetuning_type", "full", "--learning_rate", "1e-3")
    out = tmp_path / "two"
    assert SHARDED in accelerate_launch("pt/train.py", 2, *pt_flags(tiny_model_dir, pt_text, out, 2, *full))
    run(pt_flags(tiny_model_dir, pt_text, tmp_path / "one", 4, *full))
    one = losses(tmp_path / "one")
    assert losses(out) == pytest.approx(one, rel=2e-3) and one[-1] < one[0]

    assert empty_tensors(str(out)) == []
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    one_rank = AutoModelForCausalLM.from_pretrained(str(tmp_path / "one")).state_dict()
    assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in before.items()}
    assert all(not torch.equal(after[k], before[k]) for k in before)
    saved = load_file(str(out / "model.safetensors"))  # the tied head once, as the one-process run saves it
    assert sorted(saved) == sorted(load_file(str(tmp_path / "one" / "model.safetensors")))
    # Adam's first steps move each weight by about the learning rate whatever its gradient's size, so a weight
    # whose gradient is near 0 may step either way on two ranks: the steps agree on average, not weight by weight.
    for k in before:
        assert (after[k] - one_rank[k]).abs().mean() < 0.02 * (one_rank[k] - before[k]).abs().mean(), k
