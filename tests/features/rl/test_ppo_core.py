"""Unit tests for tunesmith.rl.losses: hand-computed cases plus slow reference implementations."""

from __future__ import annotations

import math

import pytest
import torch

from tunesmith.rl.losses import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    PolicyLossSpec,
    aggregate_loss,
    compute_gae,
    compute_rewards,
    entropy_from_logits,
    first_true_indices,
    group_advantages,
    kl_loss,
    leave_one_out_scores,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    per_token_kl,
    policy_loss,
    truncate_after_eos,
    value_loss,
)

F64 = torch.float64


def t(data, dtype=F64) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype)


def random_right_padded_mask(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """Mask with a random length in [1, length] per row; forces one full and one length-1 row."""
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0], lengths[1] = length, 1
    return (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()


# ----------------------------------------------------------------------------- masked stats


def test_masked_mean_and_var_match_selected_entries():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, generator=gen, dtype=F64)
    mask = random_right_padded_mask(gen, 4, 7)
    x_garbage = torch.where(mask.bool(), x, t(float("inf")))
    sel = x[mask.bool()]
    torch.testing.assert_close(masked_mean(x_garbage, mask), sel.mean())
    torch.testing.assert_close(masked_var(x_garbage, mask), sel.var(unbiased=True))
    torch.testing.assert_close(masked_var(x_garbage, mask, unbiased=False), sel.var(unbiased=False))
    per_row = masked_mean(x_garbage, mask, dim=1)
    for b in range(4):
        torch.testing.assert_close(per_row[b], x[b][mask[b].bool()].mean())


def test_masked_mean_all_padding_is_zero_not_nan():
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0
    assert masked_var(t([[5.0, 1.0]]), t([[1, 0]])).item() == 0.0  # single token: no nan from n-1


def test_masked_whiten_mean0_var1_and_ignores_padding():
    gen = torch.Generator().manual_seed(1)
    x = 3.0 + 5.0 * torch.randn(5, 9, generator=gen, dtype=F64)
    mask = random_right_padded_mask(gen, 5, 9)
    w = masked_whiten(x, mask)
    assert abs(masked_mean(w, mask).item()) < 1e-10
    assert abs(masked_var(w, mask).item() - 1.0) < 1e-6
    sel = x[mask.bool()]
    torch.testing.assert_close(w[mask.bool()], (sel - sel.mean()) / sel.std(), rtol=1e-6, atol=1e-6)

    # Changing padded entries (even to inf/nan) must not change anything.
    x2 = x.clone()
    x2[~mask.bool()] = torch.randn(int((~mask.bool()).sum()), generator=gen, dtype=F64) * 1e6
    x3 = x.clone()
    x3[~mask.bool()] = float("nan")
    torch.testing.assert_close(masked_whiten(x2, mask), w)
    torch.testing.assert_close(masked_whiten(x3, mask), w)
    assert (w[~mask.bool()] == 0).all()


def test_masked_whiten_no_shift_keeps_mean():
    gen = torch.Generator().manual_seed(2)
    x = 4.0 + torch.randn(3, 6, generator=gen, dtype=F64)
    mask = random_right_padded_mask(gen, 3, 6)
    w = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(masked_mean(w, mask), masked_mean(x, mask))
    assert abs(masked_var(w, mask).item() - 1.0) < 1e-6


# ----------------------------------------------------------------------------- logits


def test_logprobs_from_logits_matches_log_softmax_gather():
    gen = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn(3, 6, 17, generator=gen)
    labels = torch.randint(0, 17, (3, 6), generator=gen)
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    out = logprobs_from_logits(logits, labels)
    assert out.shape == (3, 6)
    torch.testing.assert_close(out, ref)


def test_logprobs_from_logits_bf16_is_computed_in_float32():
    gen = torch.Generator().manual_seed(4)
    logits = (4 * torch.randn(2, 5, 33, generator=gen)).bfloat16()
    labels = torch.randint(0, 33, (2, 5), generator=gen)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref)


