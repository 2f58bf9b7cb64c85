"""Packing conversations with pictures into one padding-free row, exactly, for Idefics3 / SmolVLM (a tiny Idefics3 with
SmolVLM's template) and Qwen2-VL / Qwen2.5-VL (M-RoPE positions from each example alone), with their real processors:
every logit of the packed row equals the example's own alone through transformers' eager attention, a packed LoRA run
takes the losses of the padded one step for step, and Gemma 3, whose attention a packed row cannot compute, is
refused in one line."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.vlm_models import build_vlm_dir, write_memorisation_set, write_mixed_rows
from tunesmith.data.dataset import build_sft_dataset
from tunesmith.data.image_encoding import ImagePackingCollator
from tunesmith.data.images import open_image
from tunesmith.data.template import processor_of
from tunesmith.errors import ConfigError
from tunesmith.hparams import ModelArguments, SFTDataArguments
from tunesmith.models.attention import use_varlen_attention
from tunesmith.models.loader import load_tokenizer
from tunesmith.sft.command import run as sft_main

PACKED_FAMILIES = ("idefics3", "qwen2_vl", "qwen2_5_vl")


@pytest.fixture(scope="module")
def vlm_dirs(vlm_dir) -> dict[str, str]:
    return {f: vlm_dir(f) for f in PACKED_FAMILIES}


@pytest.fixture(scope="module")
def idefics3(vlm_dirs) -> str:
    return vlm_dirs["idefics3"]


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> str:
    return write_mixed_rows(tmp_path_factory.mktemp("packing"), "sft")


@pytest.mark.parametrize("family", PACKED_FAMILIES)
def test_every_logit_of_a_packed_row_with_pictures_equals_each_example_alone_in_eager_attention(family, vlm_dirs,
                                                                                              conversations):
    from transformers import AutoModelForImageTextToText

    from tunesmith.models.vision import mrope_index

    model_dir = vlm_dirs[family]
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=model_dir))
    processor = processor_of(tokenizer)
    records = list(build_sft_dataset(tokenizer, [conversations], SFTDataArguments(data_path=[conversations])))
    packed_model = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa",
                                                               dtype=torch.float32).eval()
    assert use_varlen_attention(packed_model) == "sdpa_varlen"
    eager = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
    batch = ImagePackingCollator(processor, trained_logits_only=False, rope_index=mrope_index(packed_model))(records)
    assert batch["input_ids"].shape[0] == 1  # one row, with its three pictures
    assert (batch["pixel_values"].shape[1] if family == "idefics3" else len(batch["image_grid_thw"])) == 3
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


@pytest.mark.parametrize("family", ["idefics3", "qwen2_vl"])
def test_a_packed_lora_run_takes_the_padded_runs_losses_step_for_step(family, vlm_dirs, tmp_path):
    data = write_memorisation_set(tmp_path)
    padded = run_sft(vlm_dirs[family], data, tmp_path / "padded")
    packed = run_sft(vlm_dirs[family], data, tmp_path / "packed", "--packing", "true")
    losses = [[r["loss"] for r in t.state.log_history if "loss" in r] for t in (padded, packed)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4) and losses[0][-1] < losses[0][0]


def test_gemma3_whose_picture_tokens_attend_both_ways_refuses_packing_in_one_line(tmp_path, default_model_path):
    model_dir = build_vlm_dir("gemma3", tmp_path / "gemma3", default_model_path)
    with pytest.raises(ConfigError, match=r"^--packing with a vision-language model \(gemma3\): packed exactly for "
                                          r"idefics3, smolvlm, qwen2_vl, qwen2_5_vl only \(Gemma 3's picture tokens"):
        run_sft(model_dir, write_memorisation_set(tmp_path), tmp_path / "out", "--packing", "true")


def test_a_packed_row_with_pictures_is_not_split_into_forwards(idefics3, tmp_path):
    with pytest.raises(ConfigError, match=r"^--max_forward_tokens 64 with a vision-language model: a packed row runs in "
                                          r"one forward"):
        run_sft(idefics3, write_memorisation_set(tmp_path), tmp_path / "out", "--packing", "true",
                "--max_forward_tokens", "64")
