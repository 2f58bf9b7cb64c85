"""Vision-language models on two CPU ranks (gloo) as for text: SFT with LoRA under DeepSpeed ZeRO-3 saves a complete
adapter of the language model (a tiny Qwen2-VL, its processor loaded for pictures); two ranks follow one rank's
losses at the same global batch under ZeRO-2 (SFT, a tiny Gemma 3) and under FSDP2 (DPO on pairs with pictures, a
tiny Idefics3), where the adapter is saved whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.vlm_models import build_vlm_dir, write_memorisation_set, write_preference_set
from tests.system.test_distributed import ROOT, launch
from tests.system.test_fsdp import SHARDED, accelerate_launch
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


@pytest.mark.heavy  # the default tier runs a vision model on two ranks (ZeRO-3 above) and FSDP2 on text (test_fsdp)
def test_dpo_on_pictures_under_fsdp2_follows_one_rank_and_saves_a_complete_adapter(default_model_path, tmp_path):
    from tunesmith.preference.command import run as dpo_main

    model_dir = build_vlm_dir("idefics3", tmp_path / "idefics3", default_model_path)
    pairs = write_preference_set(tmp_path)
    flags = ["--model_name_or_path", model_dir, "--data_path", pairs, "--max_steps", "3", "--learning_rate", "1e-2",
             "--lr_scheduler_type", "constant", "--save_strategy", "no", "--plot_loss", "false", "--lora_dropout",
             "0.0", "--seed", "0", "--logging_steps", "1", "--report_to", "none"]
    out = tmp_path / "two"
    assert SHARDED in accelerate_launch("dpo/train.py", 2, *flags, "--output_dir", str(out),
                                        "--per_device_train_batch_size", "2")
    dpo_main([*flags, "--output_dir", str(tmp_path / "one"), "--per_device_train_batch_size", "4"])
    two, one = (json.loads((o / "trainer_state.json").read_text())["log_history"] for o in (out, tmp_path / "one"))
    assert [r["loss"] for r in two if "loss" in r] == pytest.approx([r["loss"] for r in one if "loss" in r], rel=2e-3)
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert saved and all("text_model" in key for key in saved)
    assert any("lora_B" in key and value.abs().sum() > 0 for key, value in saved.items())