def test_entropy_matches_definition():
    gen = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(2, 4, 11, generator=gen, dtype=F64)
    p = torch.softmax(logits, -1)
    ref = -(p * torch.log(p)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits), ref)
    # Uniform over V -> log V; a -inf logit (p = 0) contributes 0, not nan.
    torch.testing.assert_close(entropy_from_logits(torch.zeros(1, 8, dtype=F64)), t([math.log(8)]))
    masked = t([[0.0, 0.0, float("-inf"), float("-inf")]])
    torch.testing.assert_close(entropy_from_logits(masked), t([math.log(2)]))


# ----------------------------------------------------------------------------- KL and rewards


def test_per_token_kl_hand_values():
    # d = logp - ref: +1 for the first token, -1 for the second.
    logp, ref = t([-1.0, -2.0]), t([-2.0, -1.0])
    torch.testing.assert_close(per_token_kl(logp, ref, "k1"), t([1.0, -1.0]))
    torch.testing.assert_close(per_token_kl(logp, ref, "abs"), t([1.0, 1.0]))
    torch.testing.assert_close(per_token_kl(logp, ref, "mse"), t([0.5, 0.5]))
    # k3 = exp(ref - logp) - 1 - (ref - logp): exp(-1) - 1 + 1 = e^-1 ; exp(1) - 1 - 1 = e - 2
    torch.testing.assert_close(per_token_kl(logp, ref, "k3"), t([math.exp(-1), math.e - 2]))
    with pytest.raises(ValueError):
        per_token_kl(logp, ref, "full")


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_exactly_zero_when_policies_equal(kind):
    gen = torch.Generator().manual_seed(6)
    logp = -torch.rand(3, 5, generator=gen) * 10
    mask = torch.ones(3, 5)
    assert (per_token_kl(logp, logp.clone(), kind) == 0).all()
    scores = t([1.5, -2.0, 0.25], dtype=torch.float32)
    rewards, non_score, kl = compute_rewards(scores, logp, logp.clone(), mask, kl_coef=0.3, kind=kind)
    assert (kl == 0).all() and (non_score == 0).all()
    expected = torch.zeros(3, 5)
    expected[:, -1] = scores
    assert torch.equal(rewards, expected)


def test_compute_rewards_places_score_at_last_real_token():
    logp = t([[-1.0, -2.0, -0.5, -3.0], [-1.0, -1.0, -1.0, -1.0]])
    ref = t([[-1.5, -1.0, -0.5, -0.0], [-2.0, -0.5, 7.0, 7.0]])
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.long)
    scores = t([2.0, -1.0])
    kl_coef = 0.1
    rewards, non_score, kl = compute_rewards(scores, logp, ref, mask, kl_coef)
    # k1 = logp - ref on real tokens, 0 on padding.
    expected_kl = t([[0.5, -1.0, 0.0, -3.0], [1.0, -0.5, 0.0, 0.0]])
    torch.testing.assert_close(kl, expected_kl)
    torch.testing.assert_close(non_score, -kl_coef * expected_kl)
    expected_rewards = t([[-0.05, 0.1, 0.0, 0.3 + 2.0], [-0.1, 0.05 - 1.0, 0.0, 0.0]])
    torch.testing.assert_close(rewards, expected_rewards)


