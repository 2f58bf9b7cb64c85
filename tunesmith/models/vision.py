"""Vision-language models: which folder is one, its processor, and which of its parts are the vision tower,
the projector and the language model, so that LoRA adapts the language model only and the vision parts stay
frozen unless asked (--train_vision_tower, --train_projector).

A folder is a vision-language model when its config has a `vision_config` and it ships a processor
(preprocessor_config.json): Gemma 3 4B and up are both, Gemma 3 1B (gemma3_text) neither (families.is_vision_language).
The parts' names are transformers 5's, per model type (the registry, families.py); a vision model of another type is
refused by name."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from ..data.template import apply_chat_template_override, attach_processor
from ..errors import ConfigError
from ..families import VisionParts, family, is_vision_language, vision_language_types
from ..utils.paths import PROCESSOR_FILES


def vision_parts(config: Any) -> VisionParts | None:
    """The parts of a vision-language model's config; None for a text-only model. A vision model tunesmith does
    not know is refused (its parts' names would be a guess)."""
    if not is_vision_language(config):
        return None
    parts = family(config.model_type).vision
    if parts is None:
        raise ConfigError(f"model type {config.model_type!r} is a vision-language model tunesmith does not know; "
                          f"known: {', '.join(sorted(vision_language_types()))}")
    return parts


def load_processor(path: str, chat_template: str | None, trust_remote_code: bool = False) -> Any:
    """The model's processor (its image processor and tokenizer) with the chat template in use on both, and
    its tokenizer carrying it (data/template.py's `processor_of`): templates then render content parts, and
    every stage that holds the tokenizer reaches the processor."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - transformers' errors here vary by version (ImportError, AttributeError, ...)
        if is_torchvision_available() or not _has_video_processor(path):
            raise
        processor = image_only_processor(path, trust_remote_code)
    tokenizer = processor.tokenizer
    if not getattr(tokenizer, "chat_template", None) and getattr(processor, "chat_template", None):
        tokenizer.chat_template = processor.chat_template
    apply_chat_template_override(tokenizer, chat_template)
    processor.chat_template = tokenizer.chat_template  # saved once, the one training renders with
    attach_processor(tokenizer, processor)
    return processor


def _processor_class(path: str) -> type | None:
    import transformers

    for name in PROCESSOR_FILES:
        file = Path(path) / name
        if file.is_file():
            found = json.loads(file.read_text(encoding="utf-8")).get("processor_class")
            if found and hasattr(transformers, found):
                return getattr(transformers, found)
    return None


def _has_video_processor(path: str) -> bool:
    cls = _processor_class(path)
    return cls is not None and "video_processor" in cls.get_attributes()


def image_only_processor(path: str, trust_remote_code: bool = False) -> Any:
    """The folder's processor (its own class: Qwen2-VL's, Qwen2.5-VL's, ...) with its image processor and tokenizer
    and no video processor. transformers loads a video processor eagerly and it needs torchvision, even for a model
    used on images only (huggingface/transformers#48558), and torchvision's PyPI build does not import beside a CPU
    build of torch. The image processor then runs on its PIL backend; the processor saves and loads as usual."""
    from transformers import AutoImageProcessor, AutoTokenizer

    cls = _processor_class(path)
    attributes = [name for name in cls.get_attributes() if name != "video_processor"]
    image_only = type(cls.__name__, (cls,), {"get_attributes": classmethod(lambda _: list(attributes)),
                                             "__module__": cls.__module__})
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return image_only(image_processor=AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code),
                      tokenizer=tokenizer, chat_template=getattr(tokenizer, "chat_template", None))


def _parameters_under(model: nn.Module, prefix: str) -> list[nn.Parameter]:
    return [p for name, p in model.named_parameters() if name.startswith(prefix + ".")]


def mrope_index(model: nn.Module) -> Callable | None:
    """The model's own M-RoPE position function (get_rope_index) for a packed row's examples, where its family has
    one (its registry entry's `mrope`); None for plain positions."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not family(base.config.model_type).mrope:
        return None
    return base.model.get_rope_index


def set_vision_trainable(model: nn.Module, parts: VisionParts, train_tower: bool, train_projector: bool) -> None:
    """Freeze (or, when asked, train) the vision tower and the projector of a fully fine-tuned model. Qwen's
    projector (its merger) lies inside the tower: there the projector's setting decides for it."""
    for p in _parameters_under(model, parts.tower):
        p.requires_grad_(train_tower)
    for projector in parts.projectors:
        for p in _parameters_under(model, projector):
            p.requires_grad_(train_projector)


def lora_target_pattern(parts: VisionParts, names: list[str]) -> str:
    """A PEFT target_modules regex matching the named linear layers of the language model only (the vision
    tower has q_proj, fc1, ... of the same names)."""
    return rf"{re.escape(parts.language)}\..*\.({'|'.join(map(re.escape, names))})"


def trained_vision_modules(parts: VisionParts, train_tower: bool, train_projector: bool) -> list[str]:
    """What a LoRA run trains whole beside the adapter (PEFT's modules_to_save), saved with it."""
    if train_tower:  # the whole tower, a projector inside it (Qwen's merger) with it
        return [parts.tower, *(p for p in parts.projectors if not p.startswith(parts.tower + "."))]
    return list(parts.projectors) if train_projector else []


def quantization_skipped(parts: VisionParts) -> list[str]:
    """Modules QLoRA leaves unquantized: the vision tower and the projector (small, and bitsandbytes' layers
    would cost them precision that no adapter recovers), and the output head."""
    return [parts.tower, *parts.projectors, "lm_head"]
