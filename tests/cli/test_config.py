"""Run configs and flags: every shipped config loads, flags override files, and combinations that
cannot work stop before any weight is loaded with a message that says what to change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from tunesmith.errors import ConfigError
from tunesmith.hparams import RUN_ARGUMENTS, parse_run
from tunesmith.hparams.parser import Parser

ROOT = Path(__file__).resolve().parents[2]


def parse_sft(*argv: str) -> dict:
    run = parse_run("sft", list(argv), check_paths=False)
    return {"model": run.model, "data": run.data, "finetuning": run.finetuning, "training": run.training}


def stage(config: Path) -> str:
    """The kind of run a config belongs to (its file name says which; GRPO is a run of the RL stage, ppo)."""
    kind = next((kind for kind in ("reward", "ppo", "dpo", "grpo", "pt_", "distill") if config.name.startswith(kind)),
                "sft")
    kind = kind.rstrip("_")  # pt_: continued pre-training (a config named pt... of another stage would be misread)
    return "ppo" if kind == "grpo" else kind


# accelerate config files (for `accelerate launch --config_file`, and --fsdp_config), not run configs
LAUNCH_CONFIGS = sorted((ROOT / "configs").rglob("fsdp*.yaml"))
RUN_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*")
                     if p.suffix in (".yaml", ".yml") and p not in LAUNCH_CONFIGS)
DS_CONFIGS = sorted((ROOT / "configs").rglob("ds_*.json"))


def test_configs_are_found():
    assert len(RUN_CONFIGS) >= 3 and len(DS_CONFIGS) == 5 and len(LAUNCH_CONFIGS) == 1


@pytest.mark.parametrize("config", RUN_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_run_config_loads(config):
    parsed = parse_run(stage(config), [str(config)], check_paths=False)
    for path in parsed.data.data_path:
        assert Path(path).exists(), f"{config.name}: data_path {path} does not exist"


@pytest.mark.parametrize("config", DS_CONFIGS, ids=lambda p: p.name)
def test_every_deepspeed_config_is_accepted_by_the_trainer(config):
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    ds = HfTrainerDeepSpeedConfig(str(config))
    stage = json.loads(config.read_text())["zero_optimization"]["stage"]
    assert ds.get_value("zero_optimization.stage") == stage
    if stage == 3:
        assert ds.get_value("zero_optimization.stage3_gather_16bit_weights_on_model_save") is True


@pytest.mark.parametrize("config", LAUNCH_CONFIGS, ids=lambda p: p.name)
def test_every_fsdp_config_serves_accelerate_launch_and_fsdp_config(config):
    """The same file is accelerate's launch config and, through --fsdp_config, the Trainer's FSDP settings."""
    from accelerate.commands.config.config_args import load_config_from_file

    launch = load_config_from_file(str(config))
    assert launch.distributed_type == "FSDP" and launch.fsdp_config["fsdp_version"] == 2
    training = parse_sft("--data_path", "x.jsonl", "--fsdp_config", str(config))["training"]
    assert training.fsdp is True
    assert training.fsdp_plugin_args["fsdp_version"] == 2
    assert training.fsdp_plugin_args["state_dict_type"] == "FULL_STATE_DICT"  # saves load with plain transformers


def test_flags_after_the_config_file_win(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data_path: [a.jsonl, b.jsonl]\nlora_r: 8\nlearning_rate: 1.0e-3\ngradient_checkpointing: true\n")
    args = parse_sft(str(config), "--lora_r", "4")
    assert args["finetuning"].lora_r == 4
    assert args["training"].learning_rate == 1e-3 and args["training"].gradient_checkpointing is True
    assert args["data"].data_path == ["a.jsonl", "b.jsonl"]


def test_json_config_and_bad_config(tmp_path):
    good = tmp_path / "run.json"
    good.write_text(json.dumps({"data_path": ["x.jsonl"], "max_seq_length": 64}))
    assert parse_sft(str(good))["data"].max_seq_length == 64
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_sft(str(bad))


def test_cpu_default_and_training_defaults():
    import torch

    args = parse_sft("--data_path", "x.jsonl")
    assert args["training"].use_cpu is (not torch.cuda.is_available())
    assert args["training"].remove_unused_columns is False


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--quantization_bit", "3"), r"--quantization_bit must be 4 or 8 \(got 3\)"),
        (("--quantization_bit", "4", "--finetuning_type", "full"), r"use --finetuning_type lora"),
        (("--quantization_bit", "8", "--deepspeed", str(ROOT / "configs/ds_zero3.json")),
         r"ZeRO-3 cannot partition 8-bit bitsandbytes weights: use --quantization_bit 4"),
        (("--deepspeed", "nope.json"), r"--deepspeed nope.json: no such file \(shipped: configs/ds_zero2.json"),
        (("--fsdp_config", "nope.yaml"), r"--fsdp_config nope.yaml: no such file \(shipped: configs/fsdp2.yaml\)"),
        (("--fsdp_config", str(ROOT / "configs/fsdp2.yaml"), "--deepspeed", str(ROOT / "configs/ds_zero2.json")),
         r"FSDP \(--fsdp_config, or accelerate launch with an FSDP config\) and --deepspeed .* both shard the model"),
        (("--fsdp_config", str(ROOT / "configs/fsdp2.yaml"), "--quantization_bit", "8"),
         r"FSDP cannot shard 8-bit bitsandbytes weights .*: use --quantization_bit 4"),
        (("--val_size", "1.5"), r"--val_size must be in \[0, 1\) \(got 1.5\)"),
        (("--lora_r", "0"), r"--lora_r must be a positive rank"),
        (("--attn_implementation", "flash_attention_2"), r"needs a CUDA GPU and the flash-attn package"),
        (("--adapter_name_or_path", "a", "--finetuning_type", "full"), r"continues a LoRA run"),
        (("--lora_learning_rate", "1e-4", "--finetuning_type", "full"), r"--finetuning_type full trains none"),
        (("--lora_learning_rate", "0"), r"--lora_learning_rate must be > 0"),
    ],
)
def test_incompatible_combinations_stop_early(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_sft("--data_path", "x.jsonl", *argv)


def test_accelerate_launch_with_fsdp_refuses_deepspeed_too(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch --config_file configs/fsdp2.yaml` sets
    with pytest.raises(ConfigError, match=r"FSDP .* and --deepspeed .* both shard the model: keep one"):
        parse_sft("--data_path", "x.jsonl", "--deepspeed", str(ROOT / "configs/ds_zero3.json"))


@pytest.mark.parametrize("setting, message", [
    ("fsdp_version: 1", r"FSDP version 1: tunesmith runs FSDP2 \(torch's fully_shard\) only; set fsdp_version: 2"),
    ("fsdp_version: 2\n  fsdp_state_dict_type: SHARDED_STATE_DICT",
     r"fsdp_state_dict_type SHARDED_STATE_DICT: .* set fsdp_state_dict_type: FULL_STATE_DICT"),
])
def test_fsdp_settings_tunesmith_cannot_save_or_run_are_refused(tmp_path, setting, message):
    config = tmp_path / "fsdp.yaml"
    config.write_text(f"distributed_type: FSDP\nfsdp_config:\n  {setting}\n")
    with pytest.raises(ConfigError, match=message):
        parse_sft("--data_path", "x.jsonl", "--fsdp_config", str(config))


def test_accelerate_launch_settings_are_checked_too(monkeypatch):
    """Under accelerate launch the FSDP settings arrive in the environment, with accelerate's defaults (FSDP1, and
    sharded saves for FSDP2) where its config leaves them out."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ConfigError, match=r"FSDP version 1: "):
        parse_sft("--data_path", "x.jsonl")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ConfigError, match=r"fsdp_state_dict_type SHARDED_STATE_DICT: "):
        parse_sft("--data_path", "x.jsonl")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
    assert parse_sft("--data_path", "x.jsonl")["training"].fsdp is None  # accelerate's plugin, from the environment


