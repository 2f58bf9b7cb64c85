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


def test_an_atomic_rewrite_keeps_the_files_mode_and_a_new_file_gets_the_umasks(tmp_path):
    """A rewrite (chat's /save appends by rewriting) must not turn a shared file private, nor a new file 0600
    (mkstemp's mode) where open() would make it readable to the group and others (issue 51)."""
    import os
    import stat

    from tunesmith.utils.io import atomic_write_text

    kept = tmp_path / "kept.jsonl"
    kept.write_text("old\n")
    kept.chmod(0o644)
    atomic_write_text(kept, "old\nnew\n")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644 and kept.read_text() == "old\nnew\n"
    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "new.txt", "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644


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
