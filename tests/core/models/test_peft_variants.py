"""PEFT's LoRA variants through tunesmith's flags (--use_dora, --use_rslora, --init_lora_weights,
--loraplus_lr_ratio): each reaches PEFT's LoraConfig; SFT, reward and DPO train with it; the saved adapter loads in
plain PEFT on the unchanged base and gives the trained model's logits (PiSSA/OLoRA after their conversion to a plain
LoRA); merging equals base + adapter; QLoRA takes the variants PEFT supports and the rest are refused in one line;
LoRA+ trains B at its own rate; a run resumes with its variant and refuses another; DoRA's adapter-only GGUF is
refused with a pointer to the merged export."""

from __future__ import annotations

import json
import math

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from tests.helpers.rows import POLITE, RUDE, write_jsonl
from tunesmith.data.template import encode_conversation
from tunesmith.errors import ConfigError
from tunesmith.hparams import FinetuningArguments, ModelArguments, parse_run
from tunesmith.merge.command import run as merge
from tunesmith.models.loader import load_model
from tunesmith.preference import command as dpo
from tunesmith.preference import reward
from tunesmith.sft.command import run as sft
from tunesmith.train.param_groups import split_lora_groups

CONVERSATION = [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "2 plus 3 is 5."}]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> str:
    rows = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                          {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
            for a in range(3) for b in range(3)]
    return write_jsonl(tmp_path_factory.mktemp("data") / "sft.jsonl", rows)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    questions = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice."]
    rows = [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]} for i, q in enumerate(questions)]
    return write_jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", rows)


def sft_flags(model_dir: str, data: str, out, *extra: str) -> list[str]:
    # float32 throughout (--bf16 false), so that the reloaded adapter is compared with the trained model exactly
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--max_steps", "3",
            "--per_device_train_batch_size", "3", "--learning_rate", "2e-2", "--lora_r", "4", "--lora_alpha", "8",
            "--lora_dropout", "0", "--bf16", "false", "--save_strategy", "no", "--plot_loss", "false",
            "--report_to", "none", "--seed", "0", *extra]


def _ids(tokenizer) -> torch.Tensor:
    return torch.tensor([encode_conversation(tokenizer, CONVERSATION).input_ids])


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids).logits.float()


def test_flags_reach_peft_lora_config(tiny_model_dir):
    model = load_model(ModelArguments(model_name_or_path=tiny_model_dir, dtype="float32"),
                       FinetuningArguments(lora_r=4, lora_alpha=8, use_dora=True, use_rslora=True,
                                           init_lora_weights="gaussian"))
    config = model.peft_config["default"]
    assert config.use_dora and config.use_rslora and config.init_lora_weights == "gaussian"
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(8 / math.sqrt(4))  # rsLoRA: alpha / sqrt(r), not alpha / r
    assert "default" in layer.lora_magnitude_vector  # DoRA's trained magnitudes
    default = load_model(ModelArguments(model_name_or_path=tiny_model_dir, dtype="float32"), FinetuningArguments())
    assert default.peft_config["default"].init_lora_weights is True and not default.peft_config["default"].use_dora