def test_ppo_under_fsdp_is_refused_naming_deepspeed():
    with pytest.raises(ConfigError, match=r"cannot run under FSDP: .* Use --deepspeed configs/ds_zero2.json or "
                                          r"configs/ds_zero3.json"):
        parse_run("ppo", ["--data_path", "x.jsonl", "--reward_funcs", "m:f", "--advantage", "grpo",
                          "--samples_per_prompt", "2", "--fsdp_config", str(ROOT / "configs/fsdp2.yaml")],
                  check_paths=False)


def test_missing_data_path():
    with pytest.raises(ConfigError, match="--data_path is required"):
        parse_sft()


def test_qlora_4bit_with_zero3_is_allowed():
    parse_sft("--data_path", "x.jsonl", "--quantization_bit", "4", "--deepspeed", str(ROOT / "configs/ds_zero3.json"))


def boolean_fields(kind: str) -> list[str]:
    """Every boolean field (bool, bool | None) of a run kind's dataclasses, TrainingArguments' own included."""
    names = []
    for dtype in RUN_ARGUMENTS[kind]:
        hints = get_type_hints(dtype)
        names += [f.name for f in dataclasses.fields(dtype)
                  if f.init and (hints[f.name] is bool or bool in get_args(hints[f.name]))]
    return names


def test_boolean_fields_are_found():
    assert {"disable_dropout", "bf16", "packing", "gradient_checkpointing"} <= set(boolean_fields("sft"))


