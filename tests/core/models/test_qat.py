"""Quantization-aware training (--qat, tunesmith/models/qat.py) on tiny random models: fake quantization is on in
the training forward (it differs from the float forward by the quantization error), the converted model's forward
equals it (torchao's convert), full fine-tuning and LoRA (the merged weight fake-quantized) train and save a
quantized/ that from_pretrained reads back, and the refusals: the core's rows, export, merge and serve.

The stated tolerance: the converted model's logits equal the fake-quantized forward's within 1e-4 (float32; torchao
rounds both through the same quantization primitives, measured 0.0 here); the fake-quantized forward differs from
the float one by more than 1e-2 somewhere (the int4 rounding error on weights of initializer_range 0.2: about 4 in
the logits here)."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("torchao")

from tunesmith.errors import ConfigError, PathError  # noqa: E402
from tunesmith.hparams import parse_run  # noqa: E402

DEMO = "data/demo/sft.jsonl"
EQUAL = 1e-4  # converted vs fake-quantized logits
QUANTIZATION_ERROR = 1e-2  # fake-quantized vs float logits, at least, somewhere
SCHEMES = ["int8_int4", "int4"]


@pytest.fixture(scope="module")
def qat_model_dir(tmp_path_factory, tokenizer) -> str:
    from tests.helpers.tiny_models import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("qat-llama"), tokenizer, initializer_range=0.2)


def _ids() -> torch.Tensor:
    return torch.randint(0, 4000, (2, 16), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits


@pytest.mark.parametrize("scheme", SCHEMES)
def test_full_model_trains_fake_quantized_and_converts_to_the_same_forward(qat_model_dir, scheme):
    from torchao.quantization import IntxUnpackedToInt8Tensor
    from transformers import AutoModelForCausalLM

    from tunesmith.models.qat import converted_copy, prepare_qat

    ids = _ids()
    model = AutoModelForCausalLM.from_pretrained(qat_model_dir).eval()
    float_logits = _logits(model, ids)
    prepare_qat(model, scheme, 32)
    fake = _logits(model, ids)
    assert (fake - float_logits).abs().max() > QUANTIZATION_ERROR
    model(input_ids=ids, labels=ids).loss.backward()  # the straight-through gradient reaches the weights
    assert model.model.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0

    converted = converted_copy(model)
    assert isinstance(converted.model.layers[0].self_attn.q_proj.weight, IntxUnpackedToInt8Tensor)
    assert type(converted.lm_head.weight.data) is torch.Tensor  # the head (tied to the embeddings) stays float
    torch.testing.assert_close(_logits(converted, ids), fake, atol=EQUAL, rtol=0)
    torch.testing.assert_close(_logits(model, ids), fake)  # the trained model is left fake-quantized


def test_lora_fake_quantizes_the_merged_weight(qat_model_dir):
    """The LoRA forward under --qat is torchao's quantized forward of the merged model W + s·B·A, not the quantized
    base plus a float adapter, and the adapter gets gradients through it."""
    from peft import LoraConfig, get_peft_model
    from torchao.quantization import quantize_
    from transformers import AutoModelForCausalLM

    from tunesmith.models.qat import base_config, prepare_qat, quantized_copy

    ids = _ids()
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(qat_model_dir),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                      init_lora_weights=False)).eval()
    float_logits = _logits(model, ids)
    # torchao's own post-training quantization of the merged float model, which --qat trains towards
    merged = quantized_copy(model, "int8_int4", 32)
    prepare_qat(model, "int8_int4", 32)
    fake = _logits(model, ids)
    assert (fake - float_logits).abs().max() > QUANTIZATION_ERROR
    torch.testing.assert_close(fake, _logits(merged, ids), atol=EQUAL, rtol=0)
    # the other reading, a quantized base plus a float adapter, is another forward
    base_plus_float = AutoModelForCausalLM.from_pretrained(qat_model_dir).eval()
    quantize_(base_plus_float, base_config("int8_int4", 32), filter_fn=lambda m, fqn: isinstance(
        m, torch.nn.Linear) and "lm_head" not in fqn)
    assert (fake - _logits(base_plus_float, ids)).abs().max() > QUANTIZATION_ERROR

    model(input_ids=ids, labels=ids).loss.backward()
    lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    assert lora_b.grad is not None and lora_b.grad.abs().sum() > 0


@pytest.mark.parametrize("finetuning_type", ["full", "lora"])
def test_sft_with_qat_trains_and_saves_a_quantized_model_that_reloads(qat_model_dir, tmp_path, monkeypatch,
                                                                      finetuning_type):
    from torchao.quantization import IntxUnpackedToInt8Tensor
    from transformers import AutoModelForCausalLM

    from tunesmith.sft.command import run

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    trainer = run(["--model_name_or_path", qat_model_dir, "--data_path", DEMO, "--output_dir", str(out),
                   "--finetuning_type", finetuning_type, "--qat", "int8_int4", "--lora_dropout", "0",
                   "--max_steps", "4", "--per_device_train_batch_size", "4", "--max_samples", "4",
                   "--max_seq_length", "96", "--learning_rate", "1e-2", "--train_sampling_strategy", "sequential",
                   "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none", "--seed", "0"])
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0], losses  # the same four rows every step: a working QAT run learns them

    quantized = out / "quantized"
    assert json.loads((quantized / "config.json").read_text())["quantization_config"]["quant_method"] == "torchao"
    reloaded = AutoModelForCausalLM.from_pretrained(quantized).eval()
    assert isinstance(reloaded.model.layers[1].mlp.up_proj.weight, IntxUnpackedToInt8Tensor)
    trained = trainer.accelerator.unwrap_model(trainer.model).eval()
    ids = _ids()
    torch.testing.assert_close(_logits(reloaded, ids), _logits(trained, ids), atol=EQUAL, rtol=0)
    # beside it, the run's usual output: the float model (full) or the adapter (LoRA)
    assert (out / ("model.safetensors" if finetuning_type == "full" else "adapter_model.safetensors")).is_file()


# ---------------------------------------------------------------- the refusals


@pytest.fixture
def torchao_dir(tmp_path) -> str:
    """A folder whose config.json says what a --qat run's quantized/ says (no weights needed: rows read no weight)."""
    folder = tmp_path / "quantized"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "float32",
        "quantization_config": {"quant_method": "torchao", "quant_type": {}}}))
    return str(folder)


