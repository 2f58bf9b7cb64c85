"""Pure-tensor preference losses for DPO, its reference-free relatives, and KTO.

Nothing in here knows about models or tokenizers: every function takes the per-sequence log-probs of
a batch of pairs (KTO: of single replies, each desirable or not) and returns tensors, so each loss can
be checked against a hand calculation.

Conventions
-----------
* ``policy_chosen``, ``policy_rejected``: ``[B]``, the log-prob of each reply under the policy,
  summed over the reply's tokens (``log pi(y|x) = sum_t log pi(y_t | x, y_<t)``).
* ``reference_chosen``, ``reference_rejected``: the same under the reference model (sigmoid, ipo).
* ``chosen_lengths``, ``rejected_lengths``: ``[B]``, the number of reply tokens summed over; the
  length-normalised losses divide by them (``avg = logp / length``).
* The loss is a mean over the pairs; the rewards are per pair and detached, for logging only.
* Everything is computed in float32 whatever the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

__all__ = ["PreferenceLoss", "sigmoid_loss", "ipo_loss", "simpo_loss", "orpo_loss", "preference_loss", "log_odds",
           "KTOLoss", "kto_kl", "kto_loss"]


@dataclass
class PreferenceLoss:
    loss: torch.Tensor  # scalar, differentiable
    chosen_rewards: torch.Tensor  # [B], detached: the implicit reward of each chosen reply
    rejected_rewards: torch.Tensor  # [B], detached


def _f32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float() for t in tensors]


def _logratio_gap(policy_c, policy_r, reference_c, reference_r) -> torch.Tensor:
    """``h = (pi_c - ref_c) - (pi_r - ref_r)``: how much more the policy prefers chosen than the reference does."""
    return (policy_c - reference_c) - (policy_r - reference_r)


def sigmoid_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, reference_chosen: torch.Tensor,
                 reference_rejected: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> PreferenceLoss:
    """DPO (Rafailov et al. 2023), with conservative label smoothing eps:

    ``loss = mean(-(1 - eps) log sigma(beta h) - eps log sigma(-beta h))``, ``h`` as in _logratio_gap
    on summed log-probs. Rewards: ``beta (pi - ref)``.
    """
    pc, pr, rc, rr = _f32(policy_chosen, policy_rejected, reference_chosen, reference_rejected)
    h = _logratio_gap(pc, pr, rc, rr)
    losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    return PreferenceLoss(losses.mean(), (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach())


def ipo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, reference_chosen: torch.Tensor,
             reference_rejected: torch.Tensor, chosen_lengths: torch.Tensor, rejected_lengths: torch.Tensor,
             beta: float) -> PreferenceLoss:
    """IPO (Azar et al. 2023) on length-averaged log-probs, as TRL computes it:

    ``loss = mean((h - 1 / (2 beta))^2)`` with ``h`` from ``logp / length`` of each side under
    policy and reference. Rewards: ``beta (pi - ref) / length``.
    """
    pc, pr, rc, rr, lc, lr = _f32(policy_chosen, policy_rejected, reference_chosen, reference_rejected,
                                  chosen_lengths, rejected_lengths)
    pc, rc, pr, rr = pc / lc, rc / lc, pr / lr, rr / lr
    h = _logratio_gap(pc, pr, rc, rr)
    losses = (h - 1 / (2 * beta)) ** 2
    return PreferenceLoss(losses.mean(), (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach())


def simpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, chosen_lengths: torch.Tensor,
               rejected_lengths: torch.Tensor, beta: float, gamma: float) -> PreferenceLoss:
    """SimPO (Meng et al. 2024), reference-free and length-normalised:

    ``loss = mean(-log sigma(beta (avg_c - avg_r) - gamma))``, ``avg = logp / length``.
    Rewards: ``beta avg``.
    """
    pc, pr, lc, lr = _f32(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths)
    avg_c, avg_r = pc / lc, pr / lr
    losses = -F.logsigmoid(beta * (avg_c - avg_r) - gamma)
    return PreferenceLoss(losses.mean(), (beta * avg_c).detach(), (beta * avg_r).detach())


def log_odds(avg_logp: torch.Tensor) -> torch.Tensor:
    """``log(p / (1 - p)) = lp - log(1 - exp(lp))`` for ``lp = log p < 0``. ``lp`` is kept at most
    -1e-6 so that a reply of probability 1 gives a large finite value, not inf."""
    lp = avg_logp.clamp(max=-1e-6)
    return lp - torch.log(-torch.expm1(lp))


def orpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, chosen_lengths: torch.Tensor,
              rejected_lengths: torch.Tensor, beta: float) -> PreferenceLoss:
    """ORPO (Hong et al. 2024), reference-free; ``beta`` is its weight lambda:

    ``loss = NLL + lambda mean(-log sigma(log_odds(avg_c) - log_odds(avg_r)))``, where
    ``NLL = -sum(pi_c) / sum(length_c)`` is the chosen replies' cross-entropy averaged over all their
    tokens in the batch (TRL's), and ``avg = logp / length``. Rewards: ``beta avg``.
    """
    pc, pr, lc, lr = _f32(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths)
    avg_c, avg_r = pc / lc, pr / lr
    nll = -pc.sum() / lc.sum()
    odds_ratio = -F.logsigmoid(log_odds(avg_c) - log_odds(avg_r))
    return PreferenceLoss(nll + beta * odds_ratio.mean(), (beta * avg_c).detach(), (beta * avg_r).detach())


def preference_loss(loss_type: str, policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
                    chosen_lengths: torch.Tensor, rejected_lengths: torch.Tensor,
                    reference_chosen: torch.Tensor | None = None, reference_rejected: torch.Tensor | None = None,
                    beta: float = 0.1, gamma: float = 0.5, label_smoothing: float = 0.0) -> PreferenceLoss:
    """The loss named by loss_type (sigmoid, ipo, simpo, orpo); sigmoid and ipo need the reference log-probs.
    KTO scores single replies, not pairs: kto_loss."""
    if loss_type == "kto":
        raise ValueError("loss_type kto scores single replies, each desirable or undesirable: use kto_loss")
    if loss_type in ("sigmoid", "ipo") and (reference_chosen is None or reference_rejected is None):
        raise ValueError(f"loss_type {loss_type} needs the reference model's log-probs")
    if loss_type == "sigmoid":
        return sigmoid_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta, label_smoothing)
    if loss_type == "ipo":
        return ipo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, chosen_lengths,
                        rejected_lengths, beta)
    if loss_type == "simpo":
        return simpo_loss(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths, beta, gamma)
    if loss_type == "orpo":
        return orpo_loss(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths, beta)
    raise ValueError(f"unknown loss_type {loss_type!r}: sigmoid, ipo, simpo or orpo")


# ---- KTO: single replies, each labelled desirable or undesirable

@dataclass
class KTOLoss:
    loss: torch.Tensor  # scalar, differentiable
    rewards: torch.Tensor  # [N], detached: beta (pi - ref) of each reply
    kl: torch.Tensor  # scalar, detached: the reference point z0


def kto_kl(policy_mismatched: torch.Tensor, reference_mismatched: torch.Tensor,
           mean_over_processes: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """KTO's reference point (Ethayarajh et al. 2024, arXiv 2402.01306, section 4.1), estimated from a batch's
    prompts each paired with another row's reply (x'_i, y'_i):

    ``z0 = max(0, mean(pi(y'|x') - ref(y'|x')))``, summed log-probs, with no gradient through it. Over several
    processes the mean is taken over all of them (``mean_over_processes``) before the clamp, as TRL does.
    """
    shift = (policy_mismatched.detach().float() - reference_mismatched.float()).mean()
    if mean_over_processes is not None:
        shift = mean_over_processes(shift)
    return shift.clamp(min=0).detach()


def kto_loss(policy: torch.Tensor, reference: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor, beta: float,
             desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> KTOLoss:
    """KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization", arXiv
    2402.01306, eq. 7). With ``r = pi(y|x) - ref(y|x)`` (summed log-probs) and ``z0`` from kto_kl:

    ``loss = mean(lambda_D (1 - sigma(beta (r - z0))))`` over desirable replies and
    ``lambda_U (1 - sigma(beta (z0 - r)))`` over undesirable ones, one mean over all the batch's replies
    (``lambda_y - v(x, y)`` of the paper, as TRL's KTOTrainer computes it). Rewards: ``beta r``.
    """
    pi, ref, z0 = _f32(policy, reference, kl)
    r = pi - ref
    desirable = desirable.bool()
    losses = torch.where(desirable, desirable_weight * (1 - torch.sigmoid(beta * (r - z0))),
                         undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r))))
    return KTOLoss(losses.mean(), (beta * r).detach(), z0.detach())
