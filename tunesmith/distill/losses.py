"""Distillation losses as pure tensor maths: per-token divergences between a student's and a teacher's next-token
distributions at the same positions (the reply tokens), and the SFT cross-entropy beside them. Nothing here knows of
models or batches: the trainer picks the positions and sums.

With z_s, z_t a position's student and teacher logits and T the temperature,

    log p_s = log_softmax(z_s / T),    log p_t = log_softmax(z_t / T)

    forward KL (beta = 0):  KL(p_t || p_s) = sum_v p_t(v) (log p_t(v) - log p_s(v))
    reverse KL (beta = 1):  KL(p_s || p_t) = sum_v p_s(v) (log p_s(v) - log p_t(v))
    generalized JSD (0 < beta < 1), GKD (arXiv 2306.13649, Eq. 1):
        m = beta p_t + (1 - beta) p_s
        JSD_beta = beta KL(p_t || m) + (1 - beta) KL(p_s || m)

as TRL 1.16 computes them (GKDTrainer.generalized_jsd_loss, and the DistillationTrainer's chunked divergence), and as
TRL there is no T^2 factor on the loss: with T != 1 scale the learning rate instead. Every value is in float32
whatever the logits' dtype. Positions go through in chunks of at most CHUNK_ELEMENTS logits (a float32 [tokens x
vocab] pair and its softmaxes for a long row would be several times the logits themselves); while gradients are
recorded each chunk is recomputed in the backward pass (activation checkpointing), so only the logits stay alive.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# At most this many logits (of each model) per chunk: 64 MiB of float32; 341 positions of a 49152-token vocabulary.
CHUNK_ELEMENTS = 1 << 24


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0) -> torch.Tensor:
    """Per-position divergence, [N] float32, for logits [N, V] (see the module docstring): beta 0 is KL(teacher ||
    student), beta 1 KL(student || teacher), anything between GKD's generalized JSD."""
    return _chunked(lambda s, t: _jsd_chunk(s, t, beta, temperature), student_logits, teacher_logits)


def cross_entropy(student_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position SFT loss, [N] float32: -log softmax(z_s)[target], at temperature 1 (the data's own tokens)."""
    return _chunked(lambda s, y: F.cross_entropy(s.float(), y, reduction="none"), student_logits, targets)


def _jsd_chunk(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
               temperature: float) -> torch.Tensor:
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return F.kl_div(log_s, log_t, reduction="none", log_target=True).sum(-1)  # KL(p_t || p_s)
    if beta == 1:
        return F.kl_div(log_t, log_s, reduction="none", log_target=True).sum(-1)  # KL(p_s || p_t)
    # log m = logsumexp(log p_s + log(1 - beta), log p_t + log(beta)), never leaving log space
    log_m = torch.logaddexp(log_s + math.log1p(-beta), log_t + math.log(beta))
    kl_t = F.kl_div(log_m, log_t, reduction="none", log_target=True).sum(-1)  # KL(p_t || m)
    kl_s = F.kl_div(log_m, log_s, reduction="none", log_target=True).sum(-1)  # KL(p_s || m)
    return beta * kl_t + (1 - beta) * kl_s


def _chunked(per_chunk: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], logits: torch.Tensor,
             other: torch.Tensor) -> torch.Tensor:
    """per_chunk over row chunks of (logits [N, V], other [N, ...]), concatenated to [N]."""
    rows = max(1, CHUNK_ELEMENTS // max(logits.shape[-1], 1))
    if logits.shape[0] <= rows:
        return per_chunk(logits, other)
    recompute = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, logits.shape[0], rows):
        chunk = (logits[start:start + rows], other[start:start + rows])
        parts.append(checkpoint(per_chunk, *chunk, use_reentrant=False) if recompute else per_chunk(*chunk))
    return torch.cat(parts)