SFT = ["--data_path", DEMO, "--output_dir", "unused"]


@pytest.mark.parametrize("flags, message", [
    (["--qat", "int4", "--quantization_bit", "4"], r"--qat int4 with --quantization_bit 4: QAT trains float"),
    (["--qat", "int4", "--finetuning_type", "prompt_tuning"], r"--qat with --finetuning_type prompt_tuning"),
    (["--qat", "int8_int4"], r"give --lora_dropout 0 \(got 0.05\)"),
    (["--qat", "int4", "--lora_dropout", "0", "--use_dora", "true"], r"--qat with --use_dora"),
    (["--qat", "int4", "--finetuning_type", "full", "--deepspeed", "configs/ds_zero3.json"],
     r"--qat with ZeRO-3: the conversion at the end"),
    (["--qat_group_size", "64"], r"--qat_group_size 64 is read with --qat only"),
    (["--qat", "int4", "--finetuning_type", "full", "--qat_group_size", "0"], r"--qat_group_size 0: give a positive"),
])
def test_the_qat_rows(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run("sft", SFT + flags, check_paths=False)


def test_the_qat_flags_are_also_pt_s():
    with pytest.raises(ConfigError, match=r"give --lora_dropout 0"):
        parse_run("pt", ["--data_path", "x.txt", "--output_dir", "unused", "--qat", "int4"], check_paths=False)


def test_qat_without_torchao_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ConfigError, match=r"--qat int4 needs torchao: pip install 'tunesmith\[qat\]'"):
        parse_run("sft", SFT + ["--qat", "int4", "--finetuning_type", "full"], check_paths=False)


