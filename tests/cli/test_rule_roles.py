"""Which rows apply to which command: a row declares the roles and fields it reads (Rule.roles, Rule.without), and
check() applies it to exactly the runs that have them. The refusals every command gives to a set of bad command
lines (taken from the table before the rows declared their fields, when each lambda guarded itself with getattr and
hasattr) stay the same; a field a row names must exist somewhere, and a row that reads what it did not declare
raises instead of being skipped."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from tunesmith.errors import ConfigError
from tunesmith.hparams import RUN_ARGUMENTS, DataArguments, SFTDataArguments, check, parse_run, rules
from tunesmith.hparams.rules import RULES, Rule
from tunesmith.hparams.run_kinds import feature_rules

ROOT = Path(__file__).resolve().parents[2]
DS2 = str(ROOT / "configs/ds_zero2.json")
# What each kind needs besides the bad flags to parse cleanly (a feature's required flags).
EXTRA = {"export": ["--output_file", "x.gguf"], "distill": ["--teacher_model_name_or_path", "t"],
         "score": ["--output_file", "s.jsonl"], "ppo": ["--reward_funcs", "exact_answer"],
         "eval_policy": ["--policy", "p", "--baseline", "b", "--reward_funcs", "exact_answer"],
         "eval": ["--tasks", "tunesmith_identity"], "compare": ["--adapter_name_or_path", "a"],
         "merge": ["--adapter_name_or_path", "a"]}
SP = ["--sequence_parallel_size", "2", "--deepspeed", DS2, "--packing", "true"]

# Each case: its flags, and the start of each kind's refusal ("ok": none); a kind not named refuses the flag as
# unknown. A case ending in "@2" runs as a launch of 2 processes, one ending in "!" checks paths too. (Vision
# folders: idefics3 is packable, gemma3 is not and has a reward-model class.)
CASES = {
    "streaming": (["--streaming", "true"], {
        "--streaming reads data of unknown length: give": "sft",
        "--streaming reads SFT conversations as training takes": "pt distill reward dpo inspect plan",
    }),
    "shuffle_buffer_alone": (["--shuffle_buffer", "5"], {
        "--shuffle_buffer 5 shuffles a --streaming run's": "sft pt distill reward dpo inspect plan",
    }),
    "shuffle_buffer_negative": (["--shuffle_buffer", "-1"], {
        "--shuffle_buffer -1 shuffles a --streaming run's": "sft pt distill reward dpo inspect plan",
    }),
    "streaming_shuffle_negative": (["--streaming", "true", "--shuffle_buffer", "-1"], {
        "--shuffle_buffer must be 0 (file order) or more": "sft distill plan",
        "--streaming reads SFT conversations as training takes": "pt reward dpo inspect",
    }),
    "max_forward_tokens_alone": (["--max_forward_tokens", "64"], {
        "--max_forward_tokens 64 splits packed batches: add": "sft distill inspect plan",
        "ok": "pt",
    }),
    "max_forward_tokens_negative": (["--packing", "true", "--max_forward_tokens", "-1"], {
        "--max_forward_tokens -1: give a number of tokens, or 0": "sft pt distill inspect plan",
    }),
    "max_forward_tokens_deepspeed": (["--packing", "true", "--max_forward_tokens", "64", "--deepspeed", DS2], {
        "--max_forward_tokens 64 cannot be used with": "sft pt distill plan",
    }),
    "val_size": (["--val_size", "1.5"], {
        "--val_size must be in [0, 1) (got 1.5): the share of": "sft pt distill reward dpo inspect plan",
    }),
    "val_size_and_eval_data_path": (["--val_size", "0.1", "--eval_data_path", "x.jsonl"], {
        "--val_size 0.1 and --eval_data_path both give": "sft pt distill reward dpo inspect plan",
    }),
    "eval_without_data": (["--eval_strategy", "steps", "--eval_steps", "10"], {
        "--eval_strategy steps has no evaluation data to": "sft pt distill reward dpo plan",
        "ok": "ppo",
    }),
    "max_seq_length": (["--max_seq_length", "4"], {
        "--max_seq_length must be at least 8 tokens (got 4).": "sft pt distill reward dpo score inspect plan",
    }),
    "data_weights": (["--data_weights", "1"], {
        "ok": "sft pt distill reward dpo ppo inspect plan",
        "--data_weights chooses the rows a training stage (or": "score eval_policy compare",
    }),
    "data_split": (["--data_split", "1,1,1"], {
        "ok": "sft distill reward dpo ppo inspect plan",
        "--data_split shares one dataset among SFT, reward/DPO": "pt",
        "--data_split chooses the rows a training stage (or": "score eval_policy compare",
    }),
    "data_split_numbers": (["--data_split", "1,1"], {
        "--data_split 1,1: give three numbers >= 0, not all 0,": "sft pt distill reward dpo ppo inspect plan",
        "--data_split chooses the rows a training stage (or": "score eval_policy compare",
    }),
    "max_samples": (["--max_samples", "0"], {
        "--max_samples must be at least 1 (got 0); leave it out": "sft pt distill reward dpo score ppo eval_policy inspect plan compare",
    }),
    "sp_zero": (["--sequence_parallel_size", "0"], {
        "--sequence_parallel_size must be at least 1 (got 0); 1": "sft pt distill plan",
    }),
    "sp_no_deepspeed": (["--sequence_parallel_size", "2"], {
        "--sequence_parallel_size 2 runs on DeepSpeed's Ulysses:": "sft pt distill plan",
    }),
    "sp_no_packing": (["--sequence_parallel_size", "2", "--deepspeed", DS2], {
        "--sequence_parallel_size 2 needs --packing true: the": "sft distill plan",
        "--sequence_parallel_size 2: this launch has 1": "pt",
    }),
    "sp_world": (SP, {
        "--sequence_parallel_size 2: this launch has 1": "sft pt distill plan",
    }),
    "sp_label_smoothing@2": ([*SP, "--label_smoothing_factor", "0.1"], {
        "--label_smoothing_factor 0.1 with": "sft pt distill plan",
    }),
    "sp_vision@2": ([*SP, "--model_name_or_path", "idefics3"], {
        "--sequence_parallel_size with a vision-language model": "sft pt distill plan",
    }),
    "sp_fine@2": (SP, {
        "ok": "sft pt plan",
        "--sequence_parallel_size 2: tunesmith distill does not": "distill",
    }),
    "router": (["--router_aux_loss_coef", "0.01"], {
        "ok": "sft pt distill plan",
        "--router_aux_loss_coef weighs a mixture-of-experts": "reward dpo ppo",
    }),
    "prompt_label_smoothing": (["--finetuning_type", "prompt_tuning", "--label_smoothing_factor", "0.1"], {
        "--label_smoothing_factor cannot be used with": "sft distill ppo plan",
        "--packing cannot be used with --finetuning_type": "pt",
        "--finetuning_type prompt_tuning cannot train a reward": "reward",  # rows marked `first`: the stage first
        "--finetuning_type prompt_tuning cannot be used with DPO": "dpo",
    }),
    "prefix_label_smoothing": (["--finetuning_type", "prefix_tuning", "--label_smoothing_factor", "0.1"], {
        "ok": "sft plan",
        "--packing cannot be used with --finetuning_type": "pt",
        "--finetuning_type prefix_tuning cannot be distilled": "distill",
        "--finetuning_type prefix_tuning cannot train a reward": "reward",
        "--finetuning_type prefix_tuning cannot be used with": "dpo ppo",
    }),
    "prompt_packing": (["--finetuning_type", "prompt_tuning", "--packing", "true"], {
        "--packing cannot be used with --finetuning_type": "sft pt distill plan",
    }),
    "prompt_learning": (["--finetuning_type", "prompt_tuning"], {
        "ok": "sft plan",
        "--packing cannot be used with --finetuning_type": "pt",
        "--finetuning_type prompt_tuning cannot be distilled": "distill",
        "--finetuning_type prompt_tuning cannot train a reward": "reward",
        "--finetuning_type prompt_tuning cannot be used with": "dpo ppo",
    }),
    "max_prompt_length": (["--max_prompt_length", "0"], {
        "--max_prompt_length must be at least 1 token (got 0).": "ppo eval_policy chat compare",
    }),
    "max_image_pixels": (["--max_image_pixels", "0"], {
        "--max_image_pixels must be at least 1 pixel (got 0);": "sft pt distill reward dpo inspect plan",
    }),
    "max_row_bytes": (["--max_row_bytes", "10"], {
        "--max_row_bytes must be at least 1024 bytes (got 10).": "sft pt distill reward dpo score ppo eval_policy inspect plan compare",
    }),
    "top_k": (["--top_k", "-1"], {
        "--top_k must be >= 0 (got -1); 0 turns it off.": "ppo chat serve",
    }),
    "learning_rate": (["--learning_rate", "-1"], {
        "--learning_rate must be >= 0 (got -1.0); 2e-4 suits": "sft pt distill reward dpo ppo plan",
    }),
    "lora_alpha": (["--lora_alpha", "0"], {
        "--lora_alpha must be > 0 (got 0); the adapter's output": "sft pt distill reward dpo ppo plan",
    }),
    "batch": (["--per_device_train_batch_size", "0"], {
        "--per_device_train_batch_size must be at least 1 (got": "sft pt distill reward dpo ppo plan",
    }),
    "temperature": (["--temperature", "0"], {
        "--temperature must be positive (got 0.0); PPO needs a": "ppo",
        "ok": "eval_policy",
        "--temperature must be above 0 when sampling (got 0.0);": "chat serve",
    }),
    "vision": (["--model_name_or_path", "idefics3"], {
        "ok": "sft pt dpo score chat serve vllm_serve inspect plan eval compare",
        "GGUF export of a vision-language model writes qwen2_vl,": "export",
        "tunesmith distill trains text models only (idefics3 is": "distill",
        "reward on a vision-language model (idefics3): not built": "reward",
        "ppo on a vision-language model (idefics3): not built": "ppo",
        "--output_dir is required: where the merged model goes.": "merge",
    }),
    "vision_gemma": (["--model_name_or_path", "gemma3"], {
        "ok": "sft export reward dpo score chat serve vllm_serve inspect plan eval compare",
        "--packing with a vision-language model (gemma3): packed": "pt",
        "tunesmith distill trains text models only (gemma3 is a": "distill",
        "ppo on a vision-language model (gemma3): not built": "ppo",
        "--output_dir is required: where the merged model goes.": "merge",
    }),
    "vision_kto": (["--model_name_or_path", "idefics3", "--loss_type", "kto"], {
        "DPO with --loss_type kto on a vision-language model": "dpo",
        "exit 2": "ppo",
    }),
    "vision_packing": (["--model_name_or_path", "gemma3", "--packing", "true"], {
        "--packing with a vision-language model (gemma3): packed": "sft pt distill inspect plan",
    }),
    "vision_packing_mft": (["--model_name_or_path", "idefics3", "--packing", "true", "--max_forward_tokens", "64"], {
        "--max_forward_tokens 64 with a vision-language model: a": "sft pt distill inspect plan",
    }),
    # the one change: reward and ppo said "reward/ppo on a vision-language model: not built" first, a core row then;
    # that row is their features' now, checked after the core's; reward and dpo say first that they cannot train a
    # prompt-based method at all (their rows marked `first`, as the old table's order had them before the core's)
    "vision_prompt": (["--model_name_or_path", "idefics3", "--finetuning_type", "prompt_tuning"], {
        "--finetuning_type prompt_tuning with a vision-language": "sft pt distill ppo plan",
        "--finetuning_type prompt_tuning cannot train a reward": "reward",
        "--finetuning_type prompt_tuning cannot be used with DPO": "dpo",
    }),
    "vision_flags": (["--train_projector", "true"], {
        "--train_vision_tower / --train_projector: None is not a": "sft pt distill reward dpo ppo plan",
    }),
    "missing_data_path!": (["--data_path", "nope.jsonl"], {
        "PathError: data file nope.jsonl: no such file.": "sft pt distill reward dpo score ppo eval_policy inspect plan compare",
    }),
    "missing_eval_data_path!": (["--eval_data_path", "nope.jsonl"], {
        "PathError: data file nope.jsonl: no such file.": "sft pt distill reward dpo inspect plan",
    }),
    "fine!": ([], {
        "ok": "sft export pt reward dpo score ppo chat serve vllm_serve ui inspect plan eval",
        "PathError: --teacher_model_name_or_path t: no such": "distill",
        "PathError: b: no such directory (--baseline, --policy": "eval_policy",
        "PathError: --adapter_name_or_path a: no such directory.": "compare merge",
    }),
    "fine": ([], {
        "ok": "sft export pt distill reward dpo score ppo eval_policy chat serve vllm_serve ui inspect plan eval compare",
        "--output_dir is required: where the merged model goes.": "merge",
    }),
}


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A working folder with a data file and two vision-language model folders (a config with a vision_config and a
    processor file, all the rows read)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "data/demo/sft.jsonl", "x.jsonl")
    for model_type in ("idefics3", "gemma3"):
        os.makedirs(model_type)
        Path(model_type, "config.json").write_text(json.dumps({"model_type": model_type,
                                                               "vision_config": {"hidden_size": 8}}))
        Path(model_type, "preprocessor_config.json").write_text("{}")
    return tmp_path


def _outcome(kind: str, argv: list[str], check_paths: bool) -> str:
    try:
        parse_run(kind, argv, check_paths=check_paths)
    except SystemExit as e:
        return f"exit {e.code}"
    except Exception as e:  # a refusal: the message, after its type when not a ConfigError (PathError: ...)
        message = str(e)
        if message.startswith("unknown flag"):
            return "unknown flag"
        return message if type(e) is ConfigError else f"{type(e).__name__}: {message}"
    return "ok"


@pytest.mark.parametrize("case", CASES)
def test_every_command_refuses_what_it_refused_before_the_rows_declared_their_fields(case, run_dir, monkeypatch):
    flags, expected = CASES[case]
    if case.endswith("@2"):
        monkeypatch.setattr(rules, "_world_size", lambda: 2)
    refused = {kind: says for says, kinds in expected.items() for kind in kinds.split()}
    for kind in RUN_ARGUMENTS:
        roles = {config.role for config in RUN_ARGUMENTS[kind]}
        argv = ["--data_path", "x.jsonl"] if "data" in roles else []
        argv += ["--output_dir", str(run_dir / "out")] if "training" in roles else []
        got = _outcome(kind, [*argv, *EXTRA.get(kind, []), *flags], case.endswith("!"))
        assert got.startswith(refused.get(kind, "unknown flag")), (kind, got)


def _every_row() -> list[Rule]:
    return [*RULES, *{rule for kind in RUN_ARGUMENTS for rule in feature_rules(kind)}]


def test_every_field_a_row_names_is_a_field_of_its_role():
    """A misspelt ROLE.FIELD would switch its row off for every command without a word: each names a field of some
    command's dataclass of that role."""
    fields: dict[str, set[str]] = {}
    for kind in RUN_ARGUMENTS:
        for config in RUN_ARGUMENTS[kind]:
            fields.setdefault(config.role, set()).update(f.name for f in dataclasses.fields(config))
    for rule in _every_row():
        for need in (*rule.roles, *rule.without):
            role, _, field = need.partition(".")
            assert role in fields, (rule.name, need)
            assert not field or field in fields[role], (rule.name, need)


def test_a_row_applies_to_the_runs_whose_dataclasses_have_the_fields_it_names():
    row = Rule("packs", ("data.packing",), lambda a: a.data.packing, "--packing {data.packing}")
    check(check_paths=False, feature_rules=[row], data=DataArguments(data_path=["x"]))  # no packing field: not applied
    with pytest.raises(ConfigError, match="--packing True"):
        check(check_paths=False, feature_rules=[row], data=SFTDataArguments(data_path=["x"], packing=True))
    without = Rule("no_training", ("data",), lambda a: True, "refused", without=("training",))
    with pytest.raises(ConfigError, match="refused"):
        check(check_paths=False, feature_rules=[without], data=DataArguments(data_path=["x"]))


def test_a_row_that_reads_a_field_it_did_not_name_raises_instead_of_being_skipped():
    row = Rule("reads_packing", ("data",), lambda a: a.data.packing, "never")
    with pytest.raises(AttributeError, match="packing") as raised:
        check(check_paths=False, feature_rules=[row], data=DataArguments(data_path=["x"]))
    assert any("reads_packing" in note for note in raised.value.__notes__)