def test_compute_rewards_score_shape_b1_and_empty_row():
    logp = torch.zeros(2, 3, dtype=F64)
    mask = t([[1, 0, 0], [0, 0, 0]], dtype=torch.long)
    rewards, _, _ = compute_rewards(t([[4.0], [9.0]]), logp, logp, mask, 0.1)
    # The empty row has nowhere to put its score; it must not wrap round to index -1.
    torch.testing.assert_close(rewards, t([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


# ----------------------------------------------------------------------------- GAE


def test_gae_hand_computed_with_padding():
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    values = t([[1.0, 2.0, 3.0], [0.5, 1.5, 99.0]])
    rewards = t([[0.5, -1.0, 2.0], [1.0, 2.0, 50.0]])  # row 1: index 2 is padding (garbage)
    mask = t([[1, 1, 1], [1, 1, 0]], dtype=torch.long)
    # Row 0 (full, V_3 = 0):
    #   t=2: delta = 2.0 + 0.9*0   - 3.0 = -1.0            A2 = -1.0
    #   t=1: delta = -1.0 + 0.9*3.0 - 2.0 = -0.3           A1 = -0.3 + 0.72*(-1.0)  = -1.02
    #   t=0: delta = 0.5 + 0.9*2.0 - 1.0 = 1.3             A0 = 1.3 + 0.72*(-1.02)  = 0.5656
    #   returns = A + V = [1.5656, 0.98, 2.0]
    # Row 1 (ends at t=1; padded V=99 and r=50 must be ignored, V_2 = 0):
    #   t=1: delta = 2.0 + 0.9*0   - 1.5 = 0.5             A1 = 0.5
    #   t=0: delta = 1.0 + 0.9*1.5 - 0.5 = 1.85            A0 = 1.85 + 0.72*0.5 = 2.21
    #   returns = [2.71, 2.0, 0]
    adv, ret = compute_gae(values, rewards, mask, gamma, lam)
    torch.testing.assert_close(adv, t([[0.5656, -1.02, -1.0], [2.21, 0.5, 0.0]]))
    torch.testing.assert_close(ret, t([[1.5656, 0.98, 2.0], [2.71, 2.0, 0.0]]))


def reference_gae(values, rewards, mask, gamma, lam):
    """Slow per-row, per-step GAE in plain Python floats."""
    B, T = values.shape
    adv = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        n = int(mask[b].sum())
        v = [float(x) for x in values[b, :n]] + [0.0]
        r = [float(x) for x in rewards[b, :n]]
        a_next = 0.0
        for i in range(n - 1, -1, -1):
            delta = r[i] + gamma * v[i + 1] - v[i]
            a_next = delta + gamma * lam * a_next
            adv[b, i] = a_next
    ret = (adv + values) * mask
    return adv, ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0)])
def test_gae_matches_reference_loop(gamma, lam):
    gen = torch.Generator().manual_seed(7)
    B, T = 8, 13
    mask = random_right_padded_mask(gen, B, T)
    values = torch.randn(B, T, generator=gen, dtype=F64)
    rewards = torch.randn(B, T, generator=gen, dtype=F64)
    ref_adv, ref_ret = reference_gae(values, rewards, mask, gamma, lam)
    # Garbage in the padding must not leak into the real positions.
    values_g = torch.where(mask.bool(), values, t(1e4))
    rewards_g = torch.where(mask.bool(), rewards, t(-1e4))
    adv, ret = compute_gae(values_g, rewards_g, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)
    assert (adv[~mask.bool()] == 0).all() and (ret[~mask.bool()] == 0).all()


