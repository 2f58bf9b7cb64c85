"""LoRA merge: merged logits equal base + adapter (LoRA, QLoRA-trained, reward model), a mismatched
base is refused by name, and the output appears whole or not at all."""

from __future__ import annotations

import json
import os

import pytest
import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from tests.helpers.tiny_models import build_tiny_model_dir
from tunesmith.data.template import encode_conversation
from tunesmith.errors import ConfigError, PathError
from tunesmith.merge.command import MergeError
from tunesmith.merge.command import run as main
from tunesmith.models.loader import find_lora_targets

CONVERSATION = [{"role": "user", "content": "Hi there, who are you?"}, {"role": "assistant", "content": "A test."}]


def _ids(tokenizer) -> torch.Tensor:
    return torch.tensor([encode_conversation(tokenizer, CONVERSATION).input_ids])


def _make_adapter(base_dir: str, tokenizer, out: str, task: str = "causal_lm", seed: int = 1) -> str:
    """A LoRA adapter with random (non-zero) B matrices, so merging it changes the model."""
    torch.manual_seed(seed)
    if task == "reward":
        model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=find_lora_targets(model), task_type=TaskType.SEQ_CLS,
                            init_lora_weights=False)
    else:
        model = AutoModelForCausalLM.from_pretrained(base_dir)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=find_lora_targets(model), init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def lora_adapter(tmp_path_factory, tiny_model_dir, tokenizer) -> str:
    return _make_adapter(tiny_model_dir, tokenizer, str(tmp_path_factory.mktemp("lora")))


def _adapted_logits(base_dir: str, adapter: str, tokenizer) -> torch.Tensor:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter).eval()
    with torch.no_grad():
        return model(_ids(tokenizer)).logits


def _merged_logits(path: str, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(path).eval()(_ids(tokenizer)).logits


def test_merged_lora_logits_equal_base_plus_adapter(lora_adapter, tiny_model_dir, tokenizer, tmp_path):
    out = tmp_path / "merged"
    result = main(["--adapter_name_or_path", lora_adapter, "--output_dir", str(out)])  # base read from adapter_config.json

    assert result.task == "causal_lm" and result.max_abs_diff < 1e-4
    files = set(os.listdir(out))
    assert {"config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"} <= files
    assert any(f.endswith(".safetensors") for f in files) and "adapter_config.json" not in files
    merged, adapted = _merged_logits(str(out), tokenizer), _adapted_logits(tiny_model_dir, lora_adapter, tokenizer)
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=0)
    # The adapter really changes the model, so equality above is not the base matching itself.
    assert (merged - _merged_logits(tiny_model_dir, tokenizer)).abs().max() > 1e-2


def test_qlora_trained_adapter_merges_into_unquantized_base(tiny_model_dir, tokenizer, tmp_path):
    from tunesmith.sft.command import run as sft_main

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]}) + "\n"
        for i in range(4)))
    adapter = tmp_path / "qlora"
    sft_main(["--model_name_or_path", tiny_model_dir, "--data_path", str(data), "--output_dir", str(adapter),
              "--quantization_bit", "4", "--max_steps", "3", "--learning_rate", "1e-2", "--lora_r", "4",
              "--per_device_train_batch_size", "2", "--save_strategy", "no", "--plot_loss", "false",
              "--report_to", "none"])

    trained = json.loads((adapter / "tunesmith_config.json").read_text())
    assert trained["ModelArguments"]["quantization_bit"] == 4

    out = tmp_path / "merged"
    result = main(["--adapter_name_or_path", str(adapter), "--output_dir", str(out)])

    assert result.max_abs_diff < 1e-4
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    merged = _merged_logits(str(out), tokenizer)
    torch.testing.assert_close(merged, _adapted_logits(tiny_model_dir, str(adapter), tokenizer), atol=1e-4, rtol=0)
    assert (merged - _merged_logits(tiny_model_dir, tokenizer)).abs().max() > 1e-3  # training moved the adapter


def test_reward_adapter_merge_keeps_scores(tiny_model_dir, tokenizer, tmp_path):
    adapter = _make_adapter(tiny_model_dir, tokenizer, str(tmp_path / "rm"), task="reward")
    with torch.no_grad():
        # The base's own score head is freshly random at each load: the trained one must come from
        # the adapter (modules_to_save) for the scores to match.
        base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
        expected = PeftModel.from_pretrained(base, adapter).eval()(_ids(tokenizer)).logits

    out = tmp_path / "merged"
    result = main(["--adapter_name_or_path", adapter, "--output_dir", str(out)])

    assert result.task == "reward"
    merged = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert merged.config.num_labels == 1
    with torch.no_grad():
        torch.testing.assert_close(merged(_ids(tokenizer)).logits, expected, atol=1e-5, rtol=0)