def test_a_group_size_that_does_not_divide_a_layer_is_named(qat_model_dir):
    from transformers import AutoModelForCausalLM

    from tunesmith.models.qat import prepare_qat

    model = AutoModelForCausalLM.from_pretrained(qat_model_dir)
    with pytest.raises(ConfigError, match=r"--qat_group_size 48 does not divide the 64 inputs of model.layers.0"):
        prepare_qat(model, "int4", 48)


def test_a_quantized_model_is_not_trained_again_nor_given_another_dtype(torchao_dir):
    with pytest.raises(ConfigError, match=r"is a torchao-quantized model \(a --qat run's quantized/\): its int4"):
        parse_run("sft", ["--model_name_or_path", torchao_dir] + SFT, check_paths=False)
    with pytest.raises(ConfigError, match=r"--dtype bfloat16: .* tensors compute in float32"):
        parse_run("chat", ["--model_name_or_path", torchao_dir, "--dtype", "bfloat16"], check_paths=False)


def test_export_refuses_a_torchao_model_in_one_line(torchao_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"export: .* is torchao-quantized .* GGUF has no type for torchao's int4"):
        parse_run("export", ["--model_name_or_path", torchao_dir, "--output_file", str(tmp_path / "m.gguf")],
                  check_paths=False)


def test_merge_refuses_a_torchao_base_in_one_line(torchao_dir, tmp_path):
    os.makedirs(tmp_path / "adapter")
    with pytest.raises((ConfigError, PathError), match=r"merge: .* is torchao-quantized .* merge into the float base"):
        parse_run("merge", ["--model_name_or_path", torchao_dir, "--adapter_name_or_path", str(tmp_path / "adapter"),
                            "--output_dir", str(tmp_path / "merged")], check_paths=False)


def test_serve_refuses_adapters_over_a_torchao_model_in_one_line(torchao_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"is torchao-quantized .* serves as it is, without adapters"):
        parse_run("serve", ["--model_name_or_path", torchao_dir, "--adapter_name_or_path", str(tmp_path)],
                  check_paths=False)


def test_the_engine_serves_a_quantized_model(qat_model_dir, tokenizer, tmp_path):
    """What `tunesmith serve` and `chat` run: the loader reads quantized/ (in the dtype its tensors were made in) and
    the engine's greedy tokens are those of the converted model's own forward."""
    from transformers import AutoModelForCausalLM

    from tunesmith.generation.engine import Engine
    from tunesmith.generation.sampling import SamplingParams
    from tunesmith.models.loader import inference_model_args, load_for_inference
    from tunesmith.models.qat import prepare_qat, save_quantized

    model = prepare_qat(AutoModelForCausalLM.from_pretrained(qat_model_dir), "int4", 32)
    folder = save_quantized(model, tmp_path, tokenizer)
    served, tokenizer = load_for_inference(inference_model_args(str(folder)))
    prompt = [1, 2, 3, 4, 5]
    [[completion]] = Engine(served, tokenizer).generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))
    ids = torch.tensor([prompt])
    for token in completion.token_ids:  # greedy by hand on the converted forward
        assert token == int(_logits(served, ids)[0, -1].argmax())
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)


def test_the_web_ui_train_form_sets_qat():
    from tunesmith.ui.command_lines import QAT_SCHEMES, TrainForm, train_flags

    assert QAT_SCHEMES == ("int8_int4", "int4")
    command, flags = train_flags(TrainForm(dataset="d.jsonl", method="full", qat="int8_int4"))
    assert parse_run(command, flags, check_paths=False).qat.qat == "int8_int4"
    assert "--qat" not in train_flags(TrainForm(dataset="d.jsonl"))[1]
