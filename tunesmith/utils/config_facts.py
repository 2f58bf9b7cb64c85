"""The language model's facts (token ids, sizes, layer counts, context length) from a model's config, plain or
composite.

A vision-language model's config is composite: Gemma 3's, Qwen2-VL's, Qwen3-VL's and Idefics3's keep
`pad_token_id`, `vocab_size`, `hidden_size`, `num_hidden_layers`, `max_position_embeddings`, ... in `text_config`,
and Google's Gemma 3 config has no top-level `pad_token_id` at all, so `model.config.pad_token_id` raises there.
transformers itself reads these through `config.get_text_config(decoder=True)` (generation, caches, the
sequence-classification head), which returns the config unchanged for a plain causal LM. Every read in tunesmith
goes through here, so there is one place that knows where a fact lives.

Exception: `tie_word_embeddings` is read from the outer config first. transformers' PreTrainedModel ties the output
head to the embeddings by the loaded model's own config (`self.config.tie_word_embeddings`), which for a
vision-language model is the outer one (Qwen2-VL's text config does not even carry it).

Below models/ and data/ (it imports nothing of tunesmith's): a config.json read as a dict works too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Where a composite config.json keeps the text decoder's config: transformers' own names for get_text_config's
# decoder side (PreTrainedConfig.get_text_config, transformers 5).
DECODER_CONFIG_KEYS = ("decoder", "generator", "text_config")

# Facts the loaded model reads from its own (outer) config, before the text config's.
OUTER_FIRST = frozenset({"tie_word_embeddings"})


def text_config(config: Any) -> Any:
    """The config of the language model that reads and writes the text: `config` itself for a causal LM, its
    `text_config` (or decoder) for a composite one. `config`: a transformers config or a config.json dict."""
    if isinstance(config, Mapping):
        return next((config[key] for key in DECODER_CONFIG_KEYS if isinstance(config.get(key), Mapping)), config)
    return config.get_text_config(decoder=True)


def _read(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def config_fact(config: Any, name: str, default: Any = None) -> Any:
    """`name` (pad_token_id, vocab_size, hidden_size, num_hidden_layers, max_position_embeddings, sliding_window,
    ...) as the language model uses it; `default` where the config has none (or None)."""
    value = _read(config, name) if name in OUTER_FIRST else None
    if value is None:
        value = _read(text_config(config), name)
    return default if value is None else value


def fill_pad_token_id(model: Any) -> None:
    """Give a model without a padding id its end-of-sequence id as one, where transformers reads it: the text
    config (the sequence-classification head's last-token search, the embeddings' padding row) and the generation
    config (generate's padding), which was made from the text config at load, before this."""
    config = text_config(model.config)
    if getattr(config, "pad_token_id", None) is None:
        eos = getattr(config, "eos_token_id", None)  # Qwen3-VL's text config class has none unless its file says
        config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    generation = getattr(model, "generation_config", None)
    if generation is not None and generation.pad_token_id is None:
        generation.pad_token_id = config.pad_token_id