def _gpt2_dir(path, tokenizer) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=1, n_head=4)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("make_base", [
    lambda path, tok: build_tiny_model_dir(path, tok, hidden_size=32),  # different hidden size
    _gpt2_dir,  # no q_proj/v_proj/... modules to put the adapter on
], ids=["hidden_size", "target_modules"])
def test_merge_refuses_a_base_the_adapter_does_not_fit(make_base, lora_adapter, tokenizer, tmp_path):
    base = make_base(tmp_path / "other", tokenizer)
    out = tmp_path / "merged"
    with pytest.raises(MergeError, match=f"adapter {lora_adapter} does not fit base model {base}"):
        main(["--adapter_name_or_path", lora_adapter, "--model_name_or_path", base, "--output_dir", str(out)])
    assert not out.exists()


def test_merge_refuses_a_tokenizer_larger_than_the_base_vocab(lora_adapter, tiny_model_dir, tokenizer, tmp_path):
    import shutil

    adapter = tmp_path / "grown"
    shutil.copytree(lora_adapter, adapter)
    from transformers import AutoTokenizer

    grown = AutoTokenizer.from_pretrained(adapter)
    grown.add_tokens(["<|new_token|>"])
    grown.save_pretrained(adapter)
    with pytest.raises(MergeError, match=r"does not fit base model .*vocab mismatch"):
        main(["--adapter_name_or_path", str(adapter), "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "m")])


def test_failed_merge_leaves_no_output(lora_adapter, tmp_path):
    out = tmp_path / "merged"
    # A zero tolerance cannot be met in bfloat16: the check fails after everything has been written.
    with pytest.raises(MergeError, match=r"differs from base .* \+ adapter by .*tolerance 0 for bfloat16"):
        main(["--adapter_name_or_path", lora_adapter, "--output_dir", str(out), "--dtype", "bfloat16", "--tolerance", "0"])
    assert os.listdir(tmp_path) == []  # neither the output nor the temporary folder

    out.mkdir()
    (out / "keep.txt").write_text("old result")
    with pytest.raises(MergeError):
        main(["--adapter_name_or_path", lora_adapter, "--output_dir", str(out), "--dtype", "bfloat16", "--tolerance", "0",
              "--overwrite_output_dir"])
    assert os.listdir(tmp_path) == ["merged"] and os.listdir(out) == ["keep.txt"]


def test_merge_overwrites_only_when_asked(lora_adapter, tmp_path):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("old result")
    with pytest.raises(ConfigError, match="exists and is not empty: choose another, or pass --overwrite_output_dir"):
        main(["--adapter_name_or_path", lora_adapter, "--output_dir", str(out)])
    main(["--adapter_name_or_path", lora_adapter, "--output_dir", str(out), "--overwrite_output_dir"])
    assert "keep.txt" not in os.listdir(out) and "config.json" in os.listdir(out)
    assert os.listdir(tmp_path) == ["merged"]


def test_merge_needs_an_adapter_dir(tiny_model_dir, tmp_path):
    with pytest.raises(PathError, match=f"--adapter_name_or_path {tiny_model_dir}: no adapter_config.json there"):
        main(["--adapter_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "m")])


def test_merging_onto_a_merge_of_the_same_adapter_is_refused(lora_adapter, tiny_model_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(os.path.dirname(lora_adapter))
    merged = tmp_path / "merged"
    main(["--adapter_name_or_path", os.path.basename(lora_adapter), "--output_dir", str(merged)])
    # The record names the adapter absolutely, so it is recognised from any folder.
    record = json.loads((merged / "tunesmith_config.json").read_text())["ModelArguments"]
    assert record["adapter_name_or_path"] == lora_adapter and record["model_name_or_path"] == tiny_model_dir

    monkeypatch.chdir(tmp_path)
    caplog.clear()
    with pytest.raises(ConfigError, match=rf"--model_name_or_path {merged} already has {lora_adapter} merged into it "
                                          rf".*would apply it twice.*original base \({tiny_model_dir}\)"):
        main(["--model_name_or_path", str(merged), "--adapter_name_or_path", lora_adapter,
              "--output_dir", str(tmp_path / "twice")])
    assert not (tmp_path / "twice").exists()
    assert caplog.records == []  # the refusal is the one message, not a base-mismatch warning before it


def test_a_base_other_than_the_recorded_one_is_warned_about(lora_adapter, tiny_model_dir, tmp_path, caplog):
    import shutil

    copy = shutil.copytree(tiny_model_dir, tmp_path / "same-weights")
    result = main(["--model_name_or_path", str(copy), "--adapter_name_or_path", lora_adapter,
                   "--output_dir", str(tmp_path / "merged")])
    assert result.max_abs_diff < 1e-4
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING" and r.name == "tunesmith.hparams.parser"]
    assert warning.getMessage().startswith(f"--model_name_or_path {copy} is not the base that {lora_adapter} was "
                                           f"trained on ({tiny_model_dir}, in its adapter_config.json)")
