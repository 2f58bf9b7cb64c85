"""The KV cache a forward fills in place, under the name the installed transformers gives it."""

from __future__ import annotations

import inspect
from typing import Any

from transformers import DynamicCache


def _transformers_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (whose own forward takes **kwargs), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_argument(model: Any) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.24 (`past_key_values` before, and
    deprecated since)."""
    forward = _transformers_model(model).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def empty_cache(model: Any) -> dict[str, DynamicCache]:
    """`{name: DynamicCache}` to pass to a forward, which fills the cache in place."""
    return {cache_argument(model): DynamicCache(config=_transformers_model(model).config)}
