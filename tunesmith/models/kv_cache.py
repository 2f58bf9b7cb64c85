"""The KV cache a forward fills in place, under the name the installed transformers gives it."""

from __future__ import annotations

import inspect
from typing import Any

from transformers import DynamicCache


def cache_argument(model: Any) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.24 (`past_key_values` before, and
    deprecated since)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def empty_cache(model: Any) -> dict[str, DynamicCache]:
    """`{name: DynamicCache}` to pass to a forward, which fills the cache in place."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {cache_argument(model): DynamicCache(config=base.config)}
