"""Conversations with images, encoded for a vision-language model. The text path does the rendering and the
masking, as for any model (data/template.py: the chat template draws each image as its placeholder, such as
Qwen's `<|vision_start|><|image_pad|><|vision_end|>`, in a user turn, so untrained); then the model's own
processor expands every placeholder into the image's tokens (their number follows the picture's size) and the
labels are carried across: a token the expansion inserts is never trained, a reply's tokens keep their labels,
and a reply whose tokens the expansion would change is an error, never a silent shift.

A record holds the expanded `input_ids` and `labels` (so lengths, the trained-token counts and `tunesmith
inspect` are what the model sees), the rendered `text` before expansion and its `images`: the collator
(`ImageConversationCollator`) runs the processor on them again for the pixels, and checks that it gives the
same tokens."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import torch

from ..constants import IGNORE_INDEX
from ..errors import DataError, TemplateError
from .images import DEFAULT_MAX_IMAGE_PIXELS, open_image
from .template import Encoded, trained_token_count


@dataclass
class ImageExample:
    input_ids: list[int]
    labels: list[int]
    text: str  # the render before expansion, what the processor is given
    images: list[str]  # the references of the pictures it shows, in order


def placeholder_id(processor: Any) -> int:
    """The token a chat template writes once per image (the one the processor expands)."""
    return processor.tokenizer.convert_tokens_to_ids(processor.image_token)


def carry_labels(ids: list[int], labels: list[int], expanded: list[int]) -> list[int]:
    """`labels` of `ids` moved onto `expanded` (the same tokens with images' tokens inserted): matching tokens
    keep theirs, inserted ones get IGNORE_INDEX. Raises TemplateError when a trained token has no match."""
    matcher = difflib.SequenceMatcher(None, ids, expanded, autojunk=False)
    out = [IGNORE_INDEX] * len(expanded)
    carried = 0
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            out[block.b + k] = labels[block.a + k]
            carried += labels[block.a + k] != IGNORE_INDEX
    if carried != trained_token_count(labels):
        raise TemplateError("the processor's image expansion changed the tokens of a trained reply (an image "
                            "placeholder inside a reply?): images go in user turns")
    return out


def expand(processor: Any, encoded: Encoded, images: list[str], max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
           ) -> ImageExample:
    """The example with the processor's image tokens in place of its placeholders (the first images of
    `images`, one per placeholder in it)."""
    tokenizer = processor.tokenizer
    shown = images[:encoded.input_ids.count(placeholder_id(processor))]
    text = tokenizer.decode(encoded.input_ids, skip_special_tokens=False)
    pictures = [open_image(ref, max_image_pixels) for ref in shown]
    try:
        out = processor(text=[text], images=[pictures] if pictures else None, add_special_tokens=False)
    except ValueError as e:  # e.g. placeholders and images that do not pair up
        raise DataError(f"{type(processor).__name__} refused the example: {e}") from None
    expanded = [int(t) for t in out["input_ids"][0]]
    if not pictures and expanded != encoded.input_ids:
        raise TemplateError("the processor tokenizes this model's chat template's text differently from its tokenizer")
    return ImageExample(expanded, carry_labels(encoded.input_ids, encoded.labels, expanded), text, shown)


def fit_with_images(processor: Any, full: Encoded, images: list[str], max_length: int, truncation: str,
                    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[ImageExample | None, bool]:
    """(the example within max_length tokens once expanded, whether turns were dropped to fit); None when no
    whole reply fits. An image is never cut: under any --truncation but drop_example, the example keeps its
    longest run of whole exchanges that fits, as drop_turns does."""
    example = expand(processor, full, images, max_image_pixels)
    if len(example.input_ids) <= max_length:
        return example, False
    if truncation == "drop_example":
        return None, False
    for cut in sorted(full.cut_points, reverse=True):
        part = Encoded(full.input_ids[:cut], full.labels[:cut])
        if trained_token_count(part.labels) == 0:
            break
        if cut >= len(full.input_ids):
            continue
        example = expand(processor, part, images, max_image_pixels)
        if len(example.input_ids) <= max_length:
            return example, True
    return None, False


@dataclass
class ImageConversationCollator:
    """A batch of image-conversation records, padded on the right: the processor's outputs for their texts and
    pictures (input_ids, attention_mask, pixel_values and whatever else the model takes: image_grid_thw,
    pixel_attention_mask, token_type_ids), and the records' labels."""

    processor: Any
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        pictures = [[open_image(ref, self.max_image_pixels) for ref in f["images"] or []] for f in features]
        batch = self.processor(text=[f["text"] for f in features], images=pictures if any(pictures) else None,
                               padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt")
        labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for row, f in enumerate(features):
            n = len(f["input_ids"])
            if batch["input_ids"][row, :n].tolist() != list(f["input_ids"]):
                raise DataError(f"{f.get('source', 'a record')}:line {f.get('line', '?')}: the processor expands "
                                "this example's images differently from when it was encoded (another image "
                                "processor setting?): pass --overwrite_cache")
            labels[row, :n] = torch.as_tensor(f["labels"])
        return {**batch, "labels": labels}
