"""The GRPO loss family of rl/losses/, each checked against values worked out by hand on a tiny batch (the
arithmetic is in the comments and in plain `math`, not in the code under test): the eight loss types, clip-higher,
the two-sided clip, sequence-level ratios (GSPO), DAPO's token normaliser across accumulation, the entropy
filter, the overlong punishment, dynamic sampling's filter and the three reward scalings and GDPO."""

from __future__ import annotations

import math

import pytest
import torch

from tunesmith.rl.losses import (
    LOSS_TYPES,
    PolicyLossSpec,
    decoupled_group_advantages,
    group_advantages,
    high_entropy_mask,
    overlong_penalty,
    policy_loss,
    scaled_group_advantages,
    varied_groups,
)

F64 = torch.float64
LOG = math.log


def t(data, dtype=F64) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# Two replies. Reply 0: two tokens with ratios 1.5 and 0.5, advantage +1. Reply 1: one token with ratio 1.1,
# advantage -2, then padding whose log-prob overflows (it must not reach the loss or the gradient).
OLD = t([[-1.0, -1.0], [-2.0, -3.0]])
RATIOS = [[1.5, 0.5], [1.1, None]]
MASK = t([[1, 1], [1, 0]], dtype=torch.long)
ADV = t([1.0, -2.0])


def batch():
    shift = t([[LOG(1.5), LOG(0.5)], [LOG(1.1), 900.0]])
    return (OLD + shift).requires_grad_(True)


def loss_of(spec: PolicyLossSpec, num_tokens=None):
    logp = batch()
    loss, stats = policy_loss(logp, OLD, ADV, MASK, spec, num_tokens)
    loss.backward()
    return loss.item(), logp.grad, stats


# Clipped surrogate, eps 0.2 both ways, per token -min(r A, clip(r) A):
#   r 1.5, A +1: min(1.5, 1.2) = 1.2 -> -1.2 (clipped: no gradient)
#   r 0.5, A +1: min(0.5, 0.8) = 0.5 -> -0.5
#   r 1.1, A -2: min(-2.2, -2.2)    -> +2.2
CLIPPED = [[-1.2, -0.5], [2.2]]


@pytest.mark.parametrize("loss_type, expected", [
    ("bnpo", (-1.2 - 0.5 + 2.2) / 3),                 # every token of the micro-batch
    ("dapo", (-1.2 - 0.5 + 2.2) / 3),                 # no step total given: this micro-batch's tokens
    ("grpo", ((-1.2 - 0.5) / 2 + 2.2) / 2),           # each reply's mean, then the replies' mean
    ("dr_grpo", (-1.2 - 0.5 + 2.2) / (2 * 4)),        # batch 2 x max_new_tokens 4
    ("luspo", ((-1.2 - 0.5) + 2.2) / 2),              # each reply's sum, then the replies' mean
])
def test_clipped_losses_average_the_same_tokens_differently(loss_type, expected):
    loss, grad, stats = loss_of(PolicyLossSpec(loss_type, 0.2, max_new_tokens=4))
    assert loss == pytest.approx(expected)
    assert torch.isfinite(grad).all() and grad[1, 1] == 0  # the padding's overflow reaches nothing
    assert grad[0, 0] == 0 and grad[0, 1] != 0  # the clipped token gets no gradient, the others do
    assert stats["clipfrac"].item() == pytest.approx(1 / 3)


def test_dapo_divides_by_the_tokens_of_the_whole_step():
    loss, grad, _ = loss_of(PolicyLossSpec("dapo"), num_tokens=6.0)
    assert loss == pytest.approx((-1.2 - 0.5 + 2.2) / 6)
    # d/dlogp of -r A / 6 = -r A / 6: the 0.5-ratio token with A = +1, the 1.1-ratio token with A = -2.
    torch.testing.assert_close(grad, t([[0.0, -0.5 / 6], [2.2 / 6, 0.0]]))


