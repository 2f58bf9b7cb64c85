"""The tiled LM head (train/head_loss.py) gives the model's own loss and gradients, on every model type it is used for,
and only where a forward's logits are large."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.arch_models import architecture_config
from tunesmith.data.collator import PackingCollator
from tunesmith.train import head_loss
from tunesmith.train.head_loss import FUSED_HEAD, install_fused_head, wants_fused_head

MOE = {"qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                     "shared_expert_intermediate_size": 32}}
SOFTCAP = {"gemma2": {"final_logit_softcapping": 3.0}, "gemma3_text": {"final_logit_softcapping": 3.0},
           "cohere": {"logit_scale": 0.5}, "cohere2": {"logit_scale": 0.5}, "granite": {"logits_scaling": 4.0}}


def packed_batch(tokenizer, lengths=(23, 40, 9, 31), seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    features = []
    for n in lengths:
        ids = torch.randint(100, len(tokenizer) - 100, (n,), generator=generator).tolist()
        labels = [-100] * (n // 3) + ids[n // 3:]  # a prompt, then a trained reply
        features.append({"input_ids": ids, "labels": labels})
    return PackingCollator()(features)


def loss_and_grads(model, batch: dict, fused: bool) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    extra = {FUSED_HEAD: True} if fused else {}
    loss = model(**batch, num_items_in_batch=int(batch["shift_labels"].numel()), **extra).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", sorted(head_loss.PLAIN_HEAD_TYPES))
def test_tiled_head_gives_the_models_own_loss_and_gradients(name, tokenizer):
    try:
        config = architecture_config(name, tokenizer, **MOE.get(name, {}), **SOFTCAP.get(name, {}))
    except KeyError:
        pytest.skip(f"this transformers has no {name}")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    batch = packed_batch(tokenizer)
    reference_loss, reference = loss_and_grads(model, batch, fused=False)
    assert install_fused_head(model), name
    loss, grads = loss_and_grads(model, batch, fused=True)
    assert loss == pytest.approx(reference_loss, abs=1e-5)
    assert grads.keys() == reference.keys()
    for key, grad in grads.items():
        assert torch.allclose(grad, reference[key], atol=1e-5, rtol=1e-4), f"{name}: {key}"
    if SOFTCAP.get(name):  # the transform matters: without it the loss differs
        monkey = head_loss.head_transform
        try:
            head_loss.head_transform = lambda config: (None, 1.0)
            bare = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
            bare.load_state_dict(model.state_dict())
            install_fused_head(bare)
            assert abs(loss_and_grads(bare, batch, fused=True)[0] - reference_loss) > 1e-3
        finally:
            head_loss.head_transform = monkey


def test_a_model_outside_the_table_keeps_the_logits_path(tokenizer):
    config = architecture_config("llama", tokenizer)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.config.model_type = "some_new_model"
    assert not install_fused_head(model)


def test_only_large_logits_go_through_the_tiles(tokenizer, monkeypatch):
    batch = packed_batch(tokenizer)
    kept = batch["logits_to_keep"].numel()
    monkeypatch.setattr(head_loss, "FUSED_HEAD_ELEMENTS", kept * 1000)
    assert not wants_fused_head(batch, 1000)
    assert wants_fused_head(batch, 1001)
    assert not wants_fused_head({k: v for k, v in batch.items() if k != "shift_labels"}, 10**9)


def test_sft_trains_the_same_through_the_tiles(tiny_model_dir, tmp_path, monkeypatch):
    """Two packed LoRA steps: the same losses and adapter with every forward through the tiles as with none."""
    from tests.core.models.test_architectures import TOPICS, conversation
    from tunesmith.sft.command import run

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(len(TOPICS))))
    calls = []
    tiled = head_loss.tiled_log_probs
    monkeypatch.setattr(head_loss, "tiled_log_probs", lambda *a: calls.append(1) or tiled(*a))

    def train(out: str, threshold: int):
        monkeypatch.setattr(head_loss, "FUSED_HEAD_ELEMENTS", threshold)
        trainer = run(["--model_name_or_path", tiny_model_dir, "--data_path", str(data), "--output_dir",
                       str(tmp_path / out), "--max_steps", "2", "--per_device_train_batch_size", "4", "--bf16", "false",
                       "--lora_dropout", "0", "--packing", "true", "--save_strategy", "no", "--plot_loss", "false",
                       "--learning_rate", "5e-2"])
        losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
        return losses, {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    logits_losses, logits_weights = train("logits", 1 << 62)
    assert not calls
    tiled_losses, tiled_weights = train("tiled", 0)
    assert len(calls) == 2
    assert tiled_losses == pytest.approx(logits_losses, abs=1e-5)
    worst = max(float((w - logits_weights[n]).abs().max()) for n, w in tiled_weights.items())
    # Adam divides by the root of tiny second moments, so float32 rounding in the gradients shows as 1e-4 of an update
    assert worst < 0.01 * 5e-2, worst
