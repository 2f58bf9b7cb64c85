"""--experts_implementation: transformers' experts interface (grouped_mm, batched_mm) computes what the eager loop
over the experts computes, on the mixture-of-experts models of tests/arch_models.py (Qwen3-MoE, Mixtral, gpt-oss):
the loss, the routers' auxiliary loss and the gradient of every trained tensor, for LoRA with the experts' fused
weights adapted through PEFT's target_parameters and for a full fine-tune, float32. The sums run in another order, so
"equal" is to float32 rounding: 1e-6 relative on the losses, and on each gradient tensor 2e-5 of its largest entry
(measured: at most 1.6e-7 on the losses, 2.1e-6 of the largest on a gradient, batched_mm's on gpt-oss). Also: QLoRA (bitsandbytes quantizes
linear layers only, so the experts stay in the load dtype and every kernel runs), an SFT step on packed rows, and the
refusals."""

from __future__ import annotations

import logging

import pytest
import torch
from arch_models import build_architecture

from tunesmith.errors import ConfigError
from tunesmith.hparams import FinetuningArguments, ModelArguments
from tunesmith.models.loader import load_model

MOE = ("qwen3_moe", "mixtral", "gpt_oss")
KERNELS = ("grouped_mm", "batched_mm")


@pytest.fixture(scope="module", params=MOE)
def moe_dir(request, tmp_path_factory, tokenizer) -> tuple[str, str]:
    return request.param, build_architecture(tmp_path_factory.mktemp(request.param), request.param, tokenizer)


def batch(tokenizer) -> dict[str, torch.Tensor]:
    """Two rows of different lengths, right-padded, every real token a label."""
    generator = torch.Generator().manual_seed(1)
    lengths = (37, 22)
    ids = torch.full((2, max(lengths)), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(100, len(tokenizer) - 100, (n,), generator=generator)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def step(model_dir: str, implementation: str, tokenizer, finetuning: str = "lora", **model_flags) -> dict:
    """Loss, aux loss and the gradient of every trained tensor of one forward and backward through tunesmith's
    loader. LoRA's B starts at zero (A's gradient would be zero too): both get seeded random values first."""
    torch.manual_seed(0)  # LoRA's A
    model = load_model(ModelArguments(model_name_or_path=model_dir, attn_implementation="eager",
                                      experts_implementation=implementation, **model_flags),
                       FinetuningArguments(finetuning_type=finetuning, lora_dropout=0.0))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    assert base.config._experts_implementation == implementation
    if finetuning == "lora":
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    out = model(**batch(tokenizer), output_router_logits=True)
    (out.loss + out.aux_loss).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"loss": out.loss.item(), "aux_loss": out.aux_loss.item(), "grads": grads}


def assert_same_step(got: dict, eager: dict) -> None:
    assert got["loss"] == pytest.approx(eager["loss"], rel=1e-6)
    assert got["aux_loss"] == pytest.approx(eager["aux_loss"], rel=1e-6)
    assert got["grads"].keys() == eager["grads"].keys()
    for name, reference in eager["grads"].items():
        scale = reference.abs().max().item()
        assert scale > 0, f"{name}: no gradient"
        torch.testing.assert_close(got["grads"][name], reference, rtol=0, atol=2e-5 * scale,
                                   msg=lambda message, name=name: f"{name}: {message}")


@pytest.mark.parametrize("finetuning", ["lora", "full"])
def test_each_kernel_gives_eagers_losses_and_gradients(moe_dir, tokenizer, finetuning):
    _, path = moe_dir
    eager = step(path, "eager", tokenizer, finetuning)
    if finetuning == "lora":  # the experts' fused weights are adapted (PEFT's ParamWrapper), and train
        assert any("experts" in n and "lora_A" in n for n in eager["grads"])
    else:
        assert any(n.endswith("experts.gate_up_proj") for n in eager["grads"])
    for kernel in KERNELS:
        assert_same_step(step(path, kernel, tokenizer, finetuning), eager)


def test_qlora_runs_every_kernel_on_the_unquantized_experts(tmp_path, tokenizer):
    path = build_architecture(tmp_path / "qwen3_moe", "qwen3_moe", tokenizer)
    eager = step(path, "eager", tokenizer, quantization_bit=4)
    for kernel in KERNELS:
        assert_same_step(step(path, kernel, tokenizer, quantization_bit=4), eager)
