"""The model families tunesmith knows, one entry each (by transformers' model_type) with everything tunesmith knows
of it: a vision-language model's parts (module paths in transformers 5's classes), whether its examples pack, its
M-RoPE positions, its reward-model class, how GGUF export writes it (llama.cpp's architecture and mmproj
projector); a text model's plain output head and position-wise MLP. And the one answer to "is this a
vision-language model?", asked of a folder, a config or model, or a tokenizer.

A core module between hparams/ and data/: the rules, data, models, train and the export feature read it; it reads
only utils/. Where a new family goes: docs/architecture.md, "The model families"."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .utils.paths import has_processor, model_config


@dataclass(frozen=True)
class VisionParts:
    """Module paths in the model AutoModelForImageTextToText loads (before PEFT wraps it)."""

    tower: str
    projectors: tuple[str, ...]
    language: str


@dataclass(frozen=True)
class Family:
    """What tunesmith knows of one model family. The defaults are what an unlisted family gets: nothing assumed."""

    model_type: str
    # -- a vision-language model's
    vision: VisionParts | None = None  # None: a text model
    # Its examples pack into one padding-free row exactly (data/image_encoding.ImagePackingCollator): a language
    # model with causal attention, pictures encoded one by one and put in place of their tokens, and positions from
    # each example alone (plain ones, or M-RoPE's from the model's get_rope_index on the example).
    packable: bool = False
    mrope: bool = False  # positions from the model's own get_rope_index (Qwen's M-RoPE), per packed example
    # GGUF export: llama.cpp's architecture of its language model (gguf.MODEL_ARCH_NAMES) and the projector type of
    # its mmproj file (gguf.VisionProjectorType); written where both are set, exported where gguf_exported (checked
    # in llama.cpp's multimodal library on a picture).
    gguf_language: str | None = None
    mmproj_projector: str | None = None
    gguf_exported: bool = False
    # -- a text model's (or a vision-language model's language model, by its text model_type)
    # The causal-LM forward turns the head's output into logits with at most a final soft-cap
    # (`final_logit_softcapping`) and a scale (`logit_scale`, or 1 / `logits_scaling`), read from the config
    # (train/head_loss.py's tiled head computes the same).
    plain_head: bool = False
    # The decoder layers' `mlp` computes each token on its own: a gated or plain MLP and nothing else (a MoE's
    # router loss is taken over the whole sequence) (models/tiled_mlp.py).
    position_wise_mlp: bool = False

    @property
    def is_vision_language(self) -> bool:
        return self.vision is not None

    def reward_model_class(self) -> str | None:
        """The sequence-classification class transformers gives this family (the reward model's), or None."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

        return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(self.model_type)


_LLAVA_LIKE = VisionParts("model.vision_tower", ("model.multi_modal_projector",), "model.language_model")
_QWEN_VL = VisionParts("model.visual", ("model.visual.merger",), "model.language_model")
_IDEFICS = VisionParts("model.vision_model", ("model.connector",), "model.text_model")


def _text(model_type: str, position_wise_mlp: bool = True) -> Family:
    """A text family whose head is plain; its MLP position-wise unless it routes tokens to experts."""
    return Family(model_type, plain_head=True, position_wise_mlp=position_wise_mlp)


_FAMILIES = (
    # Vision-language models. Not packable: Gemma 3 (the tokens of a picture attend to each other both ways, which a
    # causal packed row does not compute) and Qwen3-VL (its positions are not checked here). Idefics3's files are
    # written but not exported: llama.cpp cuts every picture into tiles of image_size plus an overview
    # (mtmd-image.cpp, mtmd_image_preprocessor_idefics3), where transformers' processor shows a picture no larger
    # than a tile whole, so the two lay out different prompts and the check cannot pass on such a picture; a check
    # on tiled pictures is not built yet. The order is the one messages list them in.
    Family("idefics3", _IDEFICS, packable=True, gguf_language="llama", mmproj_projector="idefics3"),
    Family("smolvlm", _IDEFICS, packable=True),
    Family("qwen2_vl", _QWEN_VL, packable=True, mrope=True, gguf_language="qwen2vl",
           mmproj_projector="qwen2vl_merger", gguf_exported=True),
    Family("qwen2_5_vl", _QWEN_VL, packable=True, mrope=True, gguf_language="qwen2vl",
           mmproj_projector="qwen2.5vl_merger", gguf_exported=True),
    Family("qwen3_vl", VisionParts("model.visual", ("model.visual.merger", "model.visual.deepstack_merger_list"),
                                   "model.language_model")),
    Family("gemma3", _LLAVA_LIKE, gguf_language="gemma3", mmproj_projector="gemma3", gguf_exported=True),
    Family("llava", _LLAVA_LIKE),
    Family("llava_next", _LLAVA_LIKE),
    Family("mistral3", _LLAVA_LIKE),
    Family("internvl", _LLAVA_LIKE),
    Family("paligemma", _LLAVA_LIKE),
    Family("mllama", VisionParts("model.vision_model", ("model.multi_modal_projector",), "model.language_model")),
    # Text models
    *(_text(t) for t in ("llama", "mistral", "ministral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
                         "olmo2", "olmo3", "smollm3", "granite", "cohere", "cohere2", "starcoder2")),
    *(_text(t, position_wise_mlp=False) for t in ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")),
)
FAMILIES: dict[str, Family] = {f.model_type: f for f in _FAMILIES}


def family(model_type: str | None) -> Family:
    """The entry of a model type; an unlisted one gets an entry with nothing assumed."""
    return FAMILIES.get(model_type or "") or Family(model_type or "")


def types_where(fact: str) -> tuple[str, ...]:
    """The model types, in the registry's order, whose entry has `fact` (a Family field or property) true."""
    return tuple(t for t, f in FAMILIES.items() if getattr(f, fact))


def vision_language_types() -> tuple[str, ...]:
    return types_where("is_vision_language")


def reward_model_types() -> list[str]:
    """The vision-language model types a reward model can be trained from: those transformers gives a
    sequence-classification class that reads pictures (of the families above, Gemma 3's
    Gemma3ForSequenceClassification)."""
    return sorted(t for t in vision_language_types() if FAMILIES[t].reward_model_class())


# Set on the tokenizer of a vision-language model (models/vision.load_processor; data/template.processor_of reads it):
# its processor, so that every stage holding the tokenizer reaches it.
PROCESSOR_ATTRIBUTE = "tunesmith_processor"


def vision_model_type(path: str | os.PathLike | None) -> str | None:
    """The model type of a local vision-language model directory (its config has a `vision_config` and the
    folder ships a processor), else None: text-only models, and Gemma 3 weights saved without a processor."""
    if not path:
        return None
    config = model_config(path)
    if not config.get("vision_config") or not has_processor(path):
        return None
    return config.get("model_type")


def is_vision_language(source: Any) -> bool:
    """Whether `source` is (of) a vision-language model, the one way to ask: a local model folder (a path: its
    config.json has a `vision_config` and it ships a processor), a transformers config or config.json's dict (a
    `vision_config`), a model (PEFT's too: its config's), a processor, or a tokenizer (it carries its processor, as
    models/vision.load_processor leaves it)."""
    if source is None:
        return False
    if isinstance(source, (str, os.PathLike)):
        return vision_model_type(source) is not None
    if isinstance(source, dict):
        return bool(source.get("vision_config"))
    config = getattr(source, "config", None)
    if config is not None and hasattr(config, "model_type"):  # a model
        source = config
    if hasattr(source, "model_type") and hasattr(source, "to_dict"):  # a config
        return getattr(source, "vision_config", None) is not None
    if hasattr(source, "image_processor"):  # a processor
        return True
    return getattr(source, PROCESSOR_ATTRIBUTE, None) is not None  # a tokenizer
