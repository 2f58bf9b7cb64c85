"""`tunesmith merge --method`: several models merged through mergekit. A linear merge is the weighted average of
every tensor; slerp at t=0 is its first model; TIES and DARE-TIES give a new model that loads; LoRA adapters of one
base merge as their merged models would; the folder keeps the first model's tokenizer and chat template, and chats
and exports as any merged folder; each refusal is one line, before anything loads."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.tiny_models import build_tiny_model_dir, save_random_adapter
from tunesmith import cli
from tunesmith.data.template import BUILTIN_TEMPLATES
from tunesmith.errors import ConfigError, PathError
from tunesmith.merge.command import probe_logits
from tunesmith.merge.command import run as merge

pytest.importorskip("mergekit")  # the merge extra; the test extra installs it

@pytest.fixture(scope="module")
def two_models(tmp_path_factory, tokenizer) -> tuple[str, str]:
    """Two tiny Llamas of one shape with different random weights; the second carries ChatML's template instead of
    SmolLM2's, so that the merge's template shows which model it came from."""
    root = tmp_path_factory.mktemp("soup")
    first = build_tiny_model_dir(root / "a", tokenizer, seed=0)
    second = build_tiny_model_dir(root / "b", tokenizer, seed=1)
    other = AutoTokenizer.from_pretrained(second)
    other.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    other.save_pretrained(second)
    return first, second


def tensors(folder: str) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            found.update(load_file(os.path.join(folder, name)))
    return found


def logits(folder: str, tokenizer) -> torch.Tensor:
    return probe_logits(AutoModelForCausalLM.from_pretrained(folder).eval(), tokenizer)


def test_linear_merge_is_the_weighted_average_of_every_tensor(two_models, tokenizer, tmp_path):
    first, second = two_models
    out = tmp_path / "linear"
    merge(["--method", "linear", "--models", first, second, "--weights", "1", "3", "--output_dir", str(out)])

    a, b, merged = tensors(first), tensors(second), tensors(str(out))
    assert sorted(merged) == sorted(a) and len(a) > 10
    for name, tensor in merged.items():  # linear divides by the weights' sum: 1/4 and 3/4
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, 0.25 * a[name] + 0.75 * b[name], atol=1e-6, rtol=0, msg=name)
    # The first model's tokenizer and chat template, and a record of the merge like the LoRA merge's.
    assert AutoTokenizer.from_pretrained(out).chat_template == tokenizer.chat_template != \
        AutoTokenizer.from_pretrained(second).chat_template
    record = json.loads((out / "tunesmith_config.json").read_text())["MergeArguments"]
    assert record["method"] == "linear" and record["models"] == [first, second] and record["weights"] == [1, 3]
    assert (out / "generation_config.json").is_file()
    assert torch.isfinite(logits(str(out), tokenizer)).all()


def test_slerp_at_t_0_is_the_first_model(two_models, tmp_path):
    first, second = two_models
    out = tmp_path / "slerp"
    merge(["--method", "slerp", "--models", first, second, "--slerp_t", "0", "--output_dir", str(out)])
    a, merged = tensors(first), tensors(str(out))
    assert sorted(merged) == sorted(a)
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, a[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("method", ["ties", "dare_ties"])
def test_ties_and_dare_ties_give_a_new_model_that_loads(method, two_models, tiny_model_dir, tokenizer, tmp_path):
    first, second = two_models
    base = build_tiny_model_dir(tmp_path / "base", tokenizer, seed=2)
    out = tmp_path / method
    merge(["--model_name_or_path", base, "--method", method, "--models", first, second, "--weights", "0.6", "0.4",
           "--density", "0.5", "--output_dir", str(out)])

    merged = logits(str(out), tokenizer)
    assert torch.isfinite(merged).all()
    for source in (base, first, second):  # not any one of its inputs
        assert (merged - logits(source, tokenizer)).abs().max() > 1e-3
    record = json.loads((out / "tunesmith_config.json").read_text())
    assert record["MergeArguments"]["method"] == method and record["ModelArguments"]["model_name_or_path"] == base


def test_two_lora_adapters_of_one_base_merge_as_their_merged_models(tiny_model_dir, tokenizer, tmp_path):
    adapters = [save_random_adapter(tiny_model_dir, tokenizer, str(tmp_path / f"adapter{i}"), seed=i) for i in (1, 2)]
    out = tmp_path / "adapters"
    merge(["--method", "linear", "--models", *adapters, "--output_dir", str(out)])

    expected = []
    for adapter in adapters:
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter)
        expected.append({k: v.detach() for k, v in model.merge_and_unload().state_dict().items()})
    merged = tensors(str(out))
    assert set(merged) <= set(expected[0])
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, (expected[0][name] + expected[1][name]) / 2, atol=1e-5, rtol=0, msg=name)
    assert (merged["model.layers.0.self_attn.q_proj.weight"] - tensors(tiny_model_dir)[
        "model.layers.0.self_attn.q_proj.weight"]).abs().max() > 1e-3  # the adapters really changed the weights
    assert AutoTokenizer.from_pretrained(out).chat_template == tokenizer.chat_template


def test_a_merged_folder_chats_and_exports_like_any_merged_folder(two_models, tmp_path, monkeypatch, capsys):
    from tests.features.chat.test_chat import _Pipe, _run_cli

    first, second = two_models
    out = tmp_path / "soup"
    merge(["--method", "linear", "--models", first, second, "--output_dir", str(out)])

    answers, _ = _run_cli(["--model_name_or_path", str(out), "--do_sample", "false", "--max_new_tokens", "3"],
                          _Pipe("Hello\n/quit\n"), monkeypatch, capsys)
    assert answers.endswith("\n")
    gguf = tmp_path / "soup.gguf"
    export = importlib.import_module(cli.COMMANDS["export"]).run  # wherever the export command lives
    result = export(["--model_name_or_path", str(out), "--output_file", str(gguf), "--dtype", "f32"])
    assert result.round_trip.max_abs_diff == 0 and gguf.stat().st_size > 0 and (tmp_path / "soup.Modelfile").is_file()


@pytest.mark.parametrize(("flags", "error", "message"), [
    (["--method", "slerp", "--models", "{a}", "{b}", "{a}"], ConfigError,
     "--method slerp interpolates between exactly two --models (got 3)"),
    (["--method", "linear", "--models", "{a}", "{b}", "--weights", "1"], ConfigError,
     "--weights has 1 values for 2 --models: give one weight per model, in order."),
    (["--method", "ties", "--models", "{a}", "{b}"], ConfigError,
     "--method ties adds each model's difference from a base to that base: give the base they were fine-tuned "
     "from as --model_name_or_path"),
    (["--method", "dare_ties", "--models", "{a}", "{b}"], ConfigError, "--method dare_ties adds each model's"),
    (["--method", "linear", "--models", "{a}"], ConfigError, "--method linear merges two or more --models (got 1)"),
    (["--models", "{a}", "{b}"], ConfigError, "--models needs --method (linear, ties, dare_ties or slerp)"),
    (["--method", "linear", "--models", "{a}", "{b}", "--density", "0.3"], ConfigError,
     "--density is read by --method ties and dare_ties only (this merge: linear)"),
    (["--method", "linear", "--models", "{a}", "{b}", "--slerp_t", "0.3"], ConfigError,
     "--slerp_t is read by --method slerp only"),
    (["--method", "slerp", "--models", "{a}", "{b}", "--weights", "1", "2"], ConfigError,
     "--weights is not read by --method slerp"),
    (["--method", "slerp", "--models", "{a}", "{b}", "--slerp_t", "1.5"], ConfigError,
     "--slerp_t must be in [0, 1] (got 1.5)"),
    (["--method", "ties", "--model_name_or_path", "{a}", "--models", "{a}", "{b}", "--density", "0"], ConfigError,
     "--density must be in (0, 1] (got 0.0)"),
    (["--method", "linear", "--model_name_or_path", "{a}", "--models", "{a}", "{b}"], ConfigError,
     "--method linear reads no base (only ties and dare_ties do)"),
    (["--method", "linear", "--models", "{a}", "{b}", "--tolerance", "1"], ConfigError,
     "--tolerance bounds a LoRA merge's difference"),
    (["--method", "linear", "--models", "{a}", "{missing}"], PathError, "--models {missing}: no such directory"),
    (["--method", "linear", "--adapter_name_or_path", "{adapter}", "--models", "{a}", "{b}"], ConfigError,
     "--method linear merges the --models; {adapter} came as --adapter_name_or_path"),
    (["--method", "linear", "--models", "{a}", "{reward}"], ConfigError,
     "--models {reward} is a reward-model (task_type SEQ_CLS) adapter"),
    (["--method", "linear", "--models", "{a}", "{narrow}"], ConfigError,
     "--models: {a} and {narrow} differ in config.json's hidden_size (64 vs 32)"),
    (["--method", "ties", "--model_name_or_path", "{narrow}", "--models", "{a}", "{b}"], ConfigError,
     "--models: {narrow} and {a} differ in config.json's hidden_size (32 vs 64)"),
])
def test_each_refusal_is_one_line_before_anything_loads(flags, error, message, two_models, tiny_model_dir, tokenizer,
                                                         tmp_path):
    from tests.features.merge.test_merge import _make_adapter

    names = {"a": two_models[0], "b": two_models[1], "missing": str(tmp_path / "missing")}
    if "{narrow}" in " ".join(flags):
        names["narrow"] = build_tiny_model_dir(tmp_path / "narrow", tokenizer, hidden_size=32)
    if "{adapter}" in " ".join(flags):
        names["adapter"] = save_random_adapter(tiny_model_dir, tokenizer, str(tmp_path / "adapter"), seed=1)
    if "{reward}" in " ".join(flags):
        names["reward"] = _make_adapter(tiny_model_dir, tokenizer, str(tmp_path / "reward"), task="reward")
    out = tmp_path / "out"
    with pytest.raises(error) as caught:
        merge([flag.format(**names) for flag in flags] + ["--output_dir", str(out)])
    assert message.format(**names) in str(caught.value) and "\n" not in str(caught.value)
    assert not out.exists()


def test_without_mergekit_the_method_names_the_pip_extra(two_models, tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mergekit" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"--method ties merges through mergekit, which is not installed: pip "
                                          r"install -e '\.\[merge\]'"):
        merge(["--method", "ties", "--models", *two_models, "--output_dir", str(tmp_path / "out")])