def test_loraplus_groups_put_b_and_doras_magnitudes_at_ratio_times_the_lora_rate(tiny_model_dir):
    model = load_model(ModelArguments(model_name_or_path=tiny_model_dir, dtype="float32"),
                       FinetuningArguments(lora_r=4, use_dora=True), task="reward")
    named = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    groups = [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": 0.0}]
    rates = {named[id(p)]: g["lr"] for g in split_lora_groups(groups, model, 1e-3, 2e-3, 16.0) for p in g["params"]}
    assert rates and all(
        rate == (32e-3 if ".lora_B." in name or "lora_magnitude_vector" in name else 2e-3 if ".lora_A." in name
                 else 1e-3) for name, rate in rates.items())
    assert any("score" in name and rate == 1e-3 for name, rate in rates.items())  # the head keeps --learning_rate


VARIANTS = {
    "dora": ("--use_dora", "true"),
    "gaussian": ("--init_lora_weights", "gaussian"),
    "orthogonal": ("--init_lora_weights", "orthogonal"),
    "pissa": ("--init_lora_weights", "pissa"),
    "pissa_niter": ("--init_lora_weights", "pissa_niter_2", "--use_rslora", "true"),  # rsLoRA's alpha through the conversion
    "olora": ("--init_lora_weights", "olora"),
    "dora_pissa": ("--use_dora", "true", "--init_lora_weights", "pissa"),  # the magnitudes kept through the conversion
    "loraplus": ("--loraplus_lr_ratio", "8"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_sft_variant_saves_an_adapter_plain_peft_loads_and_merge_reproduces(variant, tiny_model_dir, tokenizer,
                                                                           sft_data, tmp_path):
    out = tmp_path / "out"
    trainer = sft(sft_flags(tiny_model_dir, sft_data, out, *VARIANTS[variant]))
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    ids = _ids(tokenizer)
    trained = _logits(trainer.model, ids)

    saved = json.loads((out / "adapter_config.json").read_text())
    splits = variant in ("pissa", "pissa_niter", "olora", "dora_pissa")
    # PiSSA/OLoRA: PEFT's conversion to a plain LoRA of the unchanged base, rank 2r
    assert saved["r"] == (8 if splits else 4) and saved["init_lora_weights"] in (True, "gaussian", "orthogonal")
    assert saved["use_dora"] == ("--use_dora" in VARIANTS[variant])
    assert saved["use_rslora"] == ("--use_rslora" in VARIANTS[variant])
    record = json.loads((out / "tunesmith_config.json").read_text())["FinetuningArguments"]
    assert record["loraplus_lr_ratio"] == (8.0 if variant == "loraplus" else None)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = PeftModel.from_pretrained(base, str(out))  # plain PEFT, on the base as saved on disk
    torch.testing.assert_close(_logits(plain, ids), trained, atol=2e-4, rtol=0)
    untouched = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ids)
    assert (trained - untouched).abs().max() > 1e-2  # the adapter changed the model

    result = merge(["--adapter_name_or_path", str(out), "--output_dir", str(tmp_path / "merged")])
    assert result.max_abs_diff < 1e-4
    if variant == "pissa":  # converted, a plain LoRA: llama.cpp's adapter GGUF takes it
        from tunesmith.export.command import run as export

        export(["--model_name_or_path", str(out), "--output_file", str(tmp_path / "a.gguf"), "--dtype", "f32",
                "--adapter_only"])
        assert (tmp_path / "a.gguf").stat().st_size > 0
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), ids), trained,
                               atol=2e-4, rtol=0)


def test_loraplus_moves_b_by_ratio_times_the_rate_in_the_first_step(tiny_model_dir, sft_data, tmp_path):
    """Adam's first step moves each weight with a gradient by about its rate: B (zero at the start, the only LoRA
    matrix with a gradient then) by ratio x --learning_rate."""
    trainer = sft(sft_flags(tiny_model_dir, sft_data, tmp_path / "out", "--max_steps", "1", "--learning_rate", "1e-3",
                            "--loraplus_lr_ratio", "16", "--lr_scheduler_type", "constant", "--weight_decay", "0"))
    b_step = max(p.detach().abs().max().item() for n, p in trainer.model.named_parameters() if ".lora_B." in n)
    assert b_step == pytest.approx(16e-3, rel=0.05)


@pytest.mark.parametrize("stage", ["reward", "dpo"])
@pytest.mark.parametrize("variant", [("--use_dora", "true", "--use_rslora", "true", "--loraplus_lr_ratio", "4"),
                                     ("--init_lora_weights", "pissa_niter_2")], ids=["dora_rslora_loraplus", "pissa"])
def test_reward_and_dpo_train_with_the_variant_and_plain_peft_loads_it(stage, variant, tiny_model_dir, tokenizer,
                                                                      pairs, tmp_path):
    out = tmp_path / stage
    run = reward.run if stage == "reward" else dpo.run
    if stage == "dpo" and "pissa_niter_2" in variant:
        variant = (*variant, "--loss_type", "simpo")  # a reference loss would score against the residual base
    trainer = run(["--model_name_or_path", tiny_model_dir, "--data_path", pairs, "--output_dir", str(out),
                   "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0", "--max_seq_length", "64",
                   "--per_device_train_batch_size", "4", "--max_steps", "2", "--learning_rate", "1e-2",
                   "--bf16", "false", "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false",
                   *variant])
    assert all(math.isfinite(r["loss"]) for r in trainer.state.log_history if "loss" in r)
    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["use_dora"] == ("--use_dora" in variant) and saved["r"] == (8 if "pissa_niter_2" in variant else 4)
    ids = _ids(tokenizer)
    if stage == "reward":
        base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
        # the score head's output is only as wide as one number: compare the scores
        want = trainer.model.eval()(ids).logits.detach()
    else:
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        want = _logits(trainer.model, ids)
    plain = PeftModel.from_pretrained(base, str(out)).eval()
    torch.testing.assert_close(plain(ids).logits.detach().float(), want.float(), atol=2e-4, rtol=0)


