"""The model-family registry (tunesmith/families.py): each entry's facts hold for transformers' own classes of the
family, the layers' lists are read from it, and "is this a vision-language model?" has one answer whether asked of a
folder, a config, a model or a tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.vlm_models import build_vlm_dir
from tunesmith.export.gguf_arch import LANGUAGE_MODELS
from tunesmith.export.gguf_vision import PROJECTORS
from tunesmith.families import (
    FAMILIES,
    family,
    is_vision_language,
    reward_model_types,
    types_where,
    vision_language_types,
    vision_model_type,
)
from tunesmith.hparams import ModelArguments
from tunesmith.models.loader import load_tokenizer
from tunesmith.utils.paths import PROCESSOR_FILES


def _one_layer_config(model_type: str):
    """transformers' default config of the family with one layer in its text model and its vision tower (the
    module paths are the same for any depth)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    for sub in (config.get_text_config(decoder=True), getattr(config, "vision_config", None)):
        for name in ("num_hidden_layers", "depth", "num_layers"):
            if isinstance(getattr(sub, name, None), int):
                setattr(sub, name, 1)
    return config


@pytest.mark.parametrize("model_type", vision_language_types())
def test_each_vision_family_names_modules_its_transformers_class_has(model_type):
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):  # shapes only: no memory, no weights drawn
        model = AutoModelForImageTextToText.from_config(_one_layer_config(model_type))
    names = {name for name, _ in model.named_modules()}
    parts = FAMILIES[model_type].vision
    assert {parts.tower, *parts.projectors, parts.language} <= names
    assert is_vision_language(model) and is_vision_language(model.config)


def test_the_text_families_are_transformers_model_types_and_not_vision_language():
    from transformers import CONFIG_MAPPING

    text = [t for t, f in FAMILIES.items() if not f.is_vision_language]
    assert text and all(t in CONFIG_MAPPING for t in text)
    assert not any(is_vision_language(CONFIG_MAPPING[t]()) for t in ("llama", "gemma3_text", "qwen3_moe"))


def test_the_layers_lists_come_from_the_entries():
    assert types_where("packable") == ("idefics3", "smolvlm", "qwen2_vl", "qwen2_5_vl")
    assert types_where("mrope") == ("qwen2_vl", "qwen2_5_vl")
    assert types_where("gguf_exported") == ("qwen2_vl", "qwen2_5_vl", "gemma3")
    assert reward_model_types() == ["gemma3"]  # transformers' Gemma3ForSequenceClassification
    assert family("gemma3").reward_model_class() == "Gemma3ForSequenceClassification"
    assert "mixtral" in types_where("plain_head") and "mixtral" not in types_where("position_wise_mlp")


def test_an_unlisted_family_is_assumed_nothing():
    unknown = family("no_such_family")
    assert not (unknown.is_vision_language or unknown.packable or unknown.mrope or unknown.plain_head
                or unknown.position_wise_mlp or unknown.gguf_exported)
    assert family(None).model_type == ""


def test_facts_only_where_they_apply_and_export_writes_what_the_registry_names():
    for t, f in FAMILIES.items():
        vision_facts = (f.packable, f.mrope, f.gguf_language, f.mmproj_projector, f.gguf_exported)
        assert f.is_vision_language or not any(vision_facts), t
        assert not f.is_vision_language or not (f.plain_head or f.position_wise_mlp), t
        assert not f.gguf_exported or (f.gguf_language and f.mmproj_projector), t
    # export's writers cover every family the registry gives a llama.cpp architecture or projector, in order
    assert tuple(PROJECTORS) == ("qwen2_vl", "qwen2_5_vl", "gemma3", "idefics3")
    assert {t: p.projector for t, p in PROJECTORS.items()} == {t: FAMILIES[t].mmproj_projector for t in PROJECTORS}
    assert set(LANGUAGE_MODELS) == set(types_where("gguf_language"))
    assert all(LANGUAGE_MODELS[t].name == FAMILIES[t].gguf_language for t in LANGUAGE_MODELS)


def _folder(path, config: dict, processor: bool):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if processor:
        (path / PROCESSOR_FILES[0]).write_text("{}", encoding="utf-8")
    return str(path)


def test_a_folder_is_vision_language_with_a_vision_config_and_a_processor(tmp_path):
    vision = {"model_type": "gemma3", "vision_config": {"model_type": "siglip_vision_model"}}
    assert vision_model_type(_folder(tmp_path / "vlm", vision, processor=True)) == "gemma3"
    assert is_vision_language(tmp_path / "vlm")  # a Path as well as a str
    # Gemma 3 weights saved without their processor load as a causal LM; a text model's folder is one
    assert not is_vision_language(_folder(tmp_path / "no_processor", vision, processor=False))
    assert not is_vision_language(_folder(tmp_path / "text", {"model_type": "llama"}, processor=True))
    assert not is_vision_language(str(tmp_path / "missing")) and not is_vision_language(None)
    assert is_vision_language(vision) and not is_vision_language({"model_type": "llama"})


def test_a_tokenizer_is_vision_language_when_it_carries_its_processor(tmp_path, default_model_path, tokenizer):
    folder = build_vlm_dir("gemma3", tmp_path / "vlm", default_model_path)
    vlm_tokenizer = load_tokenizer(ModelArguments(model_name_or_path=folder))
    assert is_vision_language(folder) and is_vision_language(vlm_tokenizer)
    assert not is_vision_language(tokenizer) and not is_vision_language(default_model_path)
