"""Every `--optim` value transformers lists either trains two steps of `tunesmith sft` on the tiny model (loss
finite, weights moved, its state the size it should be) or is refused at parse, before the model loads, in one
line naming the package to install or why it cannot run here (hparams/optimizers.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers.training_args import OptimizerNames

from tunesmith.errors import ConfigError
from tunesmith.hparams import optimizers as table
from tunesmith.hparams import parse_run
from tunesmith.hparams.optimizers import OPTIMIZERS, Needs, optimizer_problem
from tunesmith.sft.command import run as sft
from tunesmith.train.optimizers import optimizer_state_bytes, trained_parameters

REPO = Path(__file__).resolve().parents[3]
ROWS = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                      {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]} for a in range(4) for b in range(4)]

# What runs on a CPU once its package is installed; each of the others is refused here (CUDA, or never).
RUNS_ON_CPU = {
    "adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop", "ademamix", "adamw_bnb_8bit",
    "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw",
    "galore_adafactor", "galore_adamw_layerwise", "apollo_adamw", "apollo_adamw_layerwise", "lomo", "grokadamw",
    "schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd", "stable_adamw", "adamw_torch_4bit",
    "adamw_torch_8bit",
}
# torchao's low-bit AdamW compiles its step with torch.compile: over a minute on 2 cores.
SLOW = {"adamw_torch_4bit", "adamw_torch_8bit"}
# No state at all: plain SGD (no momentum) and LOMO (fused into the backward pass).
STATELESS = {"sgd", "lomo"}
# Schedule-free RAdam leaves the weights alone until RAdam's variance rectification is defined (step 5).
STEPS = {"schedule_free_radam": 6}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("optim-data") / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def flags(model: str, data: str, out: Path, name: str, *extra: str, targets: bool = True) -> list[str]:
    low_rank = ["--optim_target_modules", "all-linear", "--optim_args", "rank=4"] \
        if OPTIMIZERS[name].low_rank and targets else []
    return ["--model_name_or_path", model, "--data_path", data, "--output_dir", str(out), "--finetuning_type", "full",
            "--optim", name, "--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
            "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none", "--seed", "0", *low_rank, *extra]


def installed(needs: Needs) -> bool:
    return needs.package is None or importlib.util.find_spec(needs.package) is not None


def test_every_name_transformers_lists_is_in_the_table():
    # A transformers release that adds an optimizer fails here until the table says what it needs.
    # ... and tunesmith's own, Muon (train/muon.py; tests/core/train/test_muon.py)
    assert {o.value for o in OptimizerNames} | {"muon"} == set(OPTIMIZERS)
    assert RUNS_ON_CPU < set(OPTIMIZERS)


@pytest.mark.parametrize("name", [o.value for o in OptimizerNames])
def test_each_name_is_accepted_here_or_refused_in_one_line(name, tiny_model_dir, data, tmp_path):
    argv = flags(tiny_model_dir, data, tmp_path / "out", name)
    needs = OPTIMIZERS[name]
    expect_run = name in RUNS_ON_CPU and installed(needs) and not torch.cuda.is_available() or \
        torch.cuda.is_available() and not needs.never and installed(needs)
    if expect_run:
        assert parse_run("sft", argv).training.optim == name
        return
    with pytest.raises(ConfigError) as refused:
        parse_run("sft", argv)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"--optim {name} ")
    if needs.never:
        assert "cannot run: " in line
    elif needs.cuda:
        assert "needs a CUDA GPU and this run trains on the CPU: " in line
    else:
        assert not installed(needs) and f"needs the package {needs.package}" in line
        assert "pip install" in line or "github.com" in line


@pytest.mark.parametrize("name", sorted(RUNS_ON_CPU - SLOW) + [pytest.param(n, marks=pytest.mark.heavy) for n in SLOW])
def test_two_steps_train(name, tiny_model_dir, data, tmp_path):
    if not installed(OPTIMIZERS[name]):
        pytest.importorskip(OPTIMIZERS[name].package)
    before = load_file(f"{tiny_model_dir}/model.safetensors")
    steps = STEPS.get(name, 2)
    trainer = sft(flags(tiny_model_dir, data, tmp_path / "out", name, "--max_steps", str(steps)))
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses), losses
    after = trainer.model.state_dict()
    assert any(not torch.equal(after[k].to(v.dtype), v) for k, v in before.items() if k in after), "no weight moved"
    state = optimizer_state_bytes(trainer.optimizer)
    assert (state == 0) == (name in STATELESS), state


def bytes_per_parameter(tiny_model_dir: str, data: str, out: Path, name: str) -> float:
    trainer = sft(flags(tiny_model_dir, data, out, name, "--max_steps", "1"))
    return optimizer_state_bytes(trainer.optimizer) / trained_parameters(trainer.model)


def test_state_memory_is_measured(tiny_model_dir, data, tmp_path):
    # AdamW keeps two float32 moments a weight (plus a step counter a tensor); bitsandbytes' 8-bit AdamW one byte
    # each for the weights of 4096+ elements, except the embedding, which transformers keeps in 32 bits.
    adamw = bytes_per_parameter(tiny_model_dir, data, tmp_path / "a", "adamw_torch")
    assert 8.0 <= adamw < 8.01
    eight_bit = bytes_per_parameter(tiny_model_dir, data, tmp_path / "b", "adamw_8bit")
    assert eight_bit < adamw
    sgd = bytes_per_parameter(tiny_model_dir, data, tmp_path / "c", "sgd")
    assert sgd == 0


REFUSED_BECAUSE_IT_FAILS = ["paged_ademamix_32bit", "galore_adamw_8bit", "adalomo", "galore_adafactor_layerwise"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU failures the table refuses")
@pytest.mark.parametrize("name", REFUSED_BECAUSE_IT_FAILS)
def test_what_is_refused_here_fails_without_the_check(name, tiny_model_dir, data, tmp_path, monkeypatch):
    needs = OPTIMIZERS[name]
    if not installed(needs):
        pytest.importorskip(needs.package)
    monkeypatch.setitem(OPTIMIZERS, name, Needs(package=needs.package, low_rank=needs.low_rank))
    with pytest.raises((RuntimeError, AssertionError, ValueError)) as failed:
        sft(flags(tiny_model_dir, data, tmp_path / "out", name))
    assert not isinstance(failed.value, ConfigError)
    assert "CUDA" in str(failed.value) or "relative_step" in str(failed.value)


@pytest.mark.parametrize("name, extra, message", [
    ("galore_adamw", [], "add --optim_target_modules all-linear"),
    ("lomo", ["--gradient_accumulation_steps", "2"], "cannot accumulate --gradient_accumulation_steps 2"),
    ("galore_adamw_layerwise", ["--gradient_accumulation_steps", "4"], "set it to 1"),
    ("apollo_adamw", ["--deepspeed", str(REPO / "configs" / "ds_zero2.json")], "cannot be used with --deepspeed"),
    ("lomo", ["--fsdp_config", str(REPO / "configs" / "fsdp2.yaml")], "cannot be used with FSDP"),
])
def test_combinations_that_cannot_work_are_refused(name, extra, message, tiny_model_dir, data, tmp_path):
    # refused whether or not the package is installed: installing it would not help
    with pytest.raises(ConfigError, match=message):
        parse_run("sft", flags(tiny_model_dir, data, tmp_path / "out", name, *extra, targets=bool(extra)))


def test_a_missing_package_is_named_without_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(table.importlib.util, "find_spec", lambda n, *a: None if n == "galore_torch" else real(n, *a))
    problem = optimizer_problem(type("Args", (), {"optim": "galore_adamw", "optim_target_modules": "all-linear"})())
    assert problem == ("--optim galore_adamw needs the package galore_torch, which is not installed: pip install "
                       "galore-torch (or pip install 'tunesmith[optimizers]'), or pick another --optim")


def test_the_command_line_refuses_in_one_line_before_loading(tiny_model_dir, data, tmp_path, monkeypatch, capsys):
    # Through the `tunesmith` entry point, with galore_torch absent (None in sys.modules is what find_spec and
    # import take as not installed): exit status 2, one line, and no model loaded.
    import tunesmith.train.run_setup as recipe  # sft's trainer is built there (train_causal_lm)
    from tunesmith.cli import main

    monkeypatch.setitem(sys.modules, "galore_torch", None)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.setattr(recipe, "load_model", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    with pytest.raises(SystemExit) as exited:
        main(["sft", *flags(tiny_model_dir, data, tmp_path / "out", "galore_adamw")])
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["tunesmith: config error: --optim galore_adamw needs the package galore_torch, which is not "
                     "installed: pip install galore-torch (or pip install 'tunesmith[optimizers]'), or pick another "
                     "--optim"]


@pytest.mark.parametrize("name", ["galore_adamw", "apollo_adamw", "lomo", "galore_adamw_layerwise"])
def test_ppo_refuses_the_optimizers_that_need_the_model(name):
    """PPO, GRPO and RLOO build their optimizer from parameter groups (rl/trainer.py), where transformers' GaLore,
    APOLLO, LOMO and layer-wise optimizers need the model itself: refused at parse, in one line, where the loop would
    otherwise stop with transformers' error after loading everything."""
    from transformers import Trainer

    argv = ["--reward_model", str(REPO), "--data_path", str(REPO / "data/demo/prompts.jsonl"), "--optim", name,
            "--optim_target_modules", "all-linear"]
    with pytest.raises(ConfigError, match=rf"--optim {name} cannot be used in PPO, GRPO or RLOO") as refused:
        parse_run("ppo", argv, check_paths=False)
    assert "\n" not in str(refused.value)
    training = parse_run("sft", ["--data_path", "x.jsonl", "--optim", name, "--optim_target_modules", "all-linear"],
                         check_paths=False).training
    with pytest.raises(ValueError, match="model"):  # what the PPO loop's call would meet
        Trainer.get_optimizer_cls_and_kwargs(training)
