"""utils/config_facts: the language model's facts read from a composite vision-language config (Google's Gemma 3
shape: token ids and sizes in text_config, no top-level pad_token_id), a plain causal LM's config and config.json
dicts of both; the padding id filled in where transformers reads it."""

from __future__ import annotations

import pytest
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2VLConfig,
)

from tunesmith.utils.config_facts import config_fact, fill_pad_token_id, text_config

SMALL_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 300, "max_position_embeddings": 512}
SMALL_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "image_size": 16, "patch_size": 8}


def gemma3_config(**text: object) -> Gemma3Config:
    """Shaped as Google's gemma-3 config.json: eos ids at the top, no pad_token_id there."""
    return Gemma3Config(text_config={**SMALL_TEXT, "sliding_window": 8, **text}, vision_config=SMALL_VISION,
                        mm_tokens_per_image=1, eos_token_id=[1, 106], tie_word_embeddings=False)


def test_a_composite_configs_facts_come_from_its_text_config():
    config = gemma3_config(pad_token_id=7)
    with pytest.raises(AttributeError, match="pad_token_id"):
        config.pad_token_id  # noqa: B018  (what loader.py read before)
    assert text_config(config) is config.text_config
    assert config_fact(config, "pad_token_id") == 7
    assert [config_fact(config, name) for name in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                   "num_key_value_heads", "head_dim", "max_position_embeddings",
                                                   "sliding_window")] == [300, 32, 2, 1, 16, 512, 8]
    # tying is the loaded model's own (outer) config's, which transformers ties the head by
    assert config.text_config.tie_word_embeddings is True
    assert config_fact(config, "tie_word_embeddings") is False
    assert config_fact(Qwen2VLConfig(text_config=SMALL_TEXT), "pad_token_id", default=-1) == -1


def test_a_plain_config_is_its_own_text_config():
    config = LlamaConfig(**SMALL_TEXT, pad_token_id=None, eos_token_id=2, tie_word_embeddings=True)
    assert text_config(config) is config
    assert config_fact(config, "vocab_size") == 300
    assert config_fact(config, "tie_word_embeddings") is True
    assert config_fact(config, "pad_token_id") is None
    assert config_fact(config, "sliding_window", default=0) == 0


def test_config_json_dicts_read_the_same_way():
    composite = {"model_type": "gemma3", "eos_token_id": [1, 106], "tie_word_embeddings": False,
                 "text_config": {"hidden_size": 5376, "vocab_size": 262208}, "vision_config": {"hidden_size": 1152}}
    assert text_config(composite) is composite["text_config"]
    assert config_fact(composite, "hidden_size") == 5376
    assert config_fact(composite, "pad_token_id", default=0) == 0
    assert config_fact(composite, "tie_word_embeddings") is False
    flat = {"model_type": "llama", "hidden_size": 576}
    assert text_config(flat) is flat and config_fact(flat, "hidden_size") == 576


def test_fill_pad_token_id_writes_where_the_vlm_reads_it():
    model = Gemma3ForConditionalGeneration(gemma3_config(pad_token_id=None, eos_token_id=[5, 6]))
    model.generation_config = GenerationConfig.from_model_config(model.config)
    model.generation_config.pad_token_id = None
    fill_pad_token_id(model)
    assert model.config.text_config.pad_token_id == 5  # the first end-of-sequence id, not the list
    assert model.config.get_text_config().pad_token_id == 5  # where the sequence-classification head looks
    assert model.generation_config.pad_token_id == 5
    assert "pad_token_id" not in model.config.to_diff_dict()  # the outer config gains no pad id


def test_fill_pad_token_id_keeps_a_models_own():
    model = LlamaForCausalLM(LlamaConfig(**SMALL_TEXT, pad_token_id=3, eos_token_id=2))
    fill_pad_token_id(model)
    assert model.config.pad_token_id == 3


def test_disable_dropout_reaches_a_composite_configs_text_and_vision_models(tmp_path):
    """--disable_dropout's overrides (loader.dropout_off) for dropouts kept in text_config and vision_config."""
    from transformers import AutoConfig

    from tunesmith.models.loader import dropout_off

    config = gemma3_config(attention_dropout=0.1)
    config.vision_config.attention_dropout = 0.2
    config.save_pretrained(tmp_path)
    overrides = dropout_off(str(tmp_path))
    assert overrides == {"text_config": {"attention_dropout": 0.0}, "vision_config": {"attention_dropout": 0.0}}
    loaded = AutoConfig.from_pretrained(tmp_path, **overrides)
    assert loaded.text_config.attention_dropout == 0.0 and loaded.vision_config.attention_dropout == 0.0
    assert loaded.text_config.hidden_size == 32 and loaded.vision_config.patch_size == 8  # the rest as it was


def test_a_vision_mixture_of_experts_counts_its_text_models_experts():
    from transformers import Qwen3VLMoeConfig

    from tunesmith.models.moe import expert_count

    assert expert_count(Qwen3VLMoeConfig(text_config={"num_experts": 4})) == 4  # only text_config names them
    assert expert_count(LlamaConfig(**SMALL_TEXT)) is None


@pytest.mark.parametrize("ids", [{"bos_token_id": 1, "eos_token_id": 7}, {}])
def test_fill_pad_token_id_on_qwen3_vl_whose_text_config_class_has_no_eos(ids):
    """Qwen/Qwen3-VL's config.json names bos and eos in text_config, no pad; its class defines no eos at all."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text = {**SMALL_TEXT, "num_hidden_layers": 1, **ids,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
              "patch_size": 8, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision))
    fill_pad_token_id(model)
    assert config_fact(model.config, "pad_token_id") == ids.get("eos_token_id")
