"""Rollouts on a real vLLM server (vLLM's CPU build, in its own venv: bash scripts/setup_vllm.sh), against tiny random
Llamas it serves in float32: GRPO trains on its replies, the policy's weights reach it after every optimizer step (a
LoRA as a runtime adapter, a full model reloaded in place), and after an update the server's log-probabilities and
greedy replies for held-out prompts are the trainer's, while a server left a step behind fails that check.

The default suite runs one server-mode test (about 2 minutes with the server's start); the rest of the tier is marked
`vllm`: `bash scripts/test.sh -m vllm tests/features/rl/test_vllm.py`. Without vLLM's venv every test here that needs the server
skips, saying how to build it."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import torch

from tests.features.rl.test_ppo_trainer import WORDS, even_share
from tests.helpers.tiny_models import build_tiny_model_dir
from tunesmith.data.formats import Row
from tunesmith.data.prompts import Prompt, encode_prompts
from tunesmith.errors import ConfigError
from tunesmith.generation import Engine, SamplingParams
from tunesmith.generation.rollout_engines import (
    SAME_MODEL_TOLERANCE,
    check_same_model,
    prompt_logprobs,
    server_disagreement,
)
from tunesmith.generation.vllm_client import VLLMEngine
from tunesmith.generation.vllm_server import VLLMServer, VLLMServerSettings, missing_vllm_message, vllm_python
from tunesmith.hparams import FinetuningArguments, ModelArguments, TrainingArguments, check
from tunesmith.hparams.rollout_args import RolloutEngineArguments
from tunesmith.rl import PPOTrainer, build_actor_critic
from tunesmith.rl.args import PPOArguments
from tunesmith.rl.rules import RULES

ROOT = Path(__file__).resolve().parents[3]
needs_vllm = pytest.mark.skipif(vllm_python() is None, reason=missing_vllm_message())
HELD_OUT = ["Name a colour.", "Count to three.", "What is tea?"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's worker needs the other core
    yield
    torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_sized_model(path: Path, tokenizer, seed: int = 0, tied: bool = False) -> str:
    """A tiny random Llama vLLM's CPU attention takes (its head sizes start at 32), its output head its own (a full
    fine-tune of a tied one is refused: see the test below)."""
    return build_tiny_model_dir(path, tokenizer, seed=seed, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                initializer_range=0.2, tie_word_embeddings=tied)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    """(url, model folder): one vLLM server for the module, float32, as `tunesmith vllm-serve` starts it."""
    if vllm_python() is None:
        pytest.skip(missing_vllm_message())
    folder = tmp_path_factory.mktemp("vllm")
    model_dir = vllm_sized_model(folder / "model", tokenizer)
    settings = VLLMServerSettings(model=model_dir, port=free_port(), dtype="float32", max_model_len=512, rl=True,
                                  max_lora_rank=16, kv_cache_gib=1)
    with VLLMServer(settings, log_file=folder / "server.log") as server:
        yield server.url, model_dir


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[Prompt]:
    raw = [Prompt(Row("words.jsonl", i, {}), [{"role": "user", "content": f"Say {w}."}]) for i, w in enumerate(WORDS, 1)]
    return encode_prompts(tokenizer, raw, max_length=512)


def held_out(tokenizer) -> list[list[int]]:
    raw = [Prompt(Row("held_out.jsonl", i, {}), [{"role": "user", "content": q}]) for i, q in enumerate(HELD_OUT, 1)]
    return [list(p.input_ids) for p in encode_prompts(tokenizer, raw, max_length=512)]


def grpo_on_vllm(output_dir, model_dir, tokenizer, prompts, url, *, finetuning=None, ppo=None, steps=2) -> PPOTrainer:
    ppo_args = PPOArguments(**{"advantage": "grpo", "samples_per_prompt": 4, "kl_in_loss": True, "kl_coef": 0.01,
                               "max_new_tokens": 8, "ppo_epochs": 1, "num_mini_batches": 2, "rollout_log_samples": 0,
                               **(ppo or {})})
    training_args = TrainingArguments(output_dir=str(output_dir), report_to=[], per_device_train_batch_size=8,
                                      learning_rate=1e-2, lr_scheduler_type="constant", save_strategy="no",
                                      max_steps=steps, seed=0, disable_tqdm=True)
    torch.manual_seed(0)
    model = build_actor_critic(ModelArguments(model_name_or_path=model_dir),
                               FinetuningArguments(**{"lora_r": 8, "lora_alpha": 16, **(finetuning or {})}),
                               training_args, ppo_args.temperature, value_model=False)
    return PPOTrainer(model, tokenizer, prompts, ppo_args, training_args, reward_fn=even_share,
                      rollout=RolloutEngineArguments(rollout_engine="vllm", vllm_url=url))


def assert_server_holds_the_policy(trainer: PPOTrainer, tokenizer) -> None:
    """The server's log-probabilities of held-out prompts, and its greedy replies, are the trainer policy's."""
    policy = trainer.unwrapped.policy
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    for ids in held_out(tokenizer):
        reply = trainer.engine.generate([ids], greedy)[0][0]
        mine = Engine(policy, tokenizer).generate([ids], greedy)[0][0]
        assert reply.token_ids == mine.token_ids
        full = ids + reply.token_ids
        assert server_disagreement(trainer.engine, prompt_logprobs(policy, full), full) < SAME_MODEL_TOLERANCE[
            torch.float32]


def assert_stale_server_fails_the_check(trainer: PPOTrainer) -> None:
    """One more update that the server does not hear of: the same check now refuses it."""
    rollout = trainer.rollout(trainer.batch_prompts(trainer.step))
    trainer.update(rollout)
    probe = held_out(trainer.tokenizer)[0]
    with pytest.raises(ConfigError, match="it is not the trainer's model"):
        check_same_model(trainer.engine, prompt_logprobs(trainer.unwrapped.policy, probe), probe, torch.float32)


@needs_vllm
def test_grpo_lora_on_a_vllm_server_hands_over_every_update(tmp_path, served, tokenizer, prompts):
    url, model_dir = served
    trainer = grpo_on_vllm(tmp_path, model_dir, tokenizer, prompts, url)
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if p.requires_grad}
    log = trainer.train()
    assert [row["step"] for row in log] == [1, 2]
    for row in log:  # the server sampled: its log-probs were kept and compared with the trainer's, every step
        assert {"is_ratio_mean", "is_ratio_max", "is_capped", "rollout_logp_diff", "time_sync"} <= row.keys()
        assert row["rollout_logp_diff"] < 1e-3  # float32 on both sides, weights synced before sampling
        assert row["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert trainer.engine.model_name == "policy-step-1"  # the last rollout's weights: step 2's were never sampled
    trainer.sync_rollout_weights()
    assert trainer.engine.model_name == "policy-step-2"
    assert any(not torch.equal(before[n], p) for n, p in trainer.unwrapped.named_parameters() if n in before)
    assert_server_holds_the_policy(trainer, tokenizer)
    assert_stale_server_fails_the_check(trainer)


def test_an_unreachable_server_names_its_url_and_how_to_start_one(tokenizer):
    with pytest.raises(ConfigError, match=r"--vllm_url http://127.0.0.1:9: no vLLM server answers there.*"
                                          r"tunesmith vllm-serve"):
        VLLMEngine("http://127.0.0.1:9", tokenizer, timeout=5)


@pytest.mark.parametrize("ppo, rollout, match", [
    ({"async_rollouts": 1}, {}, r"--async_rollouts 1 samples the next batch on a vLLM server.*--rollout_engine vllm"),
    ({"async_rollouts": 2}, {}, r"--async_rollouts must be 0 or 1 \(got 2\)"),
    ({"rollout_is_cap": 0.5}, {}, r"--rollout_is_cap must be at least 1 \(got 0.5\)"),
    ({"async_rollouts": 1, "dynamic_sampling": True, "advantage": "grpo", "samples_per_prompt": 2},
     {"vllm_url": "http://127.0.0.1:8000"}, r"--dynamic_sampling .* --async_rollouts .*use one of the two"),
    ({}, {"rollout_engine": "vllm"},  # colocated, in this venv (vLLM is in a venv of its own)
     r"colocated vLLM .* needs vLLM in the trainer's Python .*transformers.*tunesmith vllm-serve"),
    ({}, {"vllm_url": "http://h:1", "vllm_kv_cache_gib": 2, "vllm_enable_sleep_mode": True},
     r"--vllm_kv_cache_gib, --vllm_enable_sleep_mode set the colocated vLLM's memory, and --vllm_url names a server"),
    ({}, {"vllm_gpu_memory_utilization": 1.5}, r"--vllm_gpu_memory_utilization must be in \(0, 1\] \(got 1.5\)"),
    ({}, {"vllm_kv_cache_gib": 0}, r"--vllm_kv_cache_gib must be a whole number of GiB, at least 1 \(got 0\)"),
    ({}, {"vllm_url": "127.0.0.1:8000"}, r"--vllm_url 127.0.0.1:8000: give the server's address with its scheme"),
    ({}, {"rollout_engine": "tunesmith", "vllm_url": "http://h:1"}, r"--vllm_url is the vLLM server's"),
])
def test_bad_rollout_engine_settings_say_what_to_change(ppo, rollout, match):
    training = TrainingArguments(output_dir="unused", per_device_train_batch_size=8, report_to=[])
    with pytest.raises(ConfigError, match=match):
        check(ppo=PPOArguments(**{"reward_funcs": ["exact_answer"], **ppo}), training=training,
              rollout=RolloutEngineArguments(**rollout), feature_rules=RULES)


def test_truncated_importance_weights_cap_the_ratio_and_skip_what_the_server_did_not_score():
    from tunesmith.rl.losses import truncated_importance_weights

    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    rollout = torch.tensor([[-1.0, -3.0, -2.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0]])
    weights, stats = truncated_importance_weights(old, rollout, mask, cap=2.0)
    # exp(0) = 1, exp(1) = 2.718 -> capped at 2, exp(1.5) = 4.48 -> capped; the padding (and a NaN) weigh 1
    torch.testing.assert_close(weights, torch.tensor([[1.0, 2.0, 2.0, 1.0]]))
    assert stats["is_capped"].item() == pytest.approx(2 / 3)
    assert stats["is_ratio_max"].item() == pytest.approx(math.exp(1.5))
    assert stats["rollout_logp_diff"].item() == pytest.approx((0 + 1 + 1.5) / 3)


def test_policy_loss_weighs_each_token_by_its_importance_weight():
    from tunesmith.rl.losses import PolicyLossSpec, policy_loss

    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    advantages = torch.tensor([1.0])
    mask = torch.ones(1, 3)
    spec = PolicyLossSpec("bnpo")
    plain, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, spec)
    weighted, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, spec,
                              token_weights=torch.tensor([[1.0, 2.0, 0.0]]))
    # at ratio 1 each token's surrogate is -A: the plain mean is -1, the weighted one -(1 + 2 + 0) / 3
    assert plain.item() == pytest.approx(-1.0)
    assert weighted.item() == pytest.approx(-1.0)
    weighted.backward()
    assert logprobs.grad[0, 2].item() == 0.0 and logprobs.grad[0, 1].item() == pytest.approx(2 * logprobs.grad[0, 0].item())


# ------------------------------------------------------------------ the vllm tier (-m vllm)


@needs_vllm
@pytest.mark.vllm
def test_full_fine_tuning_on_a_vllm_server_reloads_the_weights_after_every_update(tmp_path, served, tokenizer,
                                                                                   prompts):
    url, model_dir = served
    trainer = grpo_on_vllm(tmp_path, model_dir, tokenizer, prompts, url, finetuning={"finetuning_type": "full"},
                           ppo={"kl_in_loss": False, "kl_coef": 0.0})
    try:
        log = trainer.train()
        assert all(row["rollout_logp_diff"] < 1e-3 for row in log)
        trainer.sync_rollout_weights()
        assert trainer.engine.model_name == trainer.engine.base_model  # no adapter: the base itself was reloaded
        assert_server_holds_the_policy(trainer, tokenizer)
        assert_stale_server_fails_the_check(trainer)
    finally:  # the module's server serves the untrained model again
        trainer.engine._reload_full(Path(model_dir))


def test_a_full_fine_tune_of_a_tied_head_on_vllm_is_refused_before_training(tmp_path, tokenizer, prompts):
    tied = vllm_sized_model(tmp_path / "tied", tokenizer, tied=True)
    with pytest.raises(ConfigError, match=r"output head is its input embeddings .* Train LoRA"):
        grpo_on_vllm(tmp_path / "out", tied, tokenizer, prompts, "http://127.0.0.1:9",
                     finetuning={"finetuning_type": "full"})


def test_auto_colocates_only_where_nothing_would_refuse_it_and_says_why_not(tiny_model_dir, tokenizer, tmp_path,
                                                                           monkeypatch, caplog):
    """--rollout_engine auto without --vllm_url: tunesmith's engine on a CPU, saying why; on a CUDA device with vLLM
    beside the trainer, colocated vLLM unless the run has something it would refuse."""
    import logging

    from peft import LoraConfig, PromptTuningConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunesmith.generation import rollout_engines
    from tunesmith.generation.rollout_engines import auto_colocation_blocker, rollout_engine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with caplog.at_level(logging.INFO, logger=rollout_engines.__name__):
        engine = rollout_engine(RolloutEngineArguments(), model, tokenizer, str(tmp_path))
    assert isinstance(engine, Engine)
    assert "tunesmith's own, on the trainer's devices (auto, no --vllm_url given, no CUDA device)" in caplog.text
    monkeypatch.setattr(rollout_engines, "cuda_with_vllm", lambda: True)
    monkeypatch.setattr(rollout_engines, "colocation_problem", lambda: None)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    assert auto_colocation_blocker(lora, synced=False) is None  # would colocate
    assert "ZeRO-3" in auto_colocation_blocker(lora, synced=True)
    prompt = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                            PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    assert "prompt-based adapter" in auto_colocation_blocker(prompt, synced=False)
    tied = AutoModelForCausalLM.from_pretrained(vllm_sized_model(tmp_path / "tied", tokenizer, tied=True))
    assert "tied output head" in auto_colocation_blocker(tied, synced=False)
    monkeypatch.setattr(rollout_engines, "colocation_problem", lambda: "the vLLM in this Python requires x: no")
    assert "cannot colocate" in auto_colocation_blocker(lora, synced=False)


@needs_vllm
@pytest.mark.vllm
def test_async_rollouts_sample_a_step_ahead_and_the_correction_shows_it(tmp_path, served, tokenizer, prompts):
    url, model_dir = served
    trainer = grpo_on_vllm(tmp_path, model_dir, tokenizer, prompts, url, ppo={"async_rollouts": 1}, steps=3)
    log = trainer.train()
    assert [row["step"] for row in log] == [1, 2, 3]
    # step 1's batch was sampled by the weights it trains from; steps 2 and 3's a step before theirs
    assert log[0]["rollout_logp_diff"] < 1e-3
    assert all(row["rollout_logp_diff"] > 1e-3 for row in log[1:])
    assert all(row["is_ratio_max"] >= row["is_ratio_mean"] > 0 and 0 <= row["is_capped"] <= 1 for row in log)
    assert trainer._pending is None  # nothing left sampling past the last step


@needs_vllm
@pytest.mark.vllm
def test_a_server_of_another_model_is_refused_in_one_line(tmp_path, served, tokenizer, prompts):
    url, _ = served
    other = vllm_sized_model(tmp_path / "other", tokenizer, seed=1)
    trainer = grpo_on_vllm(tmp_path / "out", other, tokenizer, prompts, url)
    with pytest.raises(ConfigError, match=r"serves .*model.* differ from the trainer's policy .* not the trainer's"):
        trainer.train_step()


@needs_vllm
@pytest.mark.vllm
def test_tool_trajectories_through_vllm_are_the_own_engines_token_for_token(tmp_path, served, tokenizer):
    """The same multi-turn loop (rl/tool_rollout.py) on either engine, greedy: the same tokens, the same trained
    mask; the server's tokens are appended as sampled (never re-tokenized) with their log-probabilities."""
    from transformers import AutoModelForCausalLM

    from tunesmith.data.template import BUILTIN_TEMPLATES
    from tunesmith.rl.tool_rollout import encode_tool_prompts, tool_rollout
    from tunesmith.rl.toolbox import Toolbox

    url, model_dir = served
    tools_tokenizer = type(tokenizer).from_pretrained(model_dir)
    tools_tokenizer.chat_template = BUILTIN_TEMPLATES["chatml_tools"].read_text()
    toolbox = Toolbox.from_specs(["tunesmith.rl.tool_funcs:calculate"], 5.0)
    raw = [Prompt(Row("q.jsonl", i, {}), [{"role": "user", "content": q}]) for i, q in enumerate(HELD_OUT, 1)]
    prompts = encode_tool_prompts(tools_tokenizer, raw, toolbox, 512)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    server = VLLMEngine(url, tools_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    on_server = tool_rollout(server, tools_tokenizer, prompts, greedy, toolbox, 2)
    at_home = tool_rollout(Engine(model, tools_tokenizer), tools_tokenizer, prompts, greedy, toolbox, 2)
    for a, b in zip(on_server, at_home):
        assert a.token_ids == b.token_ids and a.trained == b.trained
        assert all(not math.isnan(lp) for lp, t in zip(a.logprobs, a.trained) if t)


@needs_vllm
@pytest.mark.vllm
def test_distill_samples_its_on_policy_replies_on_the_vllm_server(tmp_path, served, tokenizer):
    from tunesmith.distill.command import run

    url, model_dir = served
    trainer = run(["--model_name_or_path", model_dir, "--teacher_model_name_or_path", model_dir, "--data_path",
                   str(ROOT / "data/demo/sft.jsonl"), "--max_samples", "8", "--max_steps", "2", "--lmbda", "1",
                   "--on_policy_max_new_tokens", "8", "--rollout_engine", "vllm", "--vllm_url", url, "--output_dir",
                   str(tmp_path / "distill"), "--per_device_train_batch_size", "2", "--save_strategy", "no",
                   "--report_to", "none", "--max_seq_length", "256", "--lora_r", "8", "--lora_alpha", "16"])
    assert trainer.on_policy_steps == 2
    assert trainer.server.model_name == "policy-step-1"  # step 2 sampled with the weights after step 1
    trainer.sync_rollout_weights()
    student = trainer.accelerator.unwrap_model(trainer.model)
    for ids in held_out(tokenizer):
        gap = server_disagreement(trainer.server, prompt_logprobs(student, ids), ids)
        assert gap < SAME_MODEL_TOLERANCE[torch.float32]


@needs_vllm
@pytest.mark.vllm
def test_colocated_vllm_trains_in_the_venv_that_has_vllm_beside_tunesmith():
    """tests/features/rl/test_vllm_colocated.py, run where vLLM and tunesmith's libraries share one Python (vLLM's venv after
    `bash scripts/setup_vllm.sh --colocate`): this venv's transformers is newer than vLLM allows."""
    python = vllm_python()
    probe = subprocess.run([python, "-c", "import tunesmith.rl"], cwd=ROOT, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("vLLM's venv has no tunesmith libraries: run `bash scripts/setup_vllm.sh --colocate` once")
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout, whichever one the venv was set up from
    result = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "vllm",
                             "tests/features/rl/test_vllm_colocated.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:]
    assert result.returncode == 0, result.stdout[-5000:]
    assert re.search(r"\b3 passed\b", summary) and "skipped" not in summary, summary


def test_a_started_server_ends_when_the_process_that_started_it_is_killed(tmp_path):
    """The server's process carries a parent-death signal (vllm_server._end_with_parent): a trainer or test killed
    with SIGKILL leaves no vLLM holding its memory. Shown on a stand-in child started the same way."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from tunesmith.generation.vllm_server import _end_with_parent\n"
        "child = subprocess.Popen(['sleep', '120'], start_new_session=True, preexec_fn=_end_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n")])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.2)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        try:
            with open(f"/proc/{child}/stat") as stat:  # reaped by init soon; a zombie has ended too
                if stat.read().split()[2] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived the process that started it")
