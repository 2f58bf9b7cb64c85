"""Checkpoints and saves under damage: a newest checkpoint with a corrupt file (optimizer, scheduler, random state,
weights) while its state file reads is skipped for the one before it; a disk that fills during a checkpoint save or
the final save stops the run in one line (exit status 2) and leaves the last complete save whole, and the run
resumes later; PPO's ZeRO optimizer state loads through torch's weights_only unpickler, which refuses a crafted
file."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli.test_cli_errors import REPO, assert_one_line_error, cli  # noqa: E402
from tests.core.models.test_corrupt_files import garbage, truncate  # noqa: E402
from tests.features.rl.test_ppo_trainer import make_trainer, policy_dir, prompts  # noqa: E402, F401 (fixtures)
from tunesmith.errors import PathError
from tunesmith.sft.command import run as sft_main
from tunesmith.train.checkpoints import last_complete_checkpoint, resume_problem

ROWS = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                      {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
        for a in range(4) for b in range(4)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def flags(model_dir: str, data: str, out: Path, steps: int = 2) -> list[str]:
    """A LoRA run on the tiny model with a checkpoint at every step."""
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--max_steps", str(steps),
            "--save_strategy", "steps", "--save_steps", "1", "--per_device_train_batch_size", "4",
            "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--lora_dropout", "0.0", "--plot_loss",
            "false", "--seed", "0"]


def losses(trainer) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


# --------------------------------------------------------------------------- a corrupt newest checkpoint


def test_a_newest_checkpoint_with_a_corrupt_file_is_skipped_for_the_one_before(tiny_model_dir, data, tmp_path,
                                                                                 caplog):
    out = tmp_path / "out"
    straight = sft_main(flags(tiny_model_dir, data, out))
    newest, kept = out / "checkpoint-2", tmp_path / "checkpoint-2"
    shutil.copytree(newest, kept)
    caplog.set_level(logging.INFO, logger="tunesmith")
    # trainer_state.json reads in each case: only the file named is damaged.
    for name, damage, problem in [("scheduler.pt", truncate, "not a whole torch archive"),
                                  ("rng_state.pth", garbage, "not a whole torch archive"),
                                  ("adapter_model.safetensors", truncate, "not a whole safetensors file"),
                                  ("optimizer.pt", truncate, "not a whole torch archive")]:
        shutil.rmtree(newest)
        shutil.copytree(kept, newest)
        damage(newest / name)
        caplog.clear()
        assert last_complete_checkpoint(out) == str(out / "checkpoint-1")
        assert f"skipping {newest}: {newest / name}: {problem}" in caplog.text

    # The same command again continues from checkpoint-1: step 2 is trained again, as the run first trained it.
    caplog.clear()
    resumed = sft_main(flags(tiny_model_dir, data, out))
    assert f"resuming from {out / 'checkpoint-1'} (step 1)" in caplog.messages
    assert [r["step"] for r in resumed.state.log_history if "loss" in r] == [1, 2]
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-5)
    assert resume_problem(out / "checkpoint-2") is None  # saved again, whole


def test_when_no_checkpoint_loads_one_line_says_so(tiny_model_dir, data, tmp_path, caplog):
    out = tmp_path / "out"
    sft_main(flags(tiny_model_dir, data, out))
    for checkpoint in out.glob("checkpoint-*"):
        truncate(checkpoint / "optimizer.pt")
    caplog.set_level(logging.INFO, logger="tunesmith")
    assert last_complete_checkpoint(out) is None
    assert f"no checkpoint in {out} can be resumed (2 skipped)" in caplog.messages
    with pytest.raises(PathError, match=rf"--resume_from_checkpoint true: no complete checkpoint in --output_dir {out}"):
        sft_main([*flags(tiny_model_dir, data, out), "--resume_from_checkpoint", "true"])
    # Named explicitly, the damaged checkpoint stops the command line in one line naming the file.
    proc = cli("sft/train.py", *flags(tiny_model_dir, data, out), "--resume_from_checkpoint",
               str(out / "checkpoint-2"), cwd=tmp_path)
    assert_one_line_error(proc, f"--resume_from_checkpoint {out / 'checkpoint-2'}: "
                                f"{out / 'checkpoint-2' / 'optimizer.pt'}: not a whole torch archive",
                          "give an earlier checkpoint")


# --------------------------------------------------------------------------- a full disk


def simulated_full_disk(monkeypatch, module, name: str, after: int = 0) -> None:
    """`module.name` (a file writer) writes the first `after` calls' files whole; later ones half a file and then
    fail as a full disk does (ENOSPC)."""
    write, calls = getattr(module, name), []

    def full(obj, path, *args, **kwargs):
        calls.append(path)
        write(obj, path, *args, **kwargs)
        if len(calls) > after:
            truncate(Path(path))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(module, name, full)


def test_a_full_disk_during_the_final_save_keeps_the_previous_model(tiny_model_dir, data, tmp_path, monkeypatch):
    import peft.peft_model

    out = tmp_path / "out"
    sft_main(flags(tiny_model_dir, data, out, steps=1))
    before = load_file(out / "adapter_model.safetensors")
    # The longer run saves checkpoint-2's weights, then the disk fills while the final weights are written.
    simulated_full_disk(monkeypatch, peft.peft_model, "safe_save_file", after=1)
    staging = out / ".final-model.tmp"
    with pytest.raises(PathError, match=rf"^{staging}: the disk filled up while saving \(the save needs about "
                                        r"[\d.]+MB, [\d.]+[kMGT]?B is free there\): free space and run the same"):
        sft_main(flags(tiny_model_dir, data, out, steps=2))
    assert not staging.exists()
    after = load_file(out / "adapter_model.safetensors")
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert last_complete_checkpoint(out) == str(out / "checkpoint-2")


def test_a_full_disk_during_a_checkpoint_save_stops_and_the_run_resumes(tiny_model_dir, data, tmp_path,
                                                                         monkeypatch, caplog):
    import transformers.trainer

    out = tmp_path / "out"
    simulated_full_disk(monkeypatch, transformers.trainer.torch, "save", after=0)  # optimizer.pt of checkpoint-1
    with pytest.raises(PathError, match=rf"^{out / 'checkpoint-1'}: the disk filled up while saving \(the save "
                                        r"needs more than the [\d.]+MB written"):
        sft_main(flags(tiny_model_dir, data, out))
    assert not (out / "checkpoint-1").exists()  # cut short: removed, its space free again
    monkeypatch.undo()
    caplog.set_level(logging.INFO, logger="tunesmith")
    sft_main(flags(tiny_model_dir, data, out))
    assert last_complete_checkpoint(out) == str(out / "checkpoint-2")


def one_error(proc: subprocess.CompletedProcess, words: str) -> str:
    """assert_one_line_error for a run stopped while training: the progress bar is closed first, so the error
    starts a line of its own (split on newlines only: a bar's frames end in carriage returns)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.split("\n") if "tunesmith:" in line]
    assert len(errors) == 1 and errors[0].startswith("tunesmith: ") and words in errors[0], proc.stderr[-3000:]
    return errors[0]


UNSHARE = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


def can_mount_a_small_disk() -> bool:
    try:
        return subprocess.run([*UNSHARE, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not can_mount_a_small_disk(), reason="needs `unshare --mount` to mount a small tmpfs")
def test_a_real_full_disk_stops_each_save_in_one_line_and_keeps_the_last_complete_one(tiny_model_dir, data,
                                                                                      tmp_path):
    """A tmpfs of a few megabytes, in a mount namespace of its own: the real writers (torch, safetensors,
    tokenizers) hit ENOSPC. Run 1 (1 step) fits. Run 2 (2 steps) fills the disk in checkpoint-2; run 3, on a disk
    grown a little, resumes checkpoint-1, saves checkpoint-2 and fills the disk in the final save; each leaves
    the last complete checkpoint and the finished model of run 1 whole."""
    disk, keep = tmp_path / "disk", tmp_path / "keep"
    disk.mkdir()
    keep.mkdir()
    out = disk / "run"
    sft = f"{sys.executable} {REPO / 'sft' / 'train.py'}"

    def run(steps: int, name: str) -> str:
        args = " ".join(flags(tiny_model_dir, data, out, steps))
        return (f"{sft} {args} > {keep / name}.out 2> {keep / name}.err; echo $? > {keep / name}.rc; "
                f"cp -a {out} {keep / name}")

    mib = 1 << 20
    checkpoint = 4 * mib  # about: the tokenizer (3.5 MB) and a small adapter, optimizer and states
    script = "; ".join([
        f"mount -t tmpfs -o size={16 * mib} tmpfs {disk}", run(1, "one"),
        f"mount -o remount,size={2 * checkpoint + 2 * mib} {disk}", run(2, "two"),
        f"mount -o remount,size={3 * checkpoint + 3 * mib // 2} {disk}", run(2, "three"),
    ])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([*UNSHARE, "sh", "-c", script], check=True, env=env, timeout=600)

    def result(name: str) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess([name], int((keep / f"{name}.rc").read_text()),
                                           (keep / f"{name}.out").read_text(), (keep / f"{name}.err").read_text())

    assert result("one").returncode == 0, result("one").stderr[-3000:]
    finished = load_file(keep / "one" / "adapter_model.safetensors")
    line = one_error(result("two"), f"{out / 'checkpoint-2'}: the disk filled up while saving")
    assert "free space and run the same command again" in line
    assert sorted(p.name for p in (keep / "two").glob("checkpoint-*")) == ["checkpoint-1"]
    assert resume_problem(keep / "two" / "checkpoint-1") is None

    three = result("three")
    one_error(three, f"{out / '.final-model.tmp'}: the disk filled up while saving")
    assert f"resuming from {out / 'checkpoint-1'} (step 1)" in three.stderr
    assert resume_problem(keep / "three" / "checkpoint-2") is None
    assert not (keep / "three" / ".final-model.tmp").exists()
    kept = load_file(keep / "three" / "adapter_model.safetensors")
    assert all(torch.equal(kept[k], finished[k]) for k in finished)


def test_a_full_disk_during_a_ppo_checkpoint_keeps_the_one_before(tmp_path, policy_dir, tokenizer, prompts,  # noqa: F811
                                                                   monkeypatch):
    import tunesmith.rl.trainer

    out = tmp_path / "ppo"
    trainer = make_trainer(out, policy_dir, tokenizer, prompts,
                           training={"max_steps": 2, "save_strategy": "steps", "save_steps": 1})
    # A checkpoint's torch files: optimizer, random state, scheduler; the disk fills in checkpoint-2's first.
    simulated_full_disk(monkeypatch, tunesmith.rl.trainer.torch, "save", after=3)
    staging = out / ".checkpoint-2.tmp"
    with pytest.raises(PathError, match=rf"^{staging}: the disk filled up while saving \(the save needs about "):
        trainer.train()
    assert not staging.exists() and sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert last_complete_checkpoint(out) == str(out / "checkpoint-1")


# --------------------------------------------------------------------------- PPO's ZeRO optimizer state


class RunsCode:
    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_zero_optimizer_file_is_refused_without_running_it(tmp_path):
    from tunesmith.rl.trainer import load_zero_optimizer_state

    marker = tmp_path / "ran"
    payload = RunsCode()
    payload.marker = marker
    path = tmp_path / "optimizer-rank0.pt"
    torch.save({"loss_scaler": payload, "base_optimizer_state": {}}, path)
    with pytest.raises(PathError, match=rf"^{path}: refused: it holds more than a ZeRO optimizer's state "
                                        r"\(Trying to load unsupported GLOBAL posix.system"):
        load_zero_optimizer_state(path)
    assert not marker.exists()


def test_a_one_process_zero2_grpo_run_resumes_its_optimizer_exactly(tiny_model_dir, tmp_path):
    """Each run in a process of its own, as a user runs it: DeepSpeed in the test's process would leave its
    process group and launcher variables behind for every later test of this worker."""
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in ("red", "blue", "green", "sun")))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}

    def grpo(out: Path, *extra: str) -> list[dict]:
        proc = subprocess.run(
            [sys.executable, "-m", "tunesmith", "ppo", "--model_name_or_path", tiny_model_dir, "--reward_funcs",
             "length_penalty", "--advantage", "grpo", "--samples_per_prompt", "2", "--data_path", str(prompt_file),
             "--output_dir", str(out), "--per_device_train_batch_size", "4", "--max_new_tokens", "4", "--ppo_epochs",
             "2", "--save_steps", "1", "--max_steps", "2", "--lora_r", "4", "--learning_rate", "1e-2", "--deepspeed",
             str(REPO / "configs" / "ds_zero2.json"), *extra],
            capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=600, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]

    straight = grpo(tmp_path / "straight")
    resumed = grpo(tmp_path / "resumed", "--resume_from_checkpoint", str(tmp_path / "straight" / "checkpoint-1"))
    assert [r["step"] for r in resumed] == [1, 2]
    assert {k: v for k, v in resumed[1].items() if not k.startswith("time_")} == pytest.approx(
        {k: v for k, v in straight[1].items() if not k.startswith("time_")}, rel=1e-5, abs=1e-7)