@pytest.mark.parametrize("variant", [("--use_dora", "true", "--use_rslora", "true", "--loraplus_lr_ratio", "4"),
                                     ("--init_lora_weights", "orthogonal")],
                         ids=["dora_rslora_loraplus", "orthogonal"])
def test_qlora_takes_the_variants_peft_supports_and_merges_into_the_unquantized_base(variant, tiny_model_dir,
                                                                                    sft_data, tmp_path):
    out = tmp_path / "qlora"
    trainer = sft(sft_flags(tiny_model_dir, sft_data, out, "--quantization_bit", "4", *variant))
    assert all(math.isfinite(r["loss"]) for r in trainer.state.log_history if "loss" in r)
    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["use_dora"] == ("--use_dora" in variant)
    assert saved["init_lora_weights"] == ("orthogonal" if "orthogonal" in variant else True)
    result = merge(["--adapter_name_or_path", str(out), "--output_dir", str(tmp_path / "merged")])
    assert result.max_abs_diff < 1e-4  # merged = the adapter on the unquantized base


@pytest.mark.parametrize("argv, message", [
    (("--init_lora_weights", "loftq"), r"--init_lora_weights loftq is not offered: LoftQ quantizes the base itself.*"
                                       r"--model_name_or_path BASE --adapter_name_or_path ADAPTER"),
    (("--init_lora_weights", "pissa", "--quantization_bit", "4"),
     r"--init_lora_weights pissa with --quantization_bit: the residual base .* --model_name_or_path RESIDUAL "
     r"--adapter_name_or_path ADAPTER, or drop --quantization_bit"),
    (("--init_lora_weights", "olora", "--quantization_bit", "8"), r"--init_lora_weights olora with --quantization_bit"),
    (("--init_lora_weights", "eva"), r"--init_lora_weights must be one of true, gaussian, pissa, pissa_niter_N .*"
                                     r"\(got eva\)"),
    (("--init_lora_weights", "pissa_niter_x"), r"\(got pissa_niter_x\)"),
    (("--init_lora_weights", "orthogonal", "--lora_r", "5"), r"orthogonal needs an even --lora_r \(got 5\)"),
    (("--init_lora_weights", "orthogonal", "--quantization_bit", "8"),
     r"--init_lora_weights orthogonal with --quantization_bit 8: .* int8 on an 8-bit base"),
    (("--use_dora", "true", "--finetuning_type", "full"),
     r"--use_dora is a LoRA setting, and --finetuning_type full trains no LoRA adapter"),
    (("--loraplus_lr_ratio", "4", "--finetuning_type", "prompt_tuning"), r"--loraplus_lr_ratio is a LoRA setting"),
    (("--loraplus_lr_ratio", "0"), r"--loraplus_lr_ratio must be > 0 \(got 0.0\)"),
    (("--init_lora_weights", "pissa", "--fsdp", "full_shard"), r"cannot be used with ZeRO-3 or FSDP"),
])
def test_what_peft_or_tunesmith_cannot_do_is_refused_in_one_line(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_run("sft", ["--data_path", "x.jsonl", *argv], check_paths=False)


def test_dpo_refuses_a_residual_init_against_a_reference():
    with pytest.raises(ConfigError, match=r"--init_lora_weights olora with --loss_type sigmoid: the reference of a new "
                                          r"adapter is the model with its adapter switched off"):
        parse_run("dpo", ["--data_path", "x.jsonl", "--init_lora_weights", "olora"], check_paths=False)
    parse_run("dpo", ["--data_path", "x.jsonl", "--init_lora_weights", "olora", "--loss_type", "orpo"],
              check_paths=False)


def test_ppo_refuses_loraplus():
    with pytest.raises(ConfigError, match=r"--loraplus_lr_ratio is for SFT, reward and DPO runs, not PPO/GRPO"):
        parse_run("ppo", ["--data_path", "x.jsonl", "--reward_funcs", "length", "--loraplus_lr_ratio", "4"],
                  check_paths=False)


def test_continuing_an_adapter_refuses_a_variant_it_was_not_trained_with(tiny_model_dir, tmp_path):
    adapter = tmp_path / "plain"
    load_model(ModelArguments(model_name_or_path=tiny_model_dir), FinetuningArguments(lora_r=4)).save_pretrained(adapter)
    base = ["--model_name_or_path", tiny_model_dir, "--adapter_name_or_path", str(adapter), "--data_path", "x.jsonl"]
    with pytest.raises(ConfigError, match=rf"--use_dora true, but the adapter {adapter} this run continues was "
                                          r"trained without it"):
        parse_run("dpo", [*base, "--use_dora", "true"], check_paths=False)
    with pytest.raises(ConfigError, match=r"--init_lora_weights pissa starts a new adapter"):
        parse_run("dpo", [*base, "--init_lora_weights", "pissa"], check_paths=False)
    parse_run("dpo", [*base, "--loraplus_lr_ratio", "4"], check_paths=False)  # a rate: fine on a continued adapter


def test_resume_continues_a_dora_pissa_loraplus_run_and_refuses_another_variant(tiny_model_dir, sft_data, tmp_path):
    common = ("--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--per_device_train_batch_size", "2",
              "--lr_scheduler_type", "constant", "--use_dora", "true", "--init_lora_weights", "pissa_niter_2",
              "--loraplus_lr_ratio", "4")
    straight = sft(sft_flags(tiny_model_dir, sft_data, tmp_path / "straight", *common))
    sft(sft_flags(tiny_model_dir, sft_data, tmp_path / "resumed", *common, "--max_steps", "2"))  # "killed" at step 2
    checkpoint = json.loads((tmp_path / "resumed" / "checkpoint-2" / "adapter_config.json").read_text())
    assert checkpoint["r"] == 4 and checkpoint["init_lora_weights"] == "pissa_niter_2"  # unconverted: it resumes
    with pytest.raises(ConfigError, match=r"use_dora: true -> false"):
        sft(sft_flags(tiny_model_dir, sft_data, tmp_path / "resumed", *common, "--use_dora", "false"))
    resumed = sft(sft_flags(tiny_model_dir, sft_data, tmp_path / "resumed", *common))
    losses = [[r["loss"] for r in t.state.log_history if "loss" in r] for t in (straight, resumed)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4) and len(losses[0]) == 4
    from safetensors.torch import load_file
    final = [load_file(tmp_path / name / "adapter_model.safetensors") for name in ("straight", "resumed")]
    assert final[0].keys() == final[1].keys()
    assert all(torch.allclose(final[0][k], final[1][k], atol=1e-5) for k in final[0])


@pytest.fixture(scope="module")
def dora_adapter(tiny_model_dir, sft_data, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dora")
    sft(sft_flags(tiny_model_dir, sft_data, out, "--use_dora", "true", "--max_steps", "1"))
    return str(out)


def test_doras_adapter_gguf_is_refused_with_a_pointer_to_the_merged_export(dora_adapter, tmp_path):
    from tunesmith.export.command import run as export

    with pytest.raises(ConfigError, match=r"this one sets use_dora, which llama.cpp's adapter GGUF does not carry: "
                                          r"export it merged \(leave out --adapter_only\)"):
        export(["--model_name_or_path", dora_adapter, "--output_file", str(tmp_path / "a.gguf"), "--dtype", "f16",
                "--adapter_only"])
    assert not (tmp_path / "a.gguf").exists()


@pytest.mark.heavy  # 20 s, most of it the read-back check of the written file
def test_doras_merged_export_writes_and_reads_back(dora_adapter, tmp_path):
    from tunesmith.export.command import run as export

    result = export(["--model_name_or_path", dora_adapter, "--output_file", str(tmp_path / "m.gguf"), "--dtype", "f16"])
    assert (tmp_path / "m.gguf").stat().st_size > 0 and result.round_trip.token_mismatch is None


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_plan_sizes_a_pissa_or_olora_run_like_a_lora_run(init, tmp_path):
    """`tunesmith plan` builds the model without weights, which PiSSA/OLoRA cannot decompose: the adapter it sizes
    has LoRA's shapes."""
    from tests.features.plan.test_plan import config_dir, planned

    split = planned(config_dir(tmp_path / init), "--init_lora_weights", init)
    plain = planned(config_dir(tmp_path / "lora"))
    assert split.model.peft_config["default"].init_lora_weights is True
    assert sum(p.numel() for p in split.model.parameters() if p.requires_grad) == \
        sum(p.numel() for p in plain.model.parameters() if p.requires_grad) > 0
