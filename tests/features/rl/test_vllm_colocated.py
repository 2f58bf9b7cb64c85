"""vLLM colocated in the trainer's process (--rollout_engine vllm without --vllm_url), on tiny random Llamas in
float32: GRPO trains on its replies, the policy's weights reach it after every optimizer step (a LoRA as an adapter,
a full model reloaded in place from the trainer's tensors), and after an update its log-probabilities and greedy
replies for held-out prompts are the trainer's, while an engine left a step behind fails that check.

These run in a Python that has vLLM beside tunesmith's training libraries: vLLM pins transformers < 5.20, this
project's venv has a newer one, so they run in vLLM's cached venv with tunesmith's libraries added
(`bash scripts/setup_vllm.sh --colocate`), as `test_vllm.py`'s tier test does:
    ~/.cache/tunesmith/vllm-venv/bin/python -m pytest -p no:cacheprovider -m vllm tests/features/rl/test_vllm_colocated.py
Anywhere else they skip, saying why (the refusal itself is tested in tests/features/rl/test_vllm.py)."""

from __future__ import annotations

import pytest
import torch

from tests.features.rl.test_vllm import (
    assert_server_holds_the_policy,
    assert_stale_server_fails_the_check,
    grpo_on_vllm,
    held_out,
    one_thread,  # noqa: F401 (fixture)
    prompts,  # noqa: F401 (fixture)
    vllm_sized_model,
)
from tunesmith.generation.rollout_engines import SAME_MODEL_TOLERANCE, prompt_logprobs, server_disagreement
from tunesmith.generation.vllm_colocated import ColocatedVLLM
from tunesmith.hparams.rollout_args import colocation_problem

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(colocation_problem() is not None, reason=str(colocation_problem()))]


def test_grpo_lora_on_colocated_vllm_hands_over_every_update(tmp_path, tokenizer, prompts):  # noqa: F811
    model_dir = vllm_sized_model(tmp_path / "model", tokenizer)
    trainer = grpo_on_vllm(tmp_path / "out", model_dir, tokenizer, prompts, None)
    assert isinstance(trainer.engine, ColocatedVLLM)
    log = trainer.train()
    assert [row["step"] for row in log] == [1, 2]
    for row in log:  # vLLM sampled with the weights of the step: its log-probs are the trainer's
        assert row["rollout_logp_diff"] < 1e-3
        assert row["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    trainer.sync_rollout_weights()
    assert trainer.engine.lora_request.lora_name == "policy-step-2"
    assert_server_holds_the_policy(trainer, tokenizer)
    assert_stale_server_fails_the_check(trainer)


def test_full_fine_tuning_on_colocated_vllm_reloads_the_weights_from_memory(tmp_path, tokenizer,
                                                                            prompts):  # noqa: F811
    model_dir = vllm_sized_model(tmp_path / "model", tokenizer)
    trainer = grpo_on_vllm(tmp_path / "out", model_dir, tokenizer, prompts, None,
                           finetuning={"finetuning_type": "full"}, ppo={"kl_in_loss": False, "kl_coef": 0.0})
    log = trainer.train()
    assert all(row["rollout_logp_diff"] < 1e-3 for row in log)
    trainer.sync_rollout_weights()
    assert trainer.engine.lora_request is None
    assert not any((tmp_path / "out" / "vllm_sync").glob("step-*/*.safetensors"))  # from memory, not a saved folder
    assert_server_holds_the_policy(trainer, tokenizer)
    assert_stale_server_fails_the_check(trainer)


def test_distill_samples_its_on_policy_replies_on_colocated_vllm(tmp_path, tokenizer):
    from tests.features.rl.test_vllm import ROOT
    from tunesmith.distill.command import run

    model_dir = vllm_sized_model(tmp_path / "model", tokenizer)
    trainer = run(["--model_name_or_path", model_dir, "--teacher_model_name_or_path", model_dir, "--data_path",
                   str(ROOT / "data/demo/sft.jsonl"), "--max_samples", "8", "--max_steps", "2", "--lmbda", "1",
                   "--on_policy_max_new_tokens", "8", "--rollout_engine", "vllm", "--output_dir",
                   str(tmp_path / "distill"), "--per_device_train_batch_size", "2", "--save_strategy", "no",
                   "--report_to", "none", "--max_seq_length", "256", "--lora_r", "8", "--lora_alpha", "16"])
    assert isinstance(trainer.server, ColocatedVLLM)
    assert trainer.on_policy_steps == 2
    trainer.sync_rollout_weights()
    student = trainer.accelerator.unwrap_model(trainer.model)
    for ids in held_out(tokenizer):
        assert server_disagreement(trainer.server, prompt_logprobs(student, ids), ids) < SAME_MODEL_TOLERANCE[
            torch.float32]
