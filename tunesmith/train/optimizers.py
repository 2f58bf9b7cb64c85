"""What an optimizer holds: the bytes of its state tensors, summed as they are after a step (docs/optimizers.md
measures each `--optim` with it). Which `--optim` values run where is hparams/optimizers.py, checked at parse."""

from __future__ import annotations

from typing import Any

import torch


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer under accelerate's AcceleratedOptimizer (and any other `.optimizer` wrapper)."""
    while hasattr(optimizer, "optimizer") and not hasattr(optimizer, "optimizer_dict"):
        optimizer = optimizer.optimizer
    return optimizer


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of every tensor in the optimizer's state: each parameter's moments and quantization maps, GaLore's and
    APOLLO's projection matrices (kept on projector objects inside the state), GrokAdamW's per-group state, and the
    per-weight optimizers of the layer-wise variants (transformers' LayerWiseDummyOptimizer.optimizer_dict). Each
    storage counted once."""
    optimizer = unwrap_optimizer(optimizer)
    inner = getattr(optimizer, "optimizer_dict", None)
    optimizers = list({id(o): o for o in inner.values()}.values()) if inner else [optimizer]
    seen: set[int] = set()
    total = 0
    for opt in optimizers:
        for value in opt.state.values():
            total += _tensor_bytes(value, seen, depth=0)
        for group in opt.param_groups:  # GrokAdamW keeps its moments in each group's "state", in CPU memory
            total += _tensor_bytes(group.get("state"), seen, depth=0)
        # LOMO's AdaLomo keeps its factored second moments as attributes, not in `state`
        for name in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
            total += _tensor_bytes(getattr(opt, name, None), seen, depth=0)
    return total


def _tensor_bytes(value: Any, seen: set[int], depth: int) -> int:
    if depth > 4 or value is None:
        return 0
    if isinstance(value, torch.Tensor):
        ptr = value.untyped_storage().data_ptr() if value.device.type != "meta" else id(value)
        if ptr in seen:
            return 0
        seen.add(ptr)
        return value.untyped_storage().nbytes()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, seen, depth + 1) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, type):  # a projector object (GaLore, APOLLO)
        return sum(_tensor_bytes(v, seen, depth + 1) for v in vars(value).values())
    return 0


def trained_parameters(model: torch.nn.Module) -> int:
    """The number of parameters that train (requires_grad), each shared tensor once."""
    return sum({p.data_ptr(): p.numel() for p in model.parameters() if p.requires_grad}.values())
