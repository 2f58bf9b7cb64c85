"""The vision-language model families tunesmith knows, by model type: where each keeps its vision tower, its
projector and its language model (module paths in transformers 5's classes), and which of them can be a reward
model. Pure data, below the rules (hparams/rules.py) and the models that use it (models/vision.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VisionParts:
    """Module paths in the model AutoModelForImageTextToText loads (before PEFT wraps it)."""

    tower: str
    projectors: tuple[str, ...]
    language: str


_LLAVA_LIKE = VisionParts("model.vision_tower", ("model.multi_modal_projector",), "model.language_model")
_QWEN_VL = VisionParts("model.visual", ("model.visual.merger",), "model.language_model")
_IDEFICS = VisionParts("model.vision_model", ("model.connector",), "model.text_model")

VISION_FAMILIES: dict[str, VisionParts] = {
    "qwen2_vl": _QWEN_VL,
    "qwen2_5_vl": _QWEN_VL,
    "qwen3_vl": VisionParts("model.visual", ("model.visual.merger", "model.visual.deepstack_merger_list"),
                            "model.language_model"),
    "gemma3": _LLAVA_LIKE,
    "idefics3": _IDEFICS,
    "smolvlm": _IDEFICS,
    "llava": _LLAVA_LIKE,
    "llava_next": _LLAVA_LIKE,
    "mistral3": _LLAVA_LIKE,
    "internvl": _LLAVA_LIKE,
    "paligemma": _LLAVA_LIKE,
    "mllama": VisionParts("model.vision_model", ("model.multi_modal_projector",), "model.language_model"),
}


def reward_model_types() -> list[str]:
    """The vision-language model types a reward model can be trained from: those transformers gives a
    sequence-classification class that reads pictures (of the families above, Gemma 3's
    Gemma3ForSequenceClassification)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    return sorted(t for t in VISION_FAMILIES if t in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


# The families whose examples pack into one padding-free row exactly (data/image_encoding.ImagePackingCollator): a
# language model with causal attention, pictures encoded one by one and put in place of their tokens, and positions
# from each example alone: plain ones (Idefics3, SmolVLM) or M-RoPE's from the model's get_rope_index on the example
# (Qwen2-VL, Qwen2.5-VL: MROPE_VISION_TYPES). Not Gemma 3: the tokens of a picture attend to each other both ways,
# which a causal packed row does not compute; not Qwen3-VL (its positions are not checked here).
MROPE_VISION_TYPES = ("qwen2_vl", "qwen2_5_vl")
PACKABLE_VISION_TYPES = ("idefics3", "smolvlm", *MROPE_VISION_TYPES)
