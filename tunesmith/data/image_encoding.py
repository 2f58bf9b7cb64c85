"""Conversations with images, encoded for a vision-language model. The text path does the rendering and the
masking, as for any model (data/template.py: the chat template draws each image as its placeholder, such as
Qwen's `<|vision_start|><|image_pad|><|vision_end|>`, in a user turn, so untrained); then the model's own
processor expands every placeholder into the image's tokens (their number follows the picture's size) and the
labels are carried across: a token the expansion inserts is never trained, a reply's tokens keep their labels,
and a reply whose tokens the expansion would change is an error, never a silent shift.

A record holds the expanded `input_ids` and `labels` (so lengths, the trained-token counts and `tunesmith
inspect` are what the model sees), the rendered `text` before expansion and its `images`: the collators run the
processor on them again for the pixels, and check that it gives the same tokens: `ImageConversationCollator` (padded
rows), `ImagePackingCollator` (one padding-free row, for the families whose packing is exact) and, for preference
pairs (data/preference.py: each side expanded by `expand_reply`), `ImagePairCollator`."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..constants import IGNORE_INDEX
from ..errors import DataError, TemplateError
from .collator import PackingCollator, with_reference_logps
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


def expand_reply(processor: Any, ids: list[int], span: tuple[int, int], images: list[str],
                 max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[ImageExample, tuple[int, int]]:
    """One side of a preference pair (the reply at ids[start:end]) with its images' tokens in place, and the
    reply's span there. The pair's context may have lost its first turns (data/preference.py cuts from the front):
    the pictures shown are the last of `images`, one per placeholder left."""
    start, end = span
    shown = ids.count(placeholder_id(processor))
    labels = [IGNORE_INDEX] * start + ids[start:end] + [IGNORE_INDEX] * (len(ids) - end)
    example = expand(processor, Encoded(ids, labels), images[len(images) - shown:] if shown else [], max_image_pixels)
    trained = [k for k, label in enumerate(example.labels) if label != IGNORE_INDEX]
    return example, (trained[0], trained[-1] + 1)


def processed_batch(processor: Any, features: list[dict[str, Any]], texts: list[str], images: list[list[str]],
                    ids: list[list[int]], max_image_pixels: int) -> dict[str, Any]:
    """The processor's batch (padded on the right) for rendered texts and their pictures, checked to give each
    record's tokens: the model then sees what the record's labels were placed on."""
    pictures = [[open_image(ref, max_image_pixels) for ref in refs or []] for refs in images]
    batch = processor(text=texts, images=pictures if any(pictures) else None, padding=True, padding_side="right",
                      add_special_tokens=False, return_tensors="pt")
    for row, expected in enumerate(ids):
        if batch["input_ids"][row, :len(expected)].tolist() != list(expected):
            f = features[row % len(features)]
            raise DataError(f"{f.get('source', 'a record')}:line {f.get('line', '?')}: the processor expands "
                            "this example's images differently from when it was encoded (another image "
                            "processor setting?): pass --overwrite_cache")
    return batch


@dataclass
class ImageConversationCollator:
    """A batch of image-conversation records, padded on the right: the processor's outputs for their texts and
    pictures (input_ids, attention_mask, pixel_values and whatever else the model takes: image_grid_thw,
    pixel_attention_mask, token_type_ids), and the records' labels."""

    processor: Any
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = processed_batch(self.processor, features, [f["text"] for f in features],
                                [f["images"] for f in features], [f["input_ids"] for f in features],
                                self.max_image_pixels)
        labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for row, f in enumerate(features):
            labels[row, :len(f["labels"])] = torch.as_tensor(f["labels"])
        return {**batch, "labels": labels}


@dataclass
class ImagePackingCollator:
    """A batch of image-conversation records as one padding-free row (data/collator.PackingCollator: positions from
    0 in each example, `cu_seq_lens_q`, the trained positions' logits only), with the processor's picture inputs for
    the row's pictures in order: for the families whose packing is exact (`packable` in families.py), where each
    picture is encoded alone and its features replace its tokens. The row runs in one forward (a forward split would
    split the pictures)."""

    processor: Any
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    trained_logits_only: bool = True
    # Qwen's M-RoPE: the model's get_rope_index, run on each example alone (its pictures' grids place its tokens)
    rope_index: Callable | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [token for f in features for token in f["input_ids"]]
        pictures = processed_batch(self.processor, features, ["".join(f["text"] for f in features)],
                                   [[ref for f in features for ref in f["images"] or []]], [ids],
                                   self.max_image_pixels)
        packed = PackingCollator(trained_logits_only=self.trained_logits_only, max_forward_tokens=0)(features)
        if self.rope_index is not None:
            packed["position_ids"] = self.mrope_positions(features, pictures, packed["position_ids"])
        dropped = ("input_ids", "attention_mask")
        return {**packed, **{key: value for key, value in pictures.items() if key not in dropped}}

    def mrope_positions(self, features: list[dict[str, Any]], row: dict[str, Any], text_positions: torch.Tensor
                        ) -> torch.Tensor:
        """[4, 1, tokens]: each example's text positions (from 0: where transformers' mask sees the examples
        start), then its three M-RoPE rows as the model computes them for the example alone."""
        parts, start, image = [], 0, 0
        for f in features:
            end, shown = start + len(f["input_ids"]), len(f["images"] or [])
            ids = row["input_ids"][:, start:end]
            positions, _ = self.rope_index(ids, row["mm_token_type_ids"][:, start:end], attention_mask=torch.ones_like(ids),
                                           image_grid_thw=row["image_grid_thw"][image:image + shown] if shown else None)
            parts.append(positions)
            start, image = end, image + shown
        return torch.cat([text_positions[None], torch.cat(parts, dim=-1).to(text_positions.dtype)])


# What an ImagePairCollator batch holds beside the model's own inputs.
PAIR_BATCH_EXTRAS = ("labels", "margin", "reference_logps")


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """An ImagePairCollator batch's inputs for the model: ids, mask and whatever its processor made (pixel values,
    image grids, token types, ...)."""
    return {key: value for key, value in batch.items() if key not in PAIR_BATCH_EXTRAS}


@dataclass
class ImagePairCollator:
    """Preference pairs of a vision-language model (data/preference.py's records with `chosen_text`,
    `rejected_text` and `images`) as one padded batch through its processor: every chosen sequence, then every
    rejected one (chosen i is row i, rejected i row B + i), with `labels` holding each reply's tokens and
    IGNORE_INDEX elsewhere (what DPO scores), each pair's `margin` (what a reward model's loss asks for), and
    precomputed reference log-probs, when the records carry them, as `reference_logps`."""

    processor: Any
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        sides = [(f[f"{side}_text"], f[f"{side}_ids"], f[f"{side}_start"], f[f"{side}_end"])
                 for side in ("chosen", "rejected") for f in features]
        batch = processed_batch(self.processor, features, [text for text, *_ in sides],
                                [f["images"] for f in features] * 2, [ids for _, ids, *_ in sides],
                                self.max_image_pixels)
        labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for row, (_, ids, start, end) in enumerate(sides):
            labels[row, start:end] = torch.as_tensor(ids[start:end])
        margin = torch.as_tensor([float(f.get("margin") or 0.0) for f in features])
        return with_reference_logps({**batch, "labels": labels, "margin": margin}, features)
