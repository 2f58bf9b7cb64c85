"""A copy of a trained model runs its own layers: the forwards tunesmith installs on a model for training (the tiled
LM head's loss, train/head_loss.py; the sequence-tiled MLP, models/tiled_mlp.py) call the module they are bound to,
so `copy.deepcopy` of the model (qat.quantized_copy's post-training quantization, a DPO reference) computes with the
copy's weights.

The bug this guards: both forwards once closed over the original's bound method, so the deep copy's forward ran the
original model. benchmarks/qat_compare.py's "trained without QAT, then quantized" then scored the float model's loss to
16 digits: the quantized copy was made, and never run.

Tolerances (float32): the quantized copy's logits differ from the float model's by more than 1e-2 somewhere (int4
weights of initializer_range 0.2: about 4 here), and equal those of the same quantization of a model that never had
the training forwards, within 1e-5 (the same ops on the same weights)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("torchao")

QUANTIZATION_ERROR = 1e-2
SAME = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> str:
    from tests.helpers.tiny_models import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("copy-llama"), tokenizer, initializer_range=0.2)


def _model(model_dir: str, lora: bool, training_forwards: bool) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunesmith.models.tiled_mlp import install_tiled_mlp
    from tunesmith.train.head_loss import install_fused_head

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if lora:
        torch.manual_seed(0)  # the same adapter in every model built here
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                 init_lora_weights=False))
    if training_forwards:  # as StageTrainer installs them
        assert install_fused_head(model)
        assert install_tiled_mlp(model) == 2
    return model.eval()


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 4000, (2, 16), generator=torch.Generator().manual_seed(0))
    return model(input_ids=ids).logits


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("scheme", ["int8_int4", "int4"])
def test_quantizing_a_trained_model_changes_its_logits(model_dir, lora, scheme):
    from tunesmith.models.qat import quantized_copy

    trained = _model(model_dir, lora, training_forwards=True)
    float_logits = _logits(trained)
    quantized = _logits(quantized_copy(trained, scheme, 32))
    assert (quantized - float_logits).abs().max() > QUANTIZATION_ERROR
    bare = quantized_copy(_model(model_dir, lora, training_forwards=False), scheme, 32)
    torch.testing.assert_close(quantized, _logits(bare), atol=SAME, rtol=0)
    torch.testing.assert_close(_logits(trained), float_logits, atol=0, rtol=0)  # the trained model left as it was


def test_a_deep_copy_with_training_forwards_runs_its_own_weights(model_dir):
    """The copy's own layers, head and MLPs compute (a DPO reference is such a copy): change its weights and only its
    logits move; the forwards stay installed on the copy."""
    model = _model(model_dir, lora=False, training_forwards=True)
    before = _logits(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.model.layers[0].mlp.down_proj.weight.mul_(3)
    assert (_logits(twin) - before).abs().max() > QUANTIZATION_ERROR
    torch.testing.assert_close(_logits(model), before, atol=0, rtol=0)
    assert twin.forward.__self__ is twin and twin.model.layers[1].mlp.forward.__self__ is twin.model.layers[1].mlp
    assert getattr(twin.forward, "fused_head", False) and getattr(twin.model.layers[1].mlp.forward, "tiled_mlp", False)
