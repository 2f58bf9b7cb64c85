"""The GRPO loss family and DAPO's options in the RL trainer, on a tiny random model: one run per loss type
trains; a truncated reply trains nothing under --mask_truncated_completions; the entropy filter keeps its share
of tokens; the overlong punishment lands in the reward; the reward scalings reach the advantages; dynamic
sampling draws more prompts until every group's rewards differ, and says so in the log. (The maths itself:
tests/features/rl/test_grpo_losses.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from tests.features.rl import test_grpo
from tests.features.rl.test_grpo import make_grpo_trainer
from tunesmith.rl.losses import LOSS_TYPES, scaled_group_advantages

one_thread, policy_dir, prompts = test_grpo.one_thread, test_grpo.policy_dir, test_grpo.prompts  # its fixtures


def lora_weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_one_grpo_step_trains_with_every_loss_type(tmp_path, policy_dir, tokenizer, prompts, loss_type):
    level = "sequence" if loss_type == "luspo" else "token"
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={
        "loss_type": loss_type, "importance_sampling_level": level, "ppo_epochs": 1, "num_mini_batches": 1})
    before = lora_weights(trainer)
    row = trainer.train_step()
    assert math.isfinite(row["policy_loss"]) and math.isfinite(row["kl_loss"])
    assert ("clipfrac" in row) == (loss_type not in ("sapo", "vespo"))
    assert any(not torch.equal(p, before[n]) for n, p in lora_weights(trainer).items())


def test_a_truncated_reply_trains_nothing_when_masked(tmp_path, policy_dir, tokenizer, prompts):
    # The tiny model never ends a reply within 8 tokens: every reply is truncated.
    settings = {"mask_truncated_completions": True, "kl_in_loss": False, "kl_coef": 0.0}
    trainer = make_grpo_trainer(tmp_path / "masked", policy_dir, tokenizer, prompts, ppo=settings)
    r = trainer.rollout(trainer.batch_prompts(0))
    assert not r.ended.any() and r.loss_mask.sum() == 0 and r.action_mask.sum() > 0
    before = lora_weights(trainer)
    row = trainer.train_step()
    assert row["policy_loss"] == 0 and all(torch.equal(p, before[n]) for n, p in lora_weights(trainer).items())
    settings["mask_truncated_completions"] = False
    trainer = make_grpo_trainer(tmp_path / "kept", policy_dir, tokenizer, prompts, ppo=settings)
    trainer.train_step()
    assert any(not torch.equal(p, before[n]) for n, p in lora_weights(trainer).items())


def test_the_entropy_filter_trains_the_most_uncertain_fifth(tmp_path, policy_dir, tokenizer, prompts):
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={"top_entropy_quantile": 0.2})
    r = trainer.rollout(trainer.batch_prompts(0))
    kept, real = r.loss_mask.bool(), r.action_mask.bool()
    assert kept.sum().item() == pytest.approx(0.2 * real.sum().item(), abs=1)
    assert r.entropy[kept].min() >= r.entropy[real & ~kept].max()
    assert torch.equal(r.advantages, torch.where(real, r.advantages, 0.0))  # the advantages are not filtered


def test_the_overlong_punishment_lands_in_the_reward(tmp_path, policy_dir, tokenizer, prompts):
    # Every reply runs to max_new_tokens 8; with a buffer of 4 each loses the whole penalty, 0.5.
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={
        "overlong_buffer": 4, "overlong_penalty": 0.5})
    r = trainer.rollout(trainer.batch_prompts(0))
    assert (r.action_mask.sum(1) == 8).all()
    torch.testing.assert_close(r.rewards.sum(1), r.scores - 0.5)


@pytest.mark.parametrize("scaling", ["none", "batch"])
def test_reward_scaling_reaches_the_advantages(tmp_path, policy_dir, tokenizer, prompts, scaling):
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={"scale_rewards": scaling})
    r = trainer.rollout(trainer.batch_prompts(0))
    expected = scaled_group_advantages(r.scores, 4, scaling)  # KL in the loss: the reward is the score
    torch.testing.assert_close(r.advantages[:, 0], expected)


LAST_WORD = -8  # the prompt's last word ("Say cat.": " cat"), before "." and the template's closing tokens


def last_word_reward(prompts_ids, responses_ids):
    """Equal rewards for every reply to the prompts whose last word has an even token id (5 of the 8): their
    groups teach nothing. The others: the share of even reply tokens."""
    return [1.0 if p[LAST_WORD] % 2 == 0 else sum(t % 2 == 0 for t in r) / len(r) for p, r in zip(prompts_ids, responses_ids)]


def test_dynamic_sampling_fills_the_batch_with_groups_that_differ(tmp_path, policy_dir, tokenizer, prompts):
    flat = [p.input_ids[LAST_WORD] % 2 == 0 for p in prompts]
    assert 0 < sum(flat) < len(flat)  # the words give both kinds of prompt
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, reward_fn=last_word_reward,
                                ppo={"dynamic_sampling": True, "dynamic_sampling_rounds": 8})
    first = trainer.batch_prompts(0)
    assert any(p.input_ids[LAST_WORD] % 2 == 0 for p in first)  # the scheduled batch holds a group to drop
    r = trainer.rollout(first)
    groups = r.scores.reshape(-1, 4)
    assert (groups.amax(1) != groups.amin(1)).all()
    assert (r.advantages[:, 0].reshape(-1, 4).abs().sum(1) > 0).all()  # every group teaches something
    stats = r.sampling_stats
    assert stats["sampling_rounds"] >= 2 and stats["groups_dropped"] >= 1
    row = trainer.train_step()
    assert {"sampling_rounds", "groups_dropped", "score_sampled"} <= set(row)
    # The later rounds are a function of the step: a second trainer draws the same prompts.
    again = make_grpo_trainer(tmp_path / "again", policy_dir, tokenizer, prompts, reward_fn=last_word_reward,
                              ppo={"dynamic_sampling": True})
    assert [p.input_ids for p in again.batch_prompts(0, 1)] == [p.input_ids for p in trainer.batch_prompts(0, 1)]
