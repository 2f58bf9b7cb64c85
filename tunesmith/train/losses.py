"""The causal-LM loss with its gradient computed chunk by chunk in the forward pass.

transformers' ForCausalLMLoss upcasts the whole [tokens, vocab] logits to float32 and runs
cross_entropy, whose autograd keeps the float32 log-softmax for backward and builds a float32 gradient
there: with SmolLM2's 49k vocabulary that is 0.2 GB per copy per thousand trained tokens, three or four
copies at the peak of a step. Here each chunk of rows is upcast on its own, its loss summed, and its
gradient d(sum of losses)/d(logits) = softmax(logits) - onehot(target) written straight into one tensor
of the logits' dtype, which backward scales by the incoming gradient. Same maths, same result, one
logits-sized buffer instead of several float32 ones (Liger's fused cross-entropy does this on GPUs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..constants import IGNORE_INDEX

CHUNK_ELEMENTS = 1 << 24  # float32 elements upcast at a time: 64 MB


class _SummedCrossEntropy(torch.autograd.Function):
    """sum over rows with a target of -log softmax(logits)[target]; logits [rows, vocab], targets [rows]."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        rows = max(1, CHUNK_ELEMENTS // logits.shape[-1])
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], rows):
            target = targets[start:start + rows]
            trained = target != ignore_index
            index = target.clamp_min(0)[:, None]
            # one fused kernel, float32 from the logits' own dtype: no separate upcast copy
            log_probs = torch.log_softmax(logits[start:start + rows], dim=-1, dtype=torch.float32)
            total -= (log_probs.gather(1, index)[:, 0] * trained).sum()
            if grad is not None:
                probs = log_probs.exp_()
                probs.scatter_add_(1, index, torch.full_like(index, -1, dtype=probs.dtype))
                if not bool(trained.all()):
                    probs[~trained] = 0
                grad[start:start + rows] = probs
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # The graph is not run backward twice in training, so the saved buffer is scaled in place.
        return grad.mul_(grad_total.to(grad.dtype)), None, None


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor | None, vocab_size: int,
                   num_items_in_batch: torch.Tensor | int | None = None, ignore_index: int = IGNORE_INDEX,
                   shift_labels: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """transformers' ForCausalLMLoss (same arguments, same value and gradients), chunked as above."""
    if shift_labels is None:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    targets = shift_labels.reshape(-1).to(logits.device)
    total = _SummedCrossEntropy.apply(logits.reshape(-1, vocab_size), targets, ignore_index)
    if num_items_in_batch is None:
        return total / (targets != ignore_index).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def use_chunked_loss(model: nn.Module) -> None:
    """Make a causal LM (or the PEFT model around one) compute its loss with causal_lm_loss."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.loss_function = causal_lm_loss
