"""--experts_implementation under sharded training on two CPU ranks (gloo): DeepSpeed ZeRO-2 and ZeRO-3 (torchrun) and
FSDP2 (torchrun with --fsdp_config), LoRA with the experts' fused weights adapted through PEFT's target_parameters, on
the tiny Qwen3-MoE of tests/helpers/arch_models.py. grouped_mm (and batched_mm under ZeRO-3, where the weights are gathered
per module for its forward) logs eager's loss, router aux loss and gradient norm at every step, and saves eager's
adapter.

SGD, so that an update is the learning rate times the gradient and a rounding difference stays one (Adam's m/√v
turns a 1e-9 difference in a near-zero gradient into a full-size step). Tolerances, float32: losses and aux losses
1e-6 relative, the gradient norm 1e-5 relative, each saved adapter tensor 1e-5 of its largest entry (the sums run in
another order). Measured under ZeRO-3 with AdamW: losses equal to the last digit, aux losses 1e-7 and gradient norms
3e-10 relative.

Heavy tier: each launch is a two-process start (20-40 s on an idle 2-core machine, several minutes on a loaded one):
    pytest -m heavy tests/system/test_moe_sharded.py
One process, with packing and QLoRA: tests/core/models/test_moe_experts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

import tests.system.test_distributed as test_distributed
from tests.helpers.arch_models import build_architecture
from tests.system.test_distributed import ROOT, launch

pytestmark = [pytest.mark.distributed, pytest.mark.heavy]
data = test_distributed.data  # the eight SFT conversations
SHARDING = {
    "zero2": ("--deepspeed", str(ROOT / "configs" / "ds_zero2.json")),
    "zero3": ("--deepspeed", str(ROOT / "configs" / "ds_zero3.json")),
    "fsdp2": ("--fsdp_config", str(ROOT / "configs" / "fsdp2.yaml")),
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, tokenizer) -> str:
    return build_architecture(tmp_path_factory.mktemp("qwen3_moe"), "qwen3_moe", tokenizer)


def two_ranks(model_dir: str, data: str, out: Path, kernel: str, sharding: str) -> tuple[list[dict], dict]:
    """Two steps of LoRA SFT on two ranks; (each step's log, the saved adapter)."""
    stderr = launch("sft/train.py", 2, "--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
                    "--experts_implementation", kernel, "--lora_dropout", "0", "--max_steps", "2",
                    "--per_device_train_batch_size", "2", "--optim", "sgd", "--learning_rate", "0.1",
                    "--lr_scheduler_type", "constant", "--logging_steps", "1",
                    "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", *SHARDING[sharding])
    assert f"experts: {kernel} (--experts_implementation {kernel})" in stderr
    assert "LoRA on the experts' fused weights too" in stderr
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [r for r in history if "loss" in r], load_file(str(out / "adapter_model.safetensors"))


@pytest.mark.parametrize("sharding, kernels", [("zero2", ("grouped_mm",)), ("zero3", ("grouped_mm", "batched_mm")),
                                               ("fsdp2", ("grouped_mm",))])
def test_each_kernel_trains_as_eager_does_when_sharded(moe_dir, data, tmp_path, sharding, kernels):
    import torch

    eager_log, eager_adapter = two_ranks(moe_dir, data, tmp_path / "eager", "eager", sharding)
    assert len(eager_log) == 2 and any("experts" in k and "lora_B" in k for k in eager_adapter)
    for kernel in kernels:
        log, adapter = two_ranks(moe_dir, data, tmp_path / kernel, kernel, sharding)
        for got, reference in zip(log, eager_log, strict=True):
            assert got["loss"] == pytest.approx(reference["loss"], rel=1e-6), kernel
            assert got["aux_loss"] == pytest.approx(reference["aux_loss"], rel=1e-6), kernel
            assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5), kernel
        assert adapter.keys() == eager_adapter.keys()
        for name, reference in eager_adapter.items():
            torch.testing.assert_close(adapter[name], reference, rtol=0, atol=1e-5 * reference.abs().max().item(),
                                       msg=lambda message, name=name, kernel=kernel: f"{kernel} {name}: {message}")
