"""Fine-tuning vision-language models on image conversations: LoRA on the language model of tiny Qwen2-VL, Gemma 3
and Idefics3 (SmolVLM) models learns a memorisation set (the loss falls) while the vision tower and the projector
stay as they were; full fine-tuning keeps them frozen unless asked; the output folder holds the processor, so the
result loads as the model did; the settings that cannot work are refused in one line."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.vlm_models import TRAIN_AND_GENERATE_FAMILIES, write_memorisation_set
from tunesmith.data.images import image_part
from tunesmith.data.template import encode_prompt
from tunesmith.errors import ConfigError
from tunesmith.families import FAMILIES
from tunesmith.generation import Engine, SamplingParams
from tunesmith.models.loader import inference_model_args, load_for_inference
from tunesmith.sft.command import run as sft_main


@pytest.fixture(scope="module")
def memorise(tmp_path_factory) -> str:
    """Eight conversations: a picture of a coloured square or circle, and its colour and shape as the reply."""
    return write_memorisation_set(tmp_path_factory.mktemp("memorise"))


@pytest.fixture(scope="module")
def vlm_dirs(vlm_dir):
    return {family: vlm_dir(family) for family in TRAIN_AND_GENERATE_FAMILIES}


def run_sft(model_dir: str, data: str, out, *extra: str):
    return sft_main(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
                     "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--lr_scheduler_type", "constant",
                     "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", "--logging_steps", "1",
                     "--report_to", "none", *extra])


def losses(trainer) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


@pytest.mark.parametrize("family", TRAIN_AND_GENERATE_FAMILIES)
def test_lora_learns_image_conversations_with_the_vision_parts_frozen(family, vlm_dirs, memorise, tmp_path):
    trainer = run_sft(vlm_dirs[family], memorise, tmp_path / "out", "--max_steps", "24", "--lora_r", "8")
    curve = losses(trainer)
    first, last = sum(curve[:4]) / 4, sum(curve[-4:]) / 4
    assert last < 0.5 * first, curve
    parts = FAMILIES[trainer.model.config.model_type].vision
    adapted = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert adapted and all("lora_" in name and f"{parts.language}." in name for name in adapted)
    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert saved and not any(parts.tower in key or any(p in key for p in parts.projectors) for key in saved)
    # the processor is saved with the adapter: the result loads, with its chat template, as the model did
    assert os.path.isfile(tmp_path / "out" / "chat_template.jinja")
    assert any(os.path.isfile(tmp_path / "out" / f) for f in ("preprocessor_config.json", "processor_config.json"))


@pytest.mark.parametrize("family", TRAIN_AND_GENERATE_FAMILIES)
def test_a_config_shaped_as_the_hubs_loads_trains_and_answers(family, vlm_dirs, memorise, tmp_path):
    """Google's Gemma 3 config has no top-level pad_token_id, Qwen-VL's none at all, Idefics3's only in its text
    config (tests/helpers/vlm_models.py): the training load, a step, the inference load and a reply all work, and the pad
    id the run fills in is where transformers reads it (the text config)."""
    top = json.loads(open(os.path.join(vlm_dirs[family], "config.json")).read())
    assert "pad_token_id" not in top and "text_config" in top
    trainer = run_sft(vlm_dirs[family], memorise, tmp_path / "out", "--max_steps", "1")
    assert trainer.state.global_step == 1
    text = trainer.model.get_base_model().config.get_text_config(decoder=True)
    assert text.pad_token_id == (top["text_config"].get("pad_token_id") or top["text_config"]["eos_token_id"])
    model, tokenizer = load_for_inference(inference_model_args(str(tmp_path / "out")))
    picture = os.path.join(os.path.dirname(memorise), "red_square.png")
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": [image_part(picture),
                                                                     {"type": "text", "text": "What is this?"}]}])
    [[reply]] = Engine(model, tokenizer).generate([prompt], SamplingParams(temperature=0, max_new_tokens=4))
    assert reply.token_ids


def test_full_finetuning_freezes_the_tower_and_trains_the_projector_when_asked(vlm_dirs, memorise, tmp_path):
    from transformers import AutoModelForImageTextToText

    model_dir = vlm_dirs["gemma3"]
    parts = FAMILIES["gemma3"].vision
    trainer = run_sft(model_dir, memorise, tmp_path / "out", "--max_steps", "2", "--finetuning_type", "full",
                      "--train_projector", "true")
    before = dict(AutoModelForImageTextToText.from_pretrained(model_dir).named_parameters())
    after = dict(trainer.model.named_parameters())
    tower = [k for k in before if k.startswith(parts.tower + ".")]
    projector = [k for k in before if k.startswith(parts.projectors[0] + ".")]
    language = [k for k in before if k.startswith(parts.language + ".layers.")]
    assert tower and projector and language
    assert all(torch.equal(before[k], after[k].detach().cpu()) for k in tower)
    assert all(not after[k].requires_grad for k in tower)
    assert any(not torch.equal(before[k], after[k].detach().cpu()) for k in projector)
    assert any(not torch.equal(before[k], after[k].detach().cpu()) for k in language)


def test_lora_with_train_projector_saves_the_projector_beside_the_adapter(vlm_dirs, memorise, tmp_path):
    run_sft(vlm_dirs["idefics3"], memorise, tmp_path / "out", "--max_steps", "1", "--train_projector", "true")
    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert any("connector" in key for key in saved)
    assert not any("vision_model" in key for key in saved)


def test_prompt_learning_on_a_vision_model_is_refused(vlm_dirs, memorise, tmp_path):
    """(Packing: tests/core/models/test_vlm_packing.py, exact where the family allows it, refused for Gemma 3.)"""
    with pytest.raises(ConfigError, match=re.escape("--finetuning_type prefix_tuning with a vision-language model")):
        run_sft(vlm_dirs["qwen2_vl"], memorise, tmp_path / "out", "--max_steps", "1", "--finetuning_type",
                "prefix_tuning")


def test_vision_flags_on_a_text_model_are_refused(tiny_model_dir, memorise, tmp_path):
    with pytest.raises(ConfigError, match="is not a vision-language model"):
        run_sft(tiny_model_dir, memorise, tmp_path / "out", "--train_vision_tower", "true")


def test_qlora_quantizes_the_language_model_only(vlm_dirs, memorise, tmp_path):
    import bitsandbytes as bnb
    from torch import nn

    trainer = run_sft(vlm_dirs["qwen2_vl"], memorise, tmp_path / "out", "--max_steps", "2",
                      "--quantization_bit", "4")
    parts = FAMILIES["qwen2_vl"].vision
    base = trainer.model.get_base_model()
    linears = {name: type(m) for name, m in base.named_modules() if isinstance(m, nn.Linear)}
    tower = [t for name, t in linears.items() if name.startswith(parts.tower + ".")]
    language = [t for name, t in linears.items() if name.startswith(parts.language + ".") and "lora_" not in name]
    assert tower and all(t is nn.Linear for t in tower)
    assert language and all(t is bnb.nn.Linear4bit for t in language)
    assert all(r["loss"] == r["loss"] for r in trainer.state.log_history if "loss" in r)  # finite, not NaN
