"""Tiny random vision-language models of real families, built from transformers' own config classes with their real
processors' image handling (Qwen2-VL's patches, grid and merge; Gemma 3's SigLIP crops and fixed image sequence;
Idefics3's / SmolVLM's connector and `<image>` expansion), written into a model folder as the hub ships one: no hub
access. The language model's tokenizer is the default model's (SmolLM2), with each family's image tokens added as
special tokens, and the family's official chat template (its image parts as the model card's template writes them).

Sizes: hidden 64, 2 layers, images of a few dozen pixels a side, so that each image is a handful of tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("qwen2_vl", "gemma3", "idefics3")
# Qwen2.5-VL (its window-attention tower) joins the tests that train and generate; the rest take the three above.
TRAIN_AND_GENERATE_FAMILIES = (*FAMILIES, "qwen2_5_vl")

# Qwen2-VL-Instruct's chat_template (the hub's chat_template.json), unchanged.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

# Gemma 3's template as transformers' processor tests carry it (tests/models/gemma3/test_processing_gemma3.py).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set first_user_prefix = messages[0]"
    "['content'][0]['text'] + '\n\n' -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set "
    "first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in "
    "loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ "
    "raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        "
    "{%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + "
    "(first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ "
    "message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in "
    "message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}"
    "\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- "
    "endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    "
    "{{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)

# SmolVLM-Instruct's chat template (an Idefics3 model), unchanged.
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == "
    "'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}"
    "{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# initializer_range 0.2: with 0.02 the frozen output head's logits span about one nat, and no adapter could bring a
# memorised reply's loss much below ln(vocabulary)
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "initializer_range": 0.2}


def _special_ids(tokenizer: Any, eos: str | None = None, pad: bool = True) -> dict[str, int]:
    """The text config's token ids; `pad`: whether the family's real config names a padding id (Qwen's do not)."""
    ids = {"bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.convert_tokens_to_ids(eos) if eos else tokenizer.eos_token_id}
    return {**ids, "pad_token_id": tokenizer.pad_token_id} if pad else ids


def _tokenizer_with(base_dir: str, special: list[str], **extra_special: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir, extra_special_tokens=extra_special or None)
    tokenizer.add_special_tokens({"additional_special_tokens": special}, replace_extra_special_tokens=False)
    return tokenizer


def _qwen2_vl(base_dir: str) -> tuple[Any, Any]:
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
    )

    tokenizer = _tokenizer_with(base_dir, ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                                           "<|video_pad|>")}
    # 28x28 pixels per merged token: a 56x56 picture is 4 tokens, 112x84 is 12
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=112 * 112, patch_size=14, merge_size=2,
                                            temporal_patch_size=2)
    processor = QwenFolder(image_processor, tokenizer, QWEN2_VL_TEMPLATE, Qwen2VLProcessor.__name__)
    # Shaped as Qwen/Qwen2-VL-7B-Instruct's config.json: bos and eos but no pad_token_id anywhere (the hub's flat
    # file, which transformers 5 reads into text_config), the vision token ids at the top.
    config = Qwen2VLConfig(
        text_config={**TEXT, **_special_ids(tokenizer, pad=False), "vocab_size": len(tokenizer),
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen2VLForConditionalGeneration(config), processor


def _qwen2_5_vl(base_dir: str) -> tuple[Any, Any]:
    """Qwen2.5-VL: Qwen2-VL's processor and template, a vision tower with window attention (windows of 112 pixels,
    the released models' and llama.cpp's, 4x4 merged tokens: a 224x56 picture spans two; the second block attends
    over the whole picture) and RMSNorm/SwiGLU blocks."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    qwen2, processor = _qwen2_vl(base_dir)
    processor.processor_class = "Qwen2_5_VLProcessor"
    text = qwen2.config.text_config.to_dict()
    # Shaped as Qwen/Qwen2.5-VL-7B-Instruct's config.json: Qwen2-VL's, no pad_token_id anywhere.
    config = Qwen2_5_VLConfig(
        text_config={key: text[key] for key in (*TEXT, "vocab_size", "rope_parameters", "bos_token_id",
                                                "eos_token_id")},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                       "fullatt_block_indexes": [1]},
        **{key: getattr(qwen2.config, key) for key in ("image_token_id", "video_token_id", "vision_start_token_id",
                                                       "vision_end_token_id")},
    )
    return Qwen2_5_VLForConditionalGeneration(config), processor


class QwenFolder:
    """A Qwen2-VL folder's processor files as the hub ships them: preprocessor_config.json (the image processor's
    settings, naming the processor class), the tokenizer and the chat template. Written by hand: transformers builds
    this processor with a video processor, which needs torchvision, not installable beside this CPU build of torch
    (tunesmith loads such a folder for images: models/vision.image_only_processor)."""

    def __init__(self, image_processor: Any, tokenizer: Any, chat_template: str, processor_class: str) -> None:
        self.image_processor, self.tokenizer, self.processor_class = image_processor, tokenizer, processor_class
        self.tokenizer.chat_template = chat_template

    def save_pretrained(self, path: Path) -> None:
        settings = {**self.image_processor.to_dict(), "image_processor_type": "Qwen2VLImageProcessor",
                    "processor_class": self.processor_class}
        (Path(path) / "preprocessor_config.json").write_text(json.dumps(settings, indent=2))
        self.tokenizer.save_pretrained(path)


def _gemma3(base_dir: str) -> tuple[Any, Any]:
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    marks = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = _tokenizer_with(base_dir, ["<start_of_turn>", "<end_of_turn>", *marks.values()], **marks)
    tokens_per_image = 4  # 32x32 pixels, 8x8 patches: 4x4 patches pooled 2x2
    image_processor = Gemma3ImageProcessor(size={"height": 32, "width": 32}, do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, chat_template=GEMMA3_TEMPLATE,
                                image_seq_length=tokens_per_image)
    # Shaped as Google's gemma-3-27b-it config.json (a copy: NVIDIA/TensorRT-LLM,
    # tests/unittest/_torch/modeling/test_modeling_gemma3.py, GEMMA3_27B_CONFIG): no pad_token_id or bos_token_id at
    # the top, eos_token_id there as the list [<eos>, <end_of_turn>], the image token indices; the text config's
    # token ids are Gemma3TextConfig's defaults there (Gemma's tokenizer's), set here for this tokenizer.
    config = Gemma3Config(
        text_config={**TEXT, **_special_ids(tokenizer, "<end_of_turn>"), "vocab_size": len(tokenizer), "head_dim": 16,
                     "sliding_window": 16,
                     "layer_types": ["sliding_attention", "full_attention"]},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=tokenizer.convert_tokens_to_ids(marks["boi_token"]),
        eoi_token_index=tokenizer.convert_tokens_to_ids(marks["eoi_token"]),
        image_token_index=tokenizer.convert_tokens_to_ids(marks["image_token"]),
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")],
    )
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # from_config starts the projector at zero: no picture would reach the language model
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.2)
    return model, processor


def _idefics3(base_dir: str) -> tuple[Any, Any]:
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    # one 32x32 picture, no splitting: 4x4 patches of 8, shuffled by the connector's scale factor 2 into 4 tokens
    image_processor = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": 32},
                                             max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                  chat_template=SMOLVLM_TEMPLATE)  # adds <image>, <fake_token_around_image>, ...
    tokenizer = processor.tokenizer
    # Shaped as HuggingFaceM4/Idefics3-8B-Llama3's and HuggingFaceTB/SmolVLM-Instruct's config.json: the token ids,
    # pad_token_id among them, in the Llama text_config only; image_token_id and scale_factor at the top.
    config = Idefics3Config(
        text_config={**TEXT, **_special_ids(tokenizer, "<end_of_utterance>"), "model_type": "llama",
                     "vocab_size": len(tokenizer)},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        scale_factor=2, image_token_id=processor.image_token_id,
    )
    return Idefics3ForConditionalGeneration(config), processor


BUILDERS = {"qwen2_vl": _qwen2_vl, "gemma3": _gemma3, "idefics3": _idefics3, "qwen2_5_vl": _qwen2_5_vl}


def build_vlm_dir(family: str, path: Path, base_dir: str, seed: int = 0) -> str:
    """A tiny random `family` model folder at `path`: weights, config, processor (image processor, tokenizer,
    chat template)."""
    torch.manual_seed(seed)
    model, processor = BUILDERS[family](base_dir)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


COLORS = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (20, 40, 230), "yellow": (240, 220, 20)}


def write_memorisation_set(folder: Path) -> str:
    """Eight conversations in `folder`/train.jsonl: a picture of a coloured square or circle (beside it), and its
    colour and shape as the reply. Returns the data file's path."""
    rows = []
    for name, rgb in COLORS.items():
        for shape in ("square", "circle"):
            make_picture(folder / f"{name}_{shape}.png", rgb, shape=shape)
            rows.append({"messages": [
                {"role": "user", "content": [{"type": "image", "image": f"{name}_{shape}.png"},
                                             {"type": "text", "text": "What is this?"}]},
                {"role": "assistant", "content": f"A {name} {shape}."}]})
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_preference_set(folder: Path) -> str:
    """Eight preference pairs in `folder`/pairs.jsonl over the memorisation set's pictures: for each picture the
    reply naming its colour is chosen and one naming another colour rejected, so every reply text is chosen for
    one picture and rejected for another: only a model that reads the picture can prefer every chosen reply."""
    names = list(COLORS)
    rows = []
    for k, name in enumerate(names):
        for shape in ("square", "circle"):
            make_picture(folder / f"{name}_{shape}.png", COLORS[name], shape=shape)
            rows.append({"prompt": [{"role": "user", "content": [{"type": "image", "image": f"{name}_{shape}.png"},
                                                                 {"type": "text", "text": "What is this?"}]}],
                         "chosen": f"A {name} {shape}.", "rejected": f"A {names[(k + 1) % len(names)]} {shape}."})
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_mixed_rows(folder: Path, kind: str) -> str:
    """Three rows of different lengths in `folder` (a jsonl file, pictures beside it): a conversation with two
    pictures in two turns, one with one picture, one with none; as SFT conversations (`kind` "sft") or as preference
    pairs ("pairs"): each conversation without its last reply as the prompt, that reply chosen, another rejected."""
    make_picture(folder / "red.png", (230, 20, 20))
    make_picture(folder / "blue.png", (20, 40, 230), size=(84, 56), shape="circle")

    def user(*parts: str | dict) -> dict:
        return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}

    blue, red = {"type": "image", "image": "blue.png"}, {"type": "image", "image": "red.png"}
    conversations = [
        [user(blue, "What shape is this?"), {"role": "assistant", "content": "A circle."},
         user("And the colour of this one?", red), {"role": "assistant", "content": "Red, a deep red."}],
        [user(red, "Colour?"), {"role": "assistant", "content": "Red."}],
        [user("Say hello."), {"role": "assistant", "content": "Hello!"}],
    ]
    rejected = ["Blue.", "It is green, I think.", "No."]
    rows = ([{"messages": c} for c in conversations] if kind == "sft" else
            [{"prompt": c[:-1], "chosen": c[-1]["content"], "rejected": r} for c, r in zip(conversations, rejected)])
    path = folder / f"{kind}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make_picture(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (56, 56), shape: str = "square"
                 ) -> str:
    """A PNG of a coloured shape on white, `size` pixels (width, height)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    box = (size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4)
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=color)
    image.save(path)
    return str(path)


def image_token_ids(processor: Any) -> set[int]:
    """The ids the processor puts where an image goes (the ones the model replaces with image features)."""
    tokenizer = processor.tokenizer
    ids = set()
    for name in ("image_token_id", "boi_token_id", "fake_image_token_id", "global_image_token_id"):
        value = getattr(processor, name, None)
        if isinstance(value, int):
            ids.add(value)
    for name in ("image_token", "boi_token", "eoi_token", "vision_start_token", "vision_end_token"):
        for owner in (processor, tokenizer):  # Gemma 3's processor calls its boi token image_token, its tokenizer not
            token = getattr(owner, name, None)
            if isinstance(token, str):
                token_id = tokenizer.convert_tokens_to_ids(token)
                if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                    ids.add(token_id)
    return ids