@pytest.mark.parametrize("kind", RUN_ARGUMENTS)
def test_every_boolean_flag_works_bare_and_with_a_value(kind):
    """`--flag` alone means true, as HfArgumentParser and DeepSpeed-Chat users type it; `bool | None` fields
    (None: the stage decides) stopped with argparse's "expected one argument"."""
    parser = Parser(RUN_ARGUMENTS[kind])
    for name in boolean_fields(kind):
        for argv, value in (([f"--{name}"], True), ([f"--{name}", "false"], False), ([f"--{name}", "1"], True),
                            ([f"--{name}", "no"], False)):
            assert getattr(parser.parse_known_args(argv)[0], name) is value, f"{kind}: {' '.join(argv)}"


def test_a_bare_flag_before_another_flag_and_in_a_run_config(tmp_path):
    args = parse_sft("--data_path", "x.jsonl", "--disable_dropout", "--max_steps", "2")
    assert args["finetuning"].disable_dropout is True and args["training"].max_steps == 2
    assert parse_sft("--data_path", "x.jsonl", "--disable_dropout", "false")["finetuning"].disable_dropout is False
    assert parse_sft("--data_path", "x.jsonl")["finetuning"].disable_dropout is None  # the stage decides
    config = tmp_path / "run.yaml"
    config.write_text("data_path: x.jsonl\ndisable_dropout: false\n")
    assert parse_sft(str(config))["finetuning"].disable_dropout is False
    assert parse_sft(str(config), "--disable_dropout")["finetuning"].disable_dropout is True


def test_an_unknown_flag_after_a_bare_one_is_still_named():
    with pytest.raises(ConfigError, match=r"unknown flag --max_step \(did you mean --max_steps\?\)"):
        parse_sft("--data_path", "x.jsonl", "--disable_dropout", "--max_step", "2")


def test_qlora_checkpoints_by_default_on_a_gpu_only(monkeypatch):
    """--gradient_checkpointing left out: on for QLoRA SFT where a GPU trains, and on CPU for conversations longer than
    its forwards (not for prefix tuning, which cannot be checkpointed, nor under FSDP, whose config checkpoints); off
    for LoRA on a GPU, for shorter conversations on CPU and in the other stages; given, as given."""
    from tunesmith.hparams import SFTTrainingArguments
    from tunesmith.hparams.training_args import resolve_checkpointing

    def resolved(gpu: bool, kinds=(SFTTrainingArguments,), **values):
        monkeypatch.setattr("torch.cuda.is_available", lambda: gpu)
        values = {"gradient_checkpointing": None, "finetuning_type": "lora", "quantization_bit": 4, **values}
        note = resolve_checkpointing(values, kinds)
        return values["gradient_checkpointing"], note

    on, note = resolved(True)
    assert on is True and note.startswith("activation checkpointing on (QLoRA's default on a GPU")
    assert resolved(True, quantization_bit=None) == (False, None)
    assert resolved(False) == (False, None)
    on, note = resolved(False, max_seq_length=32768)  # on CPU, conversations longer than its forwards
    assert on is True and note.startswith("activation checkpointing on (--max_seq_length 32768 on CPU, above its 2048")
    assert resolved(False, max_seq_length=2048) == (False, None)
    assert resolved(True, use_cpu=True)[0] is False
    assert resolved(True, finetuning_type="prefix_tuning")[0] is False
    assert resolved(True, fsdp_config="configs/fsdp2.yaml")[0] is False
    assert resolved(True, gradient_checkpointing=False) == (False, None)
    assert resolved(True, gradient_checkpointing="offload") == ("offload", None)
    assert resolved(True, kinds=RUN_ARGUMENTS["dpo"])[0] is None  # DPO: transformers' default (off)
    # packed rows on a GPU: the forward budget chooses each layer's mode (train/layer_modes.py), QLoRA or not
    assert resolved(True, packing=True) == ("auto", None)
    assert resolved(True, packing=True, quantization_bit=None) == ("auto", None)
    assert resolved(True, packing=True, gradient_checkpointing="auto") == ("auto", None)
    assert resolved(True, packing=True, gradient_checkpointing=False) == (False, None)  # given: as given
    for fixed_forwards in ({"max_forward_tokens": 4096}, {"deepspeed": "configs/ds_zero2.json"},
                           {"sequence_parallel_size": 2}, {"fsdp_config": "configs/fsdp2.yaml"}):
        assert resolved(True, packing=True, quantization_bit=None, **fixed_forwards)[0] is False, fixed_forwards
    assert resolved(True, packing=True, max_forward_tokens=4096)[0] is True  # QLoRA's rule without the budget
    assert resolved(False, packing=True, gradient_checkpointing="auto") == (False, None)  # CPU: its own rule
