"""Images in conversations, from the data file to the batch a vision-language model trains on: the forms images come
in, every broken image reported with its row, and the masking on tiny Qwen2-VL, Gemma 3 and Idefics3 (SmolVLM)
models with their real processors: only the replies train, no image or prompt token does, and the batch the
collator makes is what the dataset encoded."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from tests.helpers.vlm_models import FAMILIES, image_token_ids, make_picture
from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.dataset import build_sft_dataset
from tunesmith.data.formats import BadRows, load_conversations
from tunesmith.data.image_encoding import ImageConversationCollator, placeholder_id
from tunesmith.data.images import message_images
from tunesmith.errors import ConfigError
from tunesmith.hparams import ModelArguments, SFTDataArguments
from tunesmith.inspect.command import run as inspect_main
from tunesmith.models.loader import load_tokenizer


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pics")
    (folder / "sub").mkdir()
    return {"red": make_picture(folder / "red.png", (255, 0, 0)),
            "blue": make_picture(folder / "sub" / "blue.png", (0, 0, 255), size=(112, 84), shape="circle"),
            "folder": folder}


@pytest.fixture(scope="module")
def vlm_dirs(vlm_dir):
    return {family: vlm_dir(family) for family in FAMILIES}


def two_image_rows(folder) -> list[dict]:
    """Two images in two turns, as OpenAI parts (a relative path and a data URL), and the same as a ShareGPT row
    with an `images` column."""
    red_url = "data:image/png;base64," + base64.b64encode((folder / "red.png").read_bytes()).decode()
    openai = {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "sub/blue.png"}},
                                     {"type": "text", "text": "What shape is this?"}]},
        {"role": "assistant", "content": "A blue circle."},
        {"role": "user", "content": [{"type": "text", "text": "And this one?"},
                                     {"type": "image_url", "image_url": {"url": red_url}}]},
        {"role": "assistant", "content": "A red square."}]}
    sharegpt = {"conversations": [{"from": "human", "value": "<image>What shape is this?"},
                                  {"from": "gpt", "value": "A blue circle."},
                                  {"from": "human", "value": "And this one?<image>"},
                                  {"from": "gpt", "value": "A red square."}],
                "images": ["sub/blue.png", str(folder / "red.png")]}
    return [openai, sharegpt]


def test_every_form_of_image_reads_into_parts_in_order(tmp_path, pictures):
    folder = pictures["folder"]
    transformers_form = {"messages": [
        {"role": "user", "content": [{"type": "image", "image": "red.png"}, {"type": "text", "text": "Colour?"}]},
        {"role": "assistant", "content": "Red."}]}
    data = write_rows(folder / "rows.jsonl", [*two_image_rows(folder), transformers_form])
    openai, sharegpt, plain = load_conversations([data])
    assert openai.messages[0]["content"] == [{"type": "image", "image": str(folder / "sub" / "blue.png")},
                                             {"type": "text", "text": "What shape is this?"}]
    assert openai.messages[2]["content"][1]["image"].startswith("data:image/png;base64,")
    assert message_images(sharegpt.messages) == [str(folder / "sub" / "blue.png"), str(folder / "red.png")]
    assert sharegpt.messages[2]["content"] == [{"type": "text", "text": "And this one?"},
                                               {"type": "image", "image": str(folder / "red.png")}]
    assert message_images(plain.messages) == [str(folder / "red.png")]
    assert openai.messages[1]["content"] == "A blue circle."  # text turns stay strings


@pytest.mark.parametrize("row, field, problem", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "missing.png"}}]},
                   {"role": "assistant", "content": "x"}]},
     "messages[0].content[0]", "image file not found"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]},
                   {"role": "assistant", "content": "x"}]},
     "messages[0].content[0]", "remote images are not fetched"),
    ({"conversations": [{"from": "human", "value": "<image><image>Two?"}, {"from": "gpt", "value": "x"}],
      "images": ["red.png"]}, "images", "1 image(s) in `images` but 2 <image> placeholder(s)"),
    ({"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": [{"type": "image", "image": "red.png"}]}]},
     "messages[1].content", "an image in an assistant turn"),
])
def test_bad_image_references_name_file_line_and_field(pictures, row, field, problem):
    data = write_rows(pictures["folder"] / "bad.jsonl", [row])
    with pytest.raises(BadRows) as caught:
        load_conversations([data])
    [reported] = caught.value.problems
    assert reported.startswith(f"{data}:line 1: field `{field}`: ") and problem in reported


def encode(model_dir: str, data: str, **settings):
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=model_dir))
    args = SFTDataArguments(data_path=[data], overwrite_cache=True, **settings)
    return tokenizer, build_sft_dataset(tokenizer, args.data_path, args)


@pytest.mark.parametrize("family", FAMILIES)
def test_only_the_replies_train_and_the_batch_is_what_was_encoded(family, vlm_dirs, pictures, tmp_path):
    tokenizer, dataset = encode(vlm_dirs[family], write_rows(pictures["folder"] / f"{family}.jsonl",
                                                             two_image_rows(pictures["folder"])))
    processor = tokenizer.tunesmith_processor
    image_ids = image_token_ids(processor)
    assert placeholder_id(processor) in image_ids
    assert len(dataset) == 2
    for record in dataset:
        ids, labels = record["input_ids"], record["labels"]
        trained = [t for t, label in zip(ids, labels) if label != IGNORE_INDEX]
        assert trained == [label for label in labels if label != IGNORE_INDEX]
        text = tokenizer.decode(trained)
        assert "A blue circle." in text and "A red square." in text
        assert not any(t in image_ids for t in trained)
        assert "What shape" not in text and "And this one" not in text
        assert len(record["images"]) == 2
        # the expansion is the processor's own: as many image tokens as it makes for these two pictures
        alone = processor(text=[record["text"]], images=[[_open(r) for r in record["images"]]],
                          add_special_tokens=False)
        assert list(alone["input_ids"][0]) == ids
        assert sum(t in image_ids for t in ids) > 2 * 2  # each picture is several tokens
    # the two rows say the same thing in two formats: the same tokens
    assert dataset[0]["input_ids"] == dataset[1]["input_ids"] and dataset[0]["labels"] == dataset[1]["labels"]
    batch = ImageConversationCollator(processor)([dataset[0], dataset[1]])
    assert torch.equal(batch["labels"][0], torch.tensor(dataset[0]["labels"]))
    assert batch["pixel_values"].numel() > 0 and batch["input_ids"].shape == batch["labels"].shape


def _open(ref):
    from tunesmith.data.images import open_image

    return open_image(ref)


def test_rows_with_and_without_images_batch_together(vlm_dirs, pictures):
    rows = [two_image_rows(pictures["folder"])[0],
            {"messages": [{"role": "user", "content": "No picture here."}, {"role": "assistant", "content": "Fine."}]}]
    tokenizer, dataset = encode(vlm_dirs["qwen2_vl"], write_rows(pictures["folder"] / "mixed.jsonl", rows))
    assert dataset[1]["images"] == []
    batch = ImageConversationCollator(tokenizer.tunesmith_processor)([dataset[1], dataset[0]])
    assert batch["input_ids"].shape[0] == 2
    trained = batch["input_ids"][0][batch["labels"][0] != IGNORE_INDEX]
    assert tokenizer.decode(trained) == "Fine.<|im_end|>"


def test_unreadable_and_oversized_images_are_bad_rows_and_nothing_of_them_trains(vlm_dirs, pictures, tmp_path):
    folder = pictures["folder"]
    (folder / "broken.png").write_bytes(b"not a png")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "broken.png"},
                                                       {"type": "text", "text": "?"}]},
                          {"role": "assistant", "content": "x"}]},
            two_image_rows(folder)[0]]
    data = write_rows(folder / "broken.jsonl", rows)
    with pytest.raises(BadRows) as caught:
        encode(vlm_dirs["qwen2_vl"], data)
    [problem] = caught.value.problems
    assert problem.startswith(f"{data}:line 1: image {folder / 'broken.png'}: cannot be read")
    _, kept = encode(vlm_dirs["qwen2_vl"], data, skip_bad_rows=True)
    assert len(kept) == 1 and kept[0]["line"] == 2
    with pytest.raises(BadRows, match=r"line 2: image .*blue.png: 112x84 pixels, more than --max_image_pixels 5000"):
        encode(vlm_dirs["qwen2_vl"], data, skip_bad_rows=False, max_image_pixels=5000)


def test_a_text_only_model_refuses_image_rows_in_one_line(tmp_path, tiny_model_dir, pictures):
    data = write_rows(pictures["folder"] / "text_model.jsonl", two_image_rows(pictures["folder"])[:1])
    with pytest.raises(ConfigError, match=r"^\S+text_model.jsonl:line 1: .*text-only model's: it cannot show these messages' images"):
        encode(tiny_model_dir, data)


def test_too_long_examples_keep_whole_turns_never_half_an_image(vlm_dirs, pictures):
    data = write_rows(pictures["folder"] / "long.jsonl", two_image_rows(pictures["folder"])[:1])
    tokenizer, [whole] = encode(vlm_dirs["qwen2_vl"], data)
    # a few tokens short: the second exchange (with the second picture) does not fit, and is not cut into
    _, [cut] = encode(vlm_dirs["qwen2_vl"], data, max_seq_length=len(whole["input_ids"]) - 3, truncation="cut")
    assert len(cut["images"]) == 1 and cut["input_ids"] == whole["input_ids"][:len(cut["input_ids"])]
    assert tokenizer.decode([t for t, lab in zip(cut["input_ids"], cut["labels"]) if lab != IGNORE_INDEX]) \
        == "A blue circle.<|im_end|>"


def test_inspect_shows_image_tokens_once_with_their_count_and_untrained(vlm_dirs, pictures, capsys, tmp_path):
    data = write_rows(pictures["folder"] / "inspect.jsonl", two_image_rows(pictures["folder"])[:1])
    out = tmp_path / "encoded.jsonl"
    inspect_main(["--model_name_or_path", vlm_dirs["qwen2_vl"], "--data_path", data, "--color", "never",
                  "--output_file", str(out)])
    printed = capsys.readouterr().out
    assert "<|vision_start|><|image_pad|>×12<|vision_end|>What shape is this?" in printed  # 112x84: 4x3 tokens
    assert "<|image_pad|>×4<|vision_end|><|im_end|>" in printed  # 56x56: 2x2
    assert "⟦A blue circle.<|im_end|>⟧" in printed
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(record["images"]) == 2
