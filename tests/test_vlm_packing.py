"""Packing conversations with pictures into one padding-free row, exactly, for Idefics3 / SmolVLM (a tiny Idefics3 with
SmolVLM's template and its real processor): every logit of the packed row equals the example's own alone through
transformers' eager attention, a packed LoRA run takes the losses of the padded one step for step, and the families
whose attention a packed row cannot compute (Gemma 3, Qwen2-VL) are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from tests.vlm_models import build_vlm_dir, make_picture, write_memorisation_set
from tunesmith.data.dataset import build_sft_dataset
from tunesmith.data.image_encoding import ImagePackingCollator
from tunesmith.data.images import open_image
from tunesmith.data.template import processor_of
from tunesmith.errors import ConfigError
from tunesmith.hparams import ModelArguments, SFTDataArguments
from tunesmith.models.attention import use_varlen_attention
from tunesmith.models.loader import load_tokenizer
from tunesmith.recipes.sft import run as sft_main


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory, default_model_path) -> str:
    return build_vlm_dir("idefics3", tmp_path_factory.mktemp("idefics3"), default_model_path)


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> str:
    """Three conversations of different lengths: two pictures in two turns, one picture, none."""
    folder = tmp_path_factory.mktemp("packing")
    make_picture(folder / "red.png", (230, 20, 20))
    make_picture(folder / "blue.png", (20, 40, 230), size=(84, 56), shape="circle")
    rows = [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "blue.png"},
                                                   {"type": "text", "text": "What shape is this?"}]},
                      {"role": "assistant", "content": "A circle."},
                      {"role": "user", "content": [{"type": "text", "text": "And this one?"},
                                                   {"type": "image", "image": "red.png"}]},
                      {"role": "assistant", "content": "A red square, drawn on white."}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                   {"type": "text", "text": "Colour?"}]},
                      {"role": "assistant", "content": "Red."}]},
        {"messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there!"}]},
    ]
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_every_logit_of_a_packed_row_with_pictures_equals_each_example_alone_in_eager_attention(idefics3,
                                                                                              conversations):
    from transformers import AutoModelForImageTextToText

    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=idefics3))
    processor = processor_of(tokenizer)
    records = list(build_sft_dataset(tokenizer, [conversations], SFTDataArguments(data_path=[conversations])))
    packed_model = AutoModelForImageTextToText.from_pretrained(idefics3, attn_implementation="sdpa",
                                                               dtype=torch.float32).eval()
    assert use_varlen_attention(packed_model) == "sdpa_varlen"
    eager = AutoModelForImageTextToText.from_pretrained(idefics3, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
    batch = ImagePackingCollator(processor, trained_logits_only=False)(records)
    assert batch["input_ids"].shape[0] == 1 and batch["pixel_values"].shape[1] == 3  # one row, its three pictures
    with torch.no_grad():
        packed = packed_model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        start = 0
        for r in records:
            pictures = [open_image(ref) for ref in r["images"]]
            alone = processor(text=[r["text"]], images=[pictures] if pictures else None, add_special_tokens=False,
                              return_tensors="pt")
            assert alone["input_ids"][0].tolist() == r["input_ids"]
            expected = eager(**alone).logits[0]
            got = packed[start:start + len(r["input_ids"])]
            assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
            start += len(r["input_ids"])
    assert start == packed.shape[0]


def run_sft(model_dir: str, data: str, out, *extra: str):
    return sft_main(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
                     "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--lr_scheduler_type", "constant",
                     "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", "--logging_steps", "1",
                     "--lora_dropout", "0.0", "--report_to", "none", "--max_steps", "6", *extra])


def test_a_packed_lora_run_takes_the_padded_runs_losses_step_for_step(idefics3, tmp_path):
    data = write_memorisation_set(tmp_path)
    padded = run_sft(idefics3, data, tmp_path / "padded")
    packed = run_sft(idefics3, data, tmp_path / "packed", "--packing", "true")
    losses = [[r["loss"] for r in t.state.log_history if "loss" in r] for t in (padded, packed)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4) and losses[0][-1] < losses[0][0]


@pytest.mark.parametrize("family", ["gemma3", "qwen2_vl"])
def test_families_a_packed_row_cannot_compute_are_refused_in_one_line(family, tmp_path, default_model_path):
    model_dir = build_vlm_dir(family, tmp_path / family, default_model_path)
    with pytest.raises(ConfigError, match=rf"^--packing with a vision-language model \({family}\): packed exactly for "
                                          r"idefics3, smolvlm only"):
        run_sft(model_dir, write_memorisation_set(tmp_path), tmp_path / "out", "--packing", "true")


def test_a_packed_row_with_pictures_is_not_split_into_forwards(idefics3, tmp_path):
    with pytest.raises(ConfigError, match=r"^--max_forward_tokens 64 with a vision-language model: a packed row runs in "
                                          r"one forward"):
        run_sft(idefics3, write_memorisation_set(tmp_path), tmp_path / "out", "--packing", "true",
                "--max_forward_tokens", "64")
