"""Vision-language SFT on two CPU ranks (gloo) as for text: LoRA under DeepSpeed ZeRO-3 saves a complete adapter of
the language model (a tiny Qwen2-VL, its processor loaded for pictures), and two ranks follow one rank's losses at
the same global batch under ZeRO-2 (a tiny Gemma 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_distributed import ROOT, launch
from tests.vlm_models import build_vlm_dir, write_memorisation_set
from tunesmith.train.checkpoints import empty_tensors

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def pictures_data(tmp_path_factory) -> str:
    return write_memorisation_set(tmp_path_factory.mktemp("vlm_dist"))


def train(model_dir: str, data: str, out: Path, ranks: int, *extra: str) -> list[float]:
    launch("sft/train.py", ranks, "--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
           "--max_steps", "3", "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--save_strategy", "no",
           "--plot_loss", "false", "--lora_dropout", "0.0", "--seed", "0", "--report_to", "none", *extra)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [r["loss"] for r in history if "loss" in r]


def test_two_rank_zero3_lora_on_a_vision_model_saves_a_complete_adapter(pictures_data, default_model_path, tmp_path):
    model_dir = build_vlm_dir("qwen2_vl", tmp_path / "qwen2_vl", default_model_path)
    out = tmp_path / "out"
    losses = train(model_dir, pictures_data, out, 2, "--per_device_train_batch_size", "2",
                   "--deepspeed", str(ROOT / "configs" / "ds_zero3.json"))
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert saved and all("language_model" in key for key in saved)
    assert any("lora_B" in key and value.abs().sum() > 0 for key, value in saved.items())
    assert (out / "preprocessor_config.json").is_file() or (out / "processor_config.json").is_file()


@pytest.mark.heavy  # the default tier runs a vision model on two ranks (ZeRO-3 above); this one compares losses
def test_two_ranks_follow_one_rank_on_pictures(pictures_data, default_model_path, tmp_path):
    model_dir = build_vlm_dir("gemma3", tmp_path / "gemma3", default_model_path)
    zero2 = ("--deepspeed", str(ROOT / "configs" / "ds_zero2.json"))
    one = train(model_dir, pictures_data, tmp_path / "one", 1, "--per_device_train_batch_size", "4", *zero2)
    two = train(model_dir, pictures_data, tmp_path / "two", 2, "--per_device_train_batch_size", "2", *zero2)
    assert two == pytest.approx(one, rel=2e-3)
