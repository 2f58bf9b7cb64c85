"""Two CPU ranks (gloo) under torchrun with DeepSpeed ZeRO-2 and ZeRO-3: runs train, saves are
complete and load back with plain transformers/peft, and two ranks follow the one-rank trajectory
at the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tunesmith.train.checkpoints import empty_tensors

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[1]
CONVERSATIONS = [
    [{"role": "user", "content": f"Spell {w}."}, {"role": "assistant", "content": " ".join(w.upper())}]
    for w in ["cat", "dog", "tea", "sun", "map", "owl", "pen", "cup"]
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dist") / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHERS = {
    "torchrun": lambda ranks, port: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                                     "--master_port", str(port)],
    "deepspeed": lambda ranks, port: [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(ranks),
                                      "--master_port", str(port)],
}


def train(model_dir: str, data: str, out: Path, ranks: int, *extra: str, launcher: str = "torchrun") -> list[float]:
    """Run sft/train.py under a distributed launcher; the logged losses."""
    cmd = [*LAUNCHERS[launcher](ranks, free_port()), str(ROOT / "sft/train.py"),
           "--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
           "--max_steps", "3", "--learning_rate", "5e-3", "--lr_scheduler_type", "constant",
           "--save_strategy", "no", "--plot_loss", "false", "--lora_dropout", "0.0", "--seed", "0", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [r["loss"] for r in history if "loss" in r]


@pytest.mark.parametrize(
    "config, launcher, quantization",
    [("ds_zero2.json", "torchrun", ()), ("ds_zero3.json", "deepspeed", ()),
     ("ds_zero3.json", "torchrun", ("--quantization_bit", "4"))],
    ids=["zero2-torchrun", "zero3-deepspeed-launcher", "zero3-qlora4"],
)
def test_two_rank_lora_saves_complete_adapter(tiny_model_dir, data, tmp_path, config, launcher, quantization):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    losses = train(tiny_model_dir, data, out, 2, "--per_device_train_batch_size", "2",
                   "--deepspeed", str(ROOT / "configs" / config), *quantization, launcher=launcher)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_B" in k}
    assert len(loaded) == sum("lora_B" in k for k in saved)


def test_two_rank_zero3_full_model_is_complete(tiny_model_dir, data, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    train(tiny_model_dir, data, out, 2, "--per_device_train_batch_size", "2", "--finetuning_type", "full",
          "--learning_rate", "1e-3", "--deepspeed", str(ROOT / "configs/ds_zero3.json"))
    assert empty_tensors(str(out)) == []
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in before.items()}
    assert not torch.equal(after["model.layers.0.self_attn.q_proj.weight"], before["model.layers.0.self_attn.q_proj.weight"])


def test_two_ranks_match_one_rank_at_same_global_batch(tiny_model_dir, data, tmp_path):
    zero2 = ("--deepspeed", str(ROOT / "configs/ds_zero2.json"))
    one = train(tiny_model_dir, data, tmp_path / "one", 1, "--per_device_train_batch_size", "4", *zero2)
    two = train(tiny_model_dir, data, tmp_path / "two", 2, "--per_device_train_batch_size", "2", *zero2)
    assert two == pytest.approx(one, rel=2e-3)
    assert one[-1] < one[0]