def test_gae_outputs_carry_no_gradient():
    values = torch.randn(2, 4, requires_grad=True)
    adv, ret = compute_gae(values, torch.randn(2, 4), torch.ones(2, 4), 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad


# ----------------------------------------------------------------------------- losses


def test_policy_loss_hand_computed_clipping_and_gradient():
    eps = 0.2
    # Token 0: ratio 1.5, A=+1 -> -A*r = -1.5, -A*clip(r) = -1.2; max = -1.2  (clipped, pessimistic)
    # Token 1: ratio 0.9, A=+2 -> -1.8 both ways;                  max = -1.8  (inside the range)
    # Token 2: ratio 1.5, A=-1 -> +1.5 vs +1.2;                    max = +1.5  (outside range, but the
    #          unclipped term is the pessimistic one, so it is *not* clipped)
    # Token 3: padding whose log-ratio overflows exp() to inf -- must be ignored, gradient included.
    # loss = (-1.2 - 1.8 + 1.5) / 3 = -0.5 ; clipfrac = 1/3 ; ratio_mean = (1.5+0.9+1.5)/3 = 1.3
    old = t([[-1.0, -2.0, -0.5, -3.0]])
    logp = (old + t([[math.log(1.5), math.log(0.9), math.log(1.5), 1000.0]])).requires_grad_(True)
    adv = t([[1.0, 2.0, -1.0, 10.0]])
    mask = t([[1, 1, 1, 0]], dtype=torch.long)
    loss, stats = policy_loss(logp, old, adv, mask, PolicyLossSpec("bnpo", eps))
    torch.testing.assert_close(loss, t(-0.5))
    torch.testing.assert_close(stats["clipfrac"], t(1 / 3))
    torch.testing.assert_close(stats["ratio_mean"], t(1.3))
    expected_kl = 0.5 * (2 * math.log(1.5) ** 2 + math.log(0.9) ** 2) / 3
    torch.testing.assert_close(stats["approx_kl"], t(expected_kl))

    loss.backward()
    # d loss / d logp_i = -A_i * ratio_i / n for active unclipped tokens, 0 for clipped ones.
    # Token 0 clipped -> 0; token 1: -2*0.9/3 = -0.6; token 2: 1*1.5/3 = 0.5; padding -> 0 (and finite).
    torch.testing.assert_close(logp.grad, t([[0.0, -0.6, 0.5, 0.0]]))


def test_policy_loss_is_minus_mean_advantage_at_ratio_one():
    gen = torch.Generator().manual_seed(8)
    logp = torch.randn(3, 5, generator=gen, dtype=F64)
    adv = torch.randn(3, 5, generator=gen, dtype=F64)
    mask = random_right_padded_mask(gen, 3, 5)
    loss, stats = policy_loss(logp, logp.clone(), adv, mask, PolicyLossSpec("bnpo", 0.2))
    torch.testing.assert_close(loss, -masked_mean(adv, mask))
    assert stats["clipfrac"].item() == 0.0 and stats["approx_kl"].item() == 0.0
    torch.testing.assert_close(stats["ratio_mean"], t(1.0))


def test_value_loss_hand_computed():
    eps = 0.2
    # Token 0: V=1.0, old=0.5, R=2.0 -> V_clip=0.7; (1-2)^2=1.00, (0.7-2)^2=1.69 -> 1.69 (clipped wins)
    # Token 1: V=1.1, old=1.0, R=0.0 -> V_clip=1.1; 1.21 both                  -> 1.21
    # Token 2: V=1.0, old=0.5, R=0.0 -> V_clip=0.7; 1.00 vs 0.49               -> 1.00 (unclipped wins)
    # Token 3: padding, garbage.
    # loss = 0.5 * (1.69 + 1.21 + 1.00) / 3 = 0.65 ; vf_clipfrac = 1/3
    values = t([[1.0, 1.1, 1.0, 100.0]]).requires_grad_(True)
    old = t([[0.5, 1.0, 0.5, -100.0]])
    returns = t([[2.0, 0.0, 0.0, 5.0]])
    mask = t([[1, 1, 1, 0]], dtype=torch.long)
    loss, stats = value_loss(values, old, returns, mask, eps)
    torch.testing.assert_close(loss, t(0.65))
    torch.testing.assert_close(stats["vf_clipfrac"], t(1 / 3))
    loss.backward()
    # Token 0's loss is the clipped branch, constant in V -> zero gradient.
    # Token 1: 0.5*2*(1.1-0)/3 = 1.1/3 ; token 2: 0.5*2*(1.0-0)/3 = 1/3 ; padding -> 0.
    torch.testing.assert_close(values.grad, t([[0.0, 1.1 / 3, 1.0 / 3, 0.0]]))


# ----------------------------------------------------------------------------- KL controllers


def test_adaptive_kl_controller_direction_and_clip():
    horizon, n = 10000, 256
    ctl = AdaptiveKLController(0.2, target=6.0, horizon=horizon)
    ctl.update(12.0, n)  # error 1.0 clipped to +0.2
    assert ctl.value == pytest.approx(0.2 * (1 + 0.2 * n / horizon))
    assert ctl.value > 0.2

    ctl = AdaptiveKLController(0.2, target=6.0, horizon=horizon)
    ctl.update(1000.0, n)  # still bounded by the 0.2 clip
    assert ctl.value == pytest.approx(0.2 * (1 + 0.2 * n / horizon))

    ctl = AdaptiveKLController(0.2, target=6.0, horizon=horizon)
    ctl.update(0.0, n)  # error -1.0 clipped to -0.2
    assert ctl.value == pytest.approx(0.2 * (1 - 0.2 * n / horizon))
    assert ctl.value < 0.2

    ctl = AdaptiveKLController(0.2, target=6.0, horizon=horizon)
    ctl.update(torch.tensor(6.6), n)  # error 0.1, inside the clip; tensors accepted
    assert ctl.value == pytest.approx(0.2 * (1 + 0.1 * n / horizon))

    ctl = AdaptiveKLController(0.2, target=6.0, horizon=horizon)
    ctl.update(6.0, n)  # on target -> unchanged
    assert ctl.value == pytest.approx(0.2)


def test_fixed_kl_controller_never_moves():
    ctl = FixedKLController(0.05)
    for kl in (0.0, 1.0, 100.0, -5.0):
        ctl.update(kl, 512)
        assert ctl.value == 0.05


# ----------------------------------------------------------------------------- EOS handling


def test_first_true_indices():
    bools = torch.tensor([[False, True, True], [False, False, False], [True, False, True]])
    assert first_true_indices(bools).tolist() == [1, 3, 0]


def test_truncate_after_eos():
    eos, pad = 2, 0
    ids = torch.tensor(
        [
            [5, 2, 7, 2, 9],  # EOS mid-row (twice: the first one counts)
            [5, 6, 7, 8, 2],  # EOS at the last position
            [5, 6, 7, 8, 9],  # no EOS
            [2, 6, 7, 8, 9],  # EOS first
        ]
    )
    out, mask, ended = truncate_after_eos(ids, eos, pad)
    assert out.tolist() == [[5, 2, 0, 0, 0], [5, 6, 7, 8, 2], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert ended.tolist() == [True, True, False, True]
    assert ids[0, 2] == 7  # input not modified in place


def test_truncate_after_eos_multiple_eos_ids():
    ids = torch.tensor([[5, 3, 2, 9], [5, 6, 2, 3], [4, 4, 4, 4]])
    out, mask, ended = truncate_after_eos(ids, [2, 3], pad_token_id=-1)
    assert out.tolist() == [[5, 3, -1, -1], [5, 6, 2, -1], [4, 4, 4, 4]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert ended.tolist() == [True, True, False]


def test_leave_one_out_scores_hand_computed():
    scores = torch.tensor([1.0, 3.0, 10.0, 20.0])
    assert leave_one_out_scores(scores, 2).tolist() == [-2.0, 2.0, -10.0, 10.0]
    # Groups of 4: 1 - (2 + 3 + 6) / 3, ...
    torch.testing.assert_close(leave_one_out_scores(torch.tensor([1.0, 2.0, 3.0, 6.0]), 4),
                               torch.tensor([1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3]))
    assert torch.equal(leave_one_out_scores(scores, 1), scores)
    # A constant added to one prompt's replies (an easier prompt) changes nothing.
    shifted = scores + torch.tensor([5.0, 5.0, 0.0, 0.0])
    assert torch.equal(leave_one_out_scores(shifted, 2), leave_one_out_scores(scores, 2))
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        leave_one_out_scores(scores, 3)


# ----------------------------------------------------------------------------- GRPO / RLOO


def test_group_advantages_hand_computed_with_an_all_equal_group():
    # Group 1: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +-1 (up to eps).
    # Group 2: 0, 0, 0, 3 -> mean 0.75, population std sqrt((3 * 0.75^2 + 2.25^2) / 4) = 1.299038...
    # Group 3: all 0.7 -> no reply is better than another: exactly 0, not nan (std 0) and not
    # (0.7 - mean) / eps, which rounding in the mean of 0.7s can make nonzero.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 3.0, 0.7, 0.7, 0.7, 0.7], dtype=F64)
    eps = 1e-4
    std2 = math.sqrt((3 * 0.75 ** 2 + 2.25 ** 2) / 4)
    expected = [0.5 / (0.5 + eps), -0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0.5 / (0.5 + eps),
                *[-0.75 / (std2 + eps)] * 3, 2.25 / (std2 + eps), 0.0, 0.0, 0.0, 0.0]
    got = group_advantages(scores, 4, eps=eps)
    torch.testing.assert_close(got, t(expected))
    assert torch.equal(got[8:], torch.zeros(4, dtype=F64))
    # Population std: each group (not all equal) has mean 0 and mean square ~1.
    groups = got[:8].reshape(2, 4)
    torch.testing.assert_close(groups.mean(1), torch.zeros(2, dtype=F64))
    torch.testing.assert_close(groups.square().mean(1), torch.ones(2, dtype=F64), atol=1e-3, rtol=0)
    # Shifting or scaling one prompt's rewards changes nothing: the group is the baseline and the scale.
    torch.testing.assert_close(group_advantages(scores * 10 + 3, 4, eps=0.0)[:8], group_advantages(scores, 4, 0.0)[:8])


def test_group_advantages_refuse_groups_of_one_and_ragged_batches():
    with pytest.raises(ValueError, match="groups of 1 >= 2"):
        group_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        group_advantages(torch.ones(4), 3)


def test_rloo_is_each_score_minus_the_mean_of_the_others():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    # 1 - (0 + 0 + 1) / 3 = 2/3; 0 - (1 + 0 + 1) / 3 = -2/3; an all-equal group gives 0.
    torch.testing.assert_close(leave_one_out_scores(scores, 4),
                               torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0]))


def test_token_and_reply_averaged_losses_on_a_toy_batch():
    # Reply 1 has 3 tokens of loss 1, reply 2 one token of loss 5 (padding holds garbage).
    losses = t([[1.0, 1.0, 1.0], [5.0, float("nan"), float("inf")], [9.0, 9.0, 9.0]])
    mask = t([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate_loss(losses, mask, "bnpo").item() == pytest.approx((3 * 1 + 5) / 4)  # 2.0
    # Per reply: 1 and 5; the empty third row counts for nothing: (1 + 5) / 2.
    assert aggregate_loss(losses, mask, "grpo").item() == pytest.approx(3.0)
    same_length = t([[1, 1, 1], [1, 1, 1], [0, 0, 0]])
    finite = t([[1.0, 2.0, 3.0], [5.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    assert aggregate_loss(finite, same_length, "bnpo").item() == pytest.approx(
        aggregate_loss(finite, same_length, "grpo").item())
    with pytest.raises(ValueError, match="unknown loss type"):
        aggregate_loss(losses, mask, "batch")


def test_policy_loss_sequence_aggregation_weighs_replies_equally():
    # Ratio 1: the loss is -mean(A) under the aggregation. A = 1 on a 3-token reply, -1 on a 1-token one.
    logp = t([[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]])
    adv = t([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    token, _ = policy_loss(logp, logp, adv, mask, PolicyLossSpec("bnpo"))
    sequence, _ = policy_loss(logp, logp, adv, mask, PolicyLossSpec("grpo"))
    assert token.item() == pytest.approx(-(3 - 1) / 4) and sequence.item() == pytest.approx(0.0)


def test_kl_loss_is_k3_of_the_policy_against_the_reference_with_its_gradient():
    ref = t([[-1.0, -2.0, -0.5], [-1.0, 0.0, 0.0]])
    logp = t([[-1.0, -1.0, -1.0], [-3.0, 50.0, -50.0]]).requires_grad_()
    mask = t([[1, 1, 1], [1, 0, 0]])
    loss = kl_loss(logp, ref, mask, "k3", "bnpo")
    # k3 = exp(ref - logp) - 1 - (ref - logp) per real token: 0, e^-1 - 1 + 1, e^0.5 - 1 - 0.5, e^2 - 1 - 2.
    k3 = [0.0, math.exp(-1), math.exp(0.5) - 1.5, math.exp(2) - 3]
    assert loss.item() == pytest.approx(sum(k3) / 4)
    loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp): pulls each token towards the reference; padding gets nothing.
    expected = [[0.0, (1 - math.exp(-1)) / 4, (1 - math.exp(0.5)) / 4], [(1 - math.exp(2)) / 4, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, t(expected))
    assert kl_loss(ref, ref, mask).item() == 0.0  # the policy at the reference
    seq = kl_loss(logp.detach(), ref, mask, "k3", "grpo")
    assert seq.item() == pytest.approx((sum(k3[:3]) / 3 + k3[3]) / 2)
