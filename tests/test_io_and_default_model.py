"""Atomic outputs, and the embedded default model converted from GGUF."""

from __future__ import annotations

import json

import pytest
import torch

from tunesmith.utils.io import atomic_directory, atomic_write_json


def test_atomic_directory_replaces_only_on_success(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("killed mid-save")
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left behind
    with atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_atomic_write_json(tmp_path):
    path = tmp_path / "a" / "b.json"
    atomic_write_json(path, {"x": "é"})
    assert json.loads(path.read_text()) == {"x": "é"}
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]


def test_default_model_is_converted_and_answers(default_model_path):
    from transformers import AutoModelForCausalLM

    from tunesmith.data.template import encode_prompt
    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import load_tokenizer

    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=default_model_path))
    model = AutoModelForCausalLM.from_pretrained(default_model_path)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == 49152
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])])
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])
