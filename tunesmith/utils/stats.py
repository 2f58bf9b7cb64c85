"""The change of a mean score between two models scored on the same items, with its paired standard error:
estimated from the per-item differences d_i = tuned_i - base_i, whose spread is what matters (an easy item is easy
for both), so std(d) / sqrt(n). Shared by the lm-eval comparison (evaluation/paired.py) and the policy evaluation
(rl/evaluate_command.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def paired_change(base: Sequence[float] | torch.Tensor, tuned: Sequence[float] | torch.Tensor) -> dict[str, float]:
    """Both means and the mean change with its standard error (0 for a single item)."""
    base = torch.as_tensor(base, dtype=torch.float64)
    tuned = torch.as_tensor(tuned, dtype=torch.float64)
    gain, n = tuned - base, len(tuned)
    return {"baseline": base.mean().item(), "policy": tuned.mean().item(), "change": gain.mean().item(),
            "change_stderr": (gain.std() / n ** 0.5).item() if n > 1 else 0.0}
