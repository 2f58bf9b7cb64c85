"""--disable_dropout: the model loads with its config's dropout probabilities at 0 (DeepSpeed-Chat's flag), on
by default for the RL stages, whose policy ratios compare two forwards of the same weights."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny_models import build_tiny_model_dir
from tunesmith.hparams import FinetuningArguments, ModelArguments
from tunesmith.models.loader import load_model
from tunesmith.train.run_setup import prepare_training_run


@pytest.fixture(scope="module")
def dropout_model_dir(tmp_path_factory, tokenizer) -> str:
    return build_tiny_model_dir(tmp_path_factory.mktemp("dropout"), tokenizer, attention_dropout=0.5)


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_makes_training_forwards_repeatable(dropout_model_dir, disable):
    model = load_model(ModelArguments(model_name_or_path=dropout_model_dir),
                       FinetuningArguments(finetuning_type="full", disable_dropout=disable)).train()
    ids = torch.arange(3, 40)[None]
    torch.manual_seed(0)
    first = model(input_ids=ids).logits
    second = model(input_ids=ids).logits
    assert model.config.attention_dropout == (0.0 if disable else 0.5)
    assert torch.equal(first, second) == disable  # dropout on: two draws of the noise differ


@pytest.mark.parametrize(("kind", "flags", "expected"), [
    ("ppo", [], True), ("ppo", ["--disable_dropout", "false"], False),
    ("sft", [], False), ("sft", ["--disable_dropout", "true"], True)])
def test_disable_dropout_is_on_by_default_for_the_rl_stages_only(tiny_model_dir, tmp_path, kind, flags, expected):
    data = "data/demo/grpo_train.jsonl" if kind == "ppo" else "data/demo/sft.jsonl"
    rl = ["--reward_funcs", "exact_answer", "--advantage", "grpo", "--samples_per_prompt", "4"] if kind == "ppo" else []
    args, _ = prepare_training_run(kind, ["--model_name_or_path", tiny_model_dir, "--data_path", data,
                                         "--output_dir", str(tmp_path / kind), *rl, *flags], None)
    assert args.finetuning.disable_dropout is expected
