"""Per-token quantities read from logits and sampled ids: log-probabilities, entropies, where each reply ends,
and the high-entropy tokens a loss may keep alone."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Low-precision dtypes whose log-softmax/entropy we compute in float32: bf16 has ~3
# significant digits, which is not enough for log-prob differences that feed exp(ratio).
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label: ``log p(y_t) = z_t[y_t] - logsumexp(z_t)``.

    ``logits``: ``[..., V]``, ``labels``: ``[...]`` (valid token ids, also at padding).
    Returns ``[...]``. Equivalent to ``log_softmax(logits).gather(-1, labels)`` but
    never materialises a second ``[..., V]`` tensor in full precision.
    """
    if logits.dtype not in _LOW_PRECISION:
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    # Half precision: logsumexp in bf16 is too coarse, but upcasting the whole
    # [B, T, V] tensor at once can double peak memory for a large vocab. Upcast one
    # sequence at a time instead.
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row_logp = torch.log_softmax(row_logits.float(), dim=-1)
        rows.append(torch.gather(row_logp, -1, row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: ``H = -sum_v p_v log p_v``.

    ``logits``: ``[..., V]`` -> ``[...]``. Computed in float32 for half-precision inputs.
    Vocabulary entries with ``-inf`` logits (p = 0) contribute 0, not ``nan``.
    """
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    # 0 * log 0 is defined as 0 for entropy; the plain product would give 0 * -inf = nan.
    plogp = torch.where(p > 0, p * logp, torch.zeros((), dtype=p.dtype, device=p.device))
    return -plogp.sum(-1)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float,
                      pool: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens the policy loss keeps under "Beyond the 80/20 rule" (Wang et al. 2025, arXiv 2506.01939):
    ``m_it and H_it >= q``, ``q`` the ``(1 - quantile)`` quantile of the entropies ``H`` of the real tokens
    (``quantile`` 0.2: the 20% most uncertain tokens, the "forks" where reasoning branches). ``quantile`` 1.0
    keeps every real token; 0.0 keeps the most uncertain one(s). ``pool``: the entropies the quantile is taken
    over, when they are more than this batch's (every process's real tokens); default ``entropy[mask]``."""
    keep = mask.bool()
    pool = entropy[keep] if pool is None else pool
    if quantile >= 1.0 or not pool.numel():
        return keep
    threshold = torch.quantile(pool.float(), 1.0 - quantile)
    return keep & (entropy >= threshold)


def first_true_indices(bools: torch.Tensor) -> torch.Tensor:
    """Index of the first ``True`` along the last dim, or its length if there is none.

    ``idx = min_t (t if b_t else T)``, computed without a Python loop.
    """
    length = bools.size(-1)
    positions = torch.arange(length, device=bools.device)
    return torch.where(bools.bool(), positions, length).amin(-1)


def truncate_after_eos(
    response_ids: torch.Tensor, eos_token_ids: int | Sequence[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut each response at its first EOS.

    Returns ``(ids, mask, ended)``:

    * ``ids``: tokens after the first EOS replaced by ``pad_token_id``;
    * ``mask`` (long, ``[B, T]``): 1 up to *and including* the first EOS, 0 after it, so
      the policy is trained on choosing to stop and the score lands on the EOS token;
    * ``ended`` (bool, ``[B]``): whether the row contained an EOS at all (rows that hit
      the length limit are often penalised by the trainer).
    """
    if isinstance(eos_token_ids, int):
        eos_token_ids = [eos_token_ids]
    eos = torch.as_tensor(list(eos_token_ids), dtype=response_ids.dtype, device=response_ids.device)
    first_eos = first_true_indices(torch.isin(response_ids, eos))
    positions = torch.arange(response_ids.size(-1), device=response_ids.device)
    keep = positions.unsqueeze(0) <= first_eos.unsqueeze(-1)
    ids = torch.where(keep, response_ids, torch.full_like(response_ids, pad_token_id))
    ended = first_eos < response_ids.size(-1)
    return ids, keep.long(), ended
