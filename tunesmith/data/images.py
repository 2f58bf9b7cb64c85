"""Images in conversations: where a row's images are, read as content parts, and the pictures themselves.

A message that shows images keeps its content as a list of parts in the order the data gives them,
`{"type": "text", "text": ...}` and `{"type": "image", "image": REF}`, where REF is an absolute file path or
a `data:` URL: what chat templates of vision-language models read. The forms read:

- OpenAI: `{"type": "image_url", "image_url": {"url": PATH_OR_DATA_URL}}` (the url as a bare string too);
- transformers / TRL: `{"type": "image", "image": PATH}` (also `"url"` or `"path"` for the reference);
- ShareGPT / LLaMA-Factory: an `images` column, each `<image>` in the messages' text standing for the next one;
- a table's image cell (`{"bytes": ..., "path": ...}`, what `datasets`' Image feature stores).

Relative paths are relative to the data file's folder. Remote URLs are refused (nothing is fetched at run time).
The pictures are opened where a vision-language model encodes the row (`open_image`), so an unreadable or
oversized file is reported with the row's file and line, and nothing of that row is trained."""

from __future__ import annotations

import base64
import binascii
import io
import re
from pathlib import Path
from typing import Any

from ..errors import DataError

IMAGE = "image"
IMAGE_PARTS = ("image", "image_url", "input_image")
PLACEHOLDER = "<image>"  # LLaMA-Factory's and ShareGPT's: the next image of the row's `images` column
# Largest picture opened (width x height), about 4096 x 4096: a larger one is almost always a mistake (a scan
# at print resolution, a decompression bomb), and every processor shrinks it anyway.
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096


def image_part(ref: str) -> dict[str, str]:
    return {"type": IMAGE, IMAGE: ref}


def resolve_reference(value: Any, base_dir: Path | None, confined: bool = False) -> str:
    """An image reference as it is kept: an absolute path, or a data URL. A relative path is relative to base_dir;
    with base_dir None no path is read (data URLs only); `confined`: no path outside base_dir either (a server's
    --image_root). Raises ValueError with the reason."""
    if isinstance(value, dict) and isinstance(value.get("bytes"), (bytes, bytearray)):  # a datasets Image cell
        return "data:image;base64," + base64.b64encode(value["bytes"]).decode("ascii")
    if isinstance(value, dict) and isinstance(value.get("path"), str):
        value = value["path"]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a file path or a data: URL, got {type(value).__name__}")
    if value.startswith("data:"):
        return value
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", value) and not value.startswith("file://"):
        raise ValueError(f"{value}: remote images are not fetched; download it and give the file's path")
    if base_dir is None:
        raise ValueError("pictures are not read from paths here: send the picture as a data: URL (a server reads "
                         "files under its --image_root only)")
    path = Path(value.removeprefix("file://")).expanduser()
    path = (path if path.is_absolute() else base_dir / path).resolve()
    if confined and not path.is_relative_to(base_dir.resolve()):
        raise ValueError(f"{value}: outside the folder pictures are read from ({base_dir})")
    if not path.is_file():
        raise ValueError(f"image file not found: {path} (a relative path is relative to "
                         f"{'the data file' if not confined else 'the image folder'}'s folder)")
    return str(path)


def part_reference(part: dict) -> Any:
    """The reference an image part holds, in any of the forms read."""
    for key in ("image_url", "image", "url", "path"):
        value = part.get(key)
        if isinstance(value, dict) and key == "image_url":
            return value.get("url")
        if value is not None:
            return value
    return None


def describe(ref: str) -> str:
    """A reference for messages: a path as it is, a data URL by its length."""
    return f"a data: URL of {len(ref)} characters" if ref.startswith("data:") else ref


def open_image(ref: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Any:
    """The picture as an RGB PIL image; DataError saying what is wrong with it (unreadable, not an image,
    larger than max_pixels)."""
    from PIL import Image, UnidentifiedImageError

    try:
        if ref.startswith("data:"):
            header, _, payload = ref.partition(",")
            if ";base64" not in header:
                raise DataError(f"image {describe(ref)}: only base64 data: URLs are read")
            source: Any = io.BytesIO(base64.b64decode(payload, validate=True))
        else:
            source = ref
        with Image.open(source) as image:
            if image.width * image.height > max_pixels:
                raise DataError(f"image {describe(ref)}: {image.width}x{image.height} pixels, more than "
                                f"--max_image_pixels {max_pixels}; shrink it or raise the limit")
            image.load()
            return image.convert("RGB")
    except (OSError, UnidentifiedImageError, binascii.Error, Image.DecompressionBombError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"image {describe(ref)}: cannot be read ({type(e).__name__}: {e})") from None


def message_images(messages: list[dict]) -> list[str]:
    """The image references of the messages, in the order the template shows them."""
    return [part[IMAGE] for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == IMAGE]


def has_images(messages: list[dict]) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") == IMAGE for p in m["content"])
               for m in messages)


def as_content_parts(messages: list[dict]) -> list[dict]:
    """Every message's text content as a one-part list (vision-language templates read lists: SmolVLM's
    indexes `content[0]['type']` and would render a string as nothing)."""
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
            for m in messages]


def content_text(content: Any) -> str:
    """The text of a content, a string or a list of parts (images left out)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if part.get("type") == "text")
    return content or ""


def split_placeholders(text: str, images: list[str], start: int) -> tuple[list[dict] | str, int]:
    """A message's text with each `<image>` replaced by the next image of the row's `images` (from index
    `start`): its parts (the text itself when it has none), and the index of the next image."""
    pieces = text.split(PLACEHOLDER)
    if len(pieces) == 1:
        return text, start
    parts: list[dict] = []
    for k, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if k < len(pieces) - 1:
            if start >= len(images):
                raise IndexError(start)
            parts.append(image_part(images[start]))
            start += 1
    return parts, start


class ImagePrompt(list):
    """A prompt's token ids with its images' tokens in place, carrying the processor's image inputs for the model
    (`vision`: pixel_values and, per family, image_grid_thw, mm_token_type_ids, token_type_ids,
    pixel_attention_mask). The engine puts them in the prompt's prefill; to everything else it is a list of ids."""

    def __init__(self, ids: list[int], vision: dict[str, Any]) -> None:
        super().__init__(ids)
        self.vision = vision


def image_prompt(processor: Any, text: str, images: list[str], max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
                 ) -> ImagePrompt:
    """The rendered prompt `text` through the model's processor with its pictures."""
    pictures = [open_image(ref, max_pixels) for ref in images]
    out = processor(text=[text], images=[pictures], add_special_tokens=False, return_tensors="pt")
    ids = out.pop("input_ids")[0].tolist()
    out.pop("attention_mask", None)
    return ImagePrompt(ids, dict(out))


def probe_picture() -> str:
    """A small fixed picture (a red square on white, 56x56) as a data: URL, for checks that need one."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (56, 56), "white")
    ImageDraw.Draw(image).rectangle((14, 14, 42, 42), fill=(220, 30, 30))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