def test_dapo_over_two_micro_batches_is_one_token_mean_over_the_step():
    """Accumulation divides each micro-step's loss by 2 once more; with DAPO's N = (step tokens) / 2 the summed
    gradients equal the token mean over both micro-batches at once, whatever their lengths."""
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(4, 5, generator=gen, dtype=F64)
    old = logp + 0.1 * torch.randn(4, 5, generator=gen, dtype=F64)
    adv = torch.randn(4, generator=gen, dtype=F64)
    mask = t([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.long)
    whole = logp.clone().requires_grad_(True)
    policy_loss(whole, old, adv, mask, PolicyLossSpec("bnpo"))[0].backward()
    split = logp.clone().requires_grad_(True)
    num_tokens = mask.sum() / 2
    for rows in (slice(0, 2), slice(2, 4)):
        (policy_loss(split[rows], old[rows], adv[rows], mask[rows], PolicyLossSpec("dapo"), num_tokens)[0] / 2).backward()
    torch.testing.assert_close(split.grad, whole.grad)
    bnpo = logp.clone().requires_grad_(True)  # bnpo instead weighs each micro-batch's tokens by its own count
    for rows in (slice(0, 2), slice(2, 4)):
        (policy_loss(bnpo[rows], old[rows], adv[rows], mask[rows], PolicyLossSpec("bnpo"))[0] / 2).backward()
    assert not torch.allclose(bnpo.grad, whole.grad)


def test_clip_higher_lets_a_positive_token_rise_further():
    # eps_high 0.6: the 1.5-ratio token is inside [0.8, 1.6] -> -1.5, and it has a gradient now.
    loss, grad, stats = loss_of(PolicyLossSpec("bnpo", 0.2, epsilon_high=0.6))
    assert loss == pytest.approx((-1.5 - 0.5 + 2.2) / 3)
    assert grad[0, 0].item() == pytest.approx(-1.5 / 3) and stats["clipfrac"].item() == 0


def test_the_two_sided_clip_caps_a_large_ratio_with_a_negative_advantage():
    # r 1.5, A -2: clipped -min(1.5 * -2, 1.2 * -2) = 3.0, its gradient -A r = 3 (per token, one token);
    # delta 1.4 caps the unclipped ratio: -min(1.4 * -2, 1.2 * -2) = 2.8, and no gradient.
    old = t([[-1.0]])
    mask = t([[1]], dtype=torch.long)
    for delta, expected, slope in ((None, 3.0, 3.0), (1.4, 2.8, 0.0)):
        logp = (old + LOG(1.5)).requires_grad_(True)
        loss, _ = policy_loss(logp, old, t([-2.0]), mask, PolicyLossSpec("bnpo", 0.2, delta=delta))
        loss.backward()
        assert loss.item() == pytest.approx(expected) and logp.grad.item() == pytest.approx(slope)


def test_cispo_keeps_the_gradient_of_every_token_and_caps_its_weight():
    # weights sg(min(r, 1.2)) = 1.2, 0.5, 1.1; per token -w A logp, over the 3 tokens.
    logp = [[-1 + LOG(1.5), -1 + LOG(0.5)], [-2 + LOG(1.1)]]
    expected = (-1.2 * 1 * logp[0][0] - 0.5 * 1 * logp[0][1] - 1.1 * -2 * logp[1][0]) / 3
    loss, grad, stats = loss_of(PolicyLossSpec("cispo", 0.2))
    assert loss == pytest.approx(expected)
    torch.testing.assert_close(grad, t([[-1.2 / 3, -0.5 / 3], [2.2 / 3, 0.0]]))  # the capped token still moves
    assert stats["clipfrac"].item() == pytest.approx(1 / 3)


def test_sapo_gates_softly():
    # -(4 / tau) sigmoid(tau (r - 1)) A with tau 1 for A > 0, 1.05 otherwise; averaged per reply, then over replies.
    row0 = [-4 * sigmoid(0.5), -4 * sigmoid(-0.5)]
    row1 = (4 / 1.05) * sigmoid(1.05 * 0.1) * 2
    loss, grad, stats = loss_of(PolicyLossSpec("sapo"))
    assert loss == pytest.approx((sum(row0) / 2 + row1) / 2)
    assert "clipfrac" not in stats and (grad[0] != 0).all()  # no hard clip: every token keeps a gradient
    # At r = 1 the gate's slope is PPO's: d/dlogp = -A (4 sigmoid'(0) = 1).
    logp = t([[-1.0]]).requires_grad_(True)
    policy_loss(logp, logp.detach(), t([0.7]), t([[1]]), PolicyLossSpec("sapo"))[0].backward()
    assert logp.grad.item() == pytest.approx(-0.7)


def test_vespo_weighs_each_reply_by_a_gamma_of_its_ratio():
    # w = product of the token ratios: 0.75 (A >= 0: k 2, lambda 3), 1.1 (A < 0: k 3, lambda 2);
    # phi(w) = exp(lambda + k log w - lambda w); per token -phi A logp, summed over the 3 tokens / 3.
    phi0 = math.exp(3 + 2 * LOG(0.75) - 3 * 0.75)
    phi1 = math.exp(2 + 3 * LOG(1.1) - 2 * 1.1)
    logp = [-1 + LOG(1.5), -1 + LOG(0.5), -2 + LOG(1.1)]
    expected = (-phi0 * (logp[0] + logp[1]) + phi1 * 2 * logp[2]) / 3
    loss, grad, _ = loss_of(PolicyLossSpec("vespo"))
    assert loss == pytest.approx(expected)
    torch.testing.assert_close(grad, t([[-phi0 / 3, -phi0 / 3], [2 * phi1 / 3, 0.0]]))


def test_sequence_level_ratios_are_the_geometric_mean_of_the_reply():
    # GSPO: reply 0's ratio sqrt(1.5 * 0.5) = 0.866 (inside the clip), reply 1's 1.1.
    w0 = math.sqrt(0.75)
    loss, grad, _ = loss_of(PolicyLossSpec("grpo", importance_sampling_level="sequence"))
    assert loss == pytest.approx((-w0 + 2.2) / 2)
    # The reply's one ratio moves with each of its tokens: d(-w A)/dlogp_t = -w A / |y| on each, then / 2 replies.
    torch.testing.assert_close(grad, t([[-w0 / 2 / 2, -w0 / 2 / 2], [2.2 / 2, 0.0]]))
    loss, _, _ = loss_of(PolicyLossSpec("luspo", importance_sampling_level="sequence"))
    assert loss == pytest.approx((-2 * w0 + 2.2) / 2)  # each reply's loss times its length


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_is_minus_the_advantage_on_policy_in_its_gradient(loss_type):
    """At ratio 1 every surrogate's gradient is the policy gradient -A grad(logp), scaled by its average."""
    logp = t([[-1.0, -2.0], [-0.5, -3.0]]).requires_grad_(True)
    loss, _ = policy_loss(logp, logp.detach(), t([1.0, -1.0]), MASK, PolicyLossSpec(loss_type, max_new_tokens=2))
    loss.backward()
    assert logp.grad[0, 0] < 0 and logp.grad[1, 0] > 0 and logp.grad[1, 1] == 0
    assert logp.grad[0, 0] == logp.grad[0, 1]


def test_unknown_loss_type_is_named():
    with pytest.raises(ValueError, match="unknown loss type 'ppo2'"):
        loss_of(PolicyLossSpec("ppo2"))


def test_the_entropy_filter_keeps_the_top_quantile_of_real_tokens():
    entropy = t([[0.1, 2.0, 0.5], [3.0, 0.2, 99.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    # The 0.6 quantile of [0.1, 0.2, 0.5, 2.0, 3.0]: position 2.4 -> 0.5 + 0.4 * 1.5 = 1.1; padding is never kept.
    kept = high_entropy_mask(entropy, mask, 0.4)
    assert kept.tolist() == [[False, True, False], [True, False, False]]
    assert high_entropy_mask(entropy, mask, 1.0).tolist() == mask.bool().tolist()
    # A pool from every process decides the threshold: here its 0.6 quantile is 0.35.
    assert high_entropy_mask(entropy, mask, 0.4, pool=t([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])).sum() == 3


def test_overlong_punishment_ramps_down_over_the_buffer():
    lengths = torch.tensor([10, 15, 18, 20, 25])
    # L_max 20, L_cache 5: nothing up to 15, (15 - L) / 5 up to 20, -1 beyond.
    assert overlong_penalty(lengths, 20, 5).tolist() == pytest.approx([0.0, 0.0, -0.6, -1.0, -1.0])


def test_dynamic_sampling_keeps_groups_whose_rewards_differ():
    assert varied_groups(t([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 2).tolist() == [False, True, False]


SCORES = t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])


def test_reward_scalings_by_hand():
    # Group means 0.25, 0.75, 2 (a tie: all advantages exactly 0).
    none = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25, 0, 0, 0, 0]
    assert scaled_group_advantages(SCORES, 4, "none").tolist() == pytest.approx(none)
    # batch: divided by the population std of all 12 scores.
    mean = sum(SCORES.tolist()) / 12
    std = math.sqrt(sum((s - mean) ** 2 for s in SCORES.tolist()) / 12)
    assert scaled_group_advantages(SCORES, 4, "batch").tolist() == pytest.approx([a / (std + 1e-4) for a in none])
    # group: each group's own population std, sqrt(0.25 * 0.75).
    group_std = math.sqrt(0.25 * 0.75)
    expected = [a / (group_std + 1e-4) for a in none[:8]] + [0.0] * 4
    assert scaled_group_advantages(SCORES, 4, "group").tolist() == pytest.approx(expected)
    torch.testing.assert_close(scaled_group_advantages(SCORES, 4, "group"), group_advantages(SCORES, 4))


def test_gdpo_standardises_each_source_before_summing():
    # Groups of 2. Source a: [1, 0 | 1, 0]; source b: [0, 0 | 5, 0]. Each per group: a -> [1, -1 | 1, -1],
    # b -> [0, 0 | 1, -1]; summed [1, -1 | 2, -2]; over the batch (mean 0, std sqrt(2.5)).
    sources = t([[1.0, 0.0], [0.0, 0.0], [1.0, 5.0], [0.0, 0.0]])
    got = decoupled_group_advantages(sources, t([1.0, 1.0]), 2)
    expected = [x / math.sqrt(2.5) for x in (1, -1, 2, -2)]
    assert got.tolist() == pytest.approx(expected, rel=1e-3)
    # Summing first lets b's range decide: both groups get the same +-1.
    summed = group_advantages(sources.sum(1), 2)
    assert summed.tolist() == pytest.approx([1, -1, 1, -1], rel=1e-3)
