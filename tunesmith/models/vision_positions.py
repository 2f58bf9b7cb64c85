"""Positions of a prompt with images, for the engine's prefill. Most vision-language models number an image's
tokens as any others; Qwen's (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) give each image token a (time, height, width)
position (M-RoPE) and continue the text after the image from the largest of them, so a reply's positions run
behind its token count by a per-row delta. The model computes both with its own `get_rope_index`; the engine
then decodes each row from its last position, as it does for text (three equal coordinates for a text token)."""

from __future__ import annotations

from typing import Any

import torch

ROPE_INDEX_INPUTS = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts")


def _rope_index_owner(model: Any) -> Any | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in (base, getattr(base, "model", None)):
        if module is not None and hasattr(module, "get_rope_index"):
            return module
    return None


def prefill_positions(model: Any, ids: torch.Tensor, mask: torch.Tensor, vision: dict[str, Any]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the position_ids the prefill forward takes, the [rows, length] positions whose last column the engine
    decodes on from). Left padding is masked out as for text."""
    owner = _rope_index_owner(model)
    if owner is None:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return positions, positions
    inputs = {key: vision[key].to(ids.device) for key in ROPE_INDEX_INPUTS if key in vision}
    position_ids, _ = owner.get_rope_index(input_ids=ids, attention_mask=mask, **inputs)
    return position_ids, position_ids.amax(0)
