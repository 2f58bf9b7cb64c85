"""DPO on image conversations: preference pairs whose context shows pictures, on tiny Qwen2-VL, Gemma 3 and Idefics3
(SmolVLM) models with their real processors. Each record is what the processor makes of its text and pictures, with
each reply's span on the reply's own tokens; a context cut to fit loses whole early turns and their pictures; the
batched log-probs equal each sequence's alone through the model's eager attention; LoRA learns pairs that only a
model reading the picture can get right. The same for a Gemma 3 reward model, whose batched scores equal each
row's alone and which `tunesmith score` runs with the pictures; the stages not built for pictures refuse in one
line."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.vlm_models import (
    FAMILIES,
    image_token_ids,
    write_mixed_rows,
    write_preference_set,
)
from tunesmith.data.image_encoding import ImagePairCollator, model_inputs
from tunesmith.data.images import open_image
from tunesmith.data.preference import build_preference_datasets
from tunesmith.data.template import processor_of
from tunesmith.errors import ConfigError
from tunesmith.hparams import ModelArguments, TrainDataArguments
from tunesmith.models.loader import load_tokenizer
from tunesmith.models.scoring import sequence_scores
from tunesmith.preference.command import run as dpo_main
from tunesmith.preference.dpo_trainer import sequence_logps


@pytest.fixture(scope="module")
def vlm_dirs(vlm_dir):
    return {family: vlm_dir(family) for family in FAMILIES}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_preference_set(tmp_path_factory.mktemp("pairs"))


@pytest.fixture(scope="module")
def mixed_pairs(tmp_path_factory) -> str:
    return write_mixed_rows(tmp_path_factory.mktemp("mixed"), "pairs")


def records(model_dir: str, data: str, max_seq_length: int = 1024) -> list[dict]:
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=model_dir))
    train, _ = build_preference_datasets(tokenizer, TrainDataArguments(data_path=[data], max_seq_length=max_seq_length))
    return list(train)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_side_is_the_processors_expansion_with_the_reply_on_its_own_tokens(family, vlm_dirs, mixed_pairs):
    processor = processor_of(load_tokenizer(ModelArguments(model_name_or_path=vlm_dirs[family])))
    images_tokens = image_token_ids(processor)
    rows = records(vlm_dirs[family], mixed_pairs)
    assert [len(r["images"]) for r in rows] == [2, 1, 0]
    replies = [("Red, a deep red.", "Blue."), ("Red.", "It is green, I think."), ("Hello!", "No.")]
    for r, (chosen, rejected) in zip(rows, replies):
        for side, reply in (("chosen", chosen), ("rejected", rejected)):
            ids, start, end = r[f"{side}_ids"], r[f"{side}_start"], r[f"{side}_end"]
            pictures = [open_image(ref) for ref in r["images"]]
            out = processor(text=[r[f"{side}_text"]], images=[pictures] if pictures else None,
                            add_special_tokens=False)
            assert [int(t) for t in out["input_ids"][0]] == ids  # what the model will see
            assert processor.tokenizer.decode(ids[start:end]).strip().startswith(reply)  # the reply, its end of turn
            assert not images_tokens & set(ids[start:end])
            assert sum(t in images_tokens for t in ids) > 0 or not pictures
        # both sides share the context, its pictures' tokens included, up to their replies
        assert r["chosen_ids"][:r["chosen_start"]] == r["rejected_ids"][:r["rejected_start"]]


def test_a_context_cut_to_fit_loses_its_first_turn_and_that_turns_picture(vlm_dirs, mixed_pairs):
    model_dir = vlm_dirs["qwen2_vl"]
    whole = records(model_dir, mixed_pairs)[0]
    blue, red = whole["images"]
    # The longer side of the pair without its first exchange (and the blue circle) fits; with it, it does not.
    cut = records(model_dir, mixed_pairs, max_seq_length=max(whole["length"] - 1, 1))
    assert cut[0]["images"] == [red]
    assert cut[0]["length"] < whole["length"] - 1  # a whole turn and its picture's tokens went, not a token
    assert cut[0]["chosen_ids"][cut[0]["chosen_start"]:cut[0]["chosen_end"]] == \
        whole["chosen_ids"][whole["chosen_start"]:whole["chosen_end"]]


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_reply_logps_equal_each_sequence_alone_in_eager_attention(family, vlm_dirs, mixed_pairs):
    from transformers import AutoModelForImageTextToText

    model_dir = vlm_dirs[family]
    processor = processor_of(load_tokenizer(ModelArguments(model_name_or_path=model_dir)))
    model = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    rows = records(model_dir, mixed_pairs)
    batch = ImagePairCollator(processor)(rows)  # rows of three lengths, with 2, 1 and no pictures, padded
    with torch.no_grad():
        batched, counts = sequence_logps(model, batch)
        alone = []
        for side, r, inputs in each_side_alone(processor, rows):
            logprobs = model(**inputs).logits[0].float().log_softmax(-1)
            ids, start, end = r[f"{side}_ids"], r[f"{side}_start"], r[f"{side}_end"]
            alone.append(sum(logprobs[k - 1, ids[k]].item() for k in range(start, end)))
    expected_counts = [r[f"{s}_end"] - r[f"{s}_start"] for s in ("chosen", "rejected") for r in rows]
    assert counts.tolist() == expected_counts
    assert torch.allclose(batched, torch.tensor(alone), atol=1e-4), (batched, alone)


def each_side_alone(processor, rows: list[dict]) -> Iterator[tuple[str, dict, dict]]:
    """(side, record, the processor's inputs for that side alone with its pictures), in ImagePairCollator's order:
    every chosen sequence, then every rejected one."""
    for side in ("chosen", "rejected"):
        for r in rows:
            pictures = [open_image(ref) for ref in r["images"]]
            yield side, r, processor(text=[r[f"{side}_text"]], images=[pictures] if pictures else None,
                                     add_special_tokens=False, return_tensors="pt")


def run_dpo(model_dir: str, data: str, out, *extra: str):
    return dpo_main(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
                     "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--lr_scheduler_type",
                     "constant", "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", "--logging_steps",
                     "1", "--report_to", "none", "--lora_r", "8", *extra])


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_dpo_learns_pairs_only_the_picture_decides(family, vlm_dirs, pairs, tmp_path):
    """Every reply text is chosen for one picture and rejected for another (write_preference_set): a model blind to
    the pictures would have to rank the colours in a cycle, so accuracy 1 on all eight pairs needs the pixels."""
    trainer = run_dpo(vlm_dirs[family], pairs, tmp_path / "out", "--max_steps", "24")
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert logs[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)  # the policy starts as its reference
    assert sum(r["loss"] for r in logs[-4:]) / 4 < 0.25, [r["loss"] for r in logs]
    assert all(r["accuracy"] == 1.0 for r in logs[-4:])  # the last 4 steps: every pair of the set twice
    adapted = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert adapted and all("lora_" in name for name in adapted)
    assert (tmp_path / "out" / "chat_template.jinja").is_file()
    assert any((tmp_path / "out" / f).is_file() for f in ("preprocessor_config.json", "processor_config.json"))


@pytest.mark.parametrize("extra", [("--precompute_ref_logps", "true"),
                                   ("--precompute_ref_logps", "true", "--finetuning_type", "full")])
def test_precomputed_reference_logps_of_pictures_equal_the_policys_own(extra, vlm_dirs, pairs, tmp_path):
    """Scored once before training, through the same collator, the reference is the policy itself at step one."""
    trainer = run_dpo(vlm_dirs["idefics3"], pairs, tmp_path / "out", "--max_steps", "1", "--learning_rate", "1e-4",
                      *extra)
    assert [r["loss"] for r in trainer.state.log_history if "loss" in r][0] == pytest.approx(math.log(2), abs=1e-4)


def test_reward_scores_of_a_padded_batch_with_pictures_equal_each_sequence_alone(vlm_dirs, mixed_pairs):
    """Gemma 3 (the family transformers gives a sequence-classification class): each row's score, read at its last
    real token with its pictures, is what the row scores alone through eager attention."""
    from transformers import AutoModelForSequenceClassification

    model_dir = vlm_dirs["gemma3"]
    processor = processor_of(load_tokenizer(ModelArguments(model_name_or_path=model_dir)))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    rows = records(model_dir, mixed_pairs)
    with torch.no_grad():
        batched = sequence_scores(model, **model_inputs(ImagePairCollator(processor)(rows)))
        alone = [sequence_scores(model, **inputs).item() for _, _, inputs in each_side_alone(processor, rows)]
    assert len(set(alone)) == len(alone)  # the head reads something that differs per row
    assert torch.allclose(batched, torch.tensor(alone), atol=1e-4), (batched, alone)


def test_a_gemma3_reward_model_learns_pairs_only_the_picture_decides_and_scores_them(vlm_dirs, pairs, tmp_path):
    from tunesmith.preference.reward import run as reward_main
    from tunesmith.preference.score import run as score_main

    out = tmp_path / "rm"
    trainer = reward_main(["--model_name_or_path", vlm_dirs["gemma3"], "--data_path", pairs, "--output_dir", str(out),
                           "--per_device_train_batch_size", "4", "--learning_rate", "5e-3", "--lr_scheduler_type",
                           "cosine", "--save_strategy", "no", "--plot_loss", "false", "--seed", "0",
                           "--logging_steps", "1", "--report_to", "none", "--lora_r", "8", "--max_steps", "32"])
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert sum(r["loss"] for r in logs[-4:]) / 4 < 0.25, [r["loss"] for r in logs]
    assert all(r["accuracy"] == 1.0 for r in logs[-4:])
    assert any((out / f).is_file() for f in ("preprocessor_config.json", "processor_config.json"))
    # `tunesmith score` reads the pictures as training did: every pair ranked right, one score per row
    scored = score_main(["--model_name_or_path", str(out), "--data_path", pairs,
                         "--output_file", str(tmp_path / "scores.jsonl")])
    assert len(scored) == 8 and all(r["chosen"] > r["rejected"] for r in scored)
    # a conversation row (a pair's prompt and its chosen reply, pictures beside the pairs file) scores as that side
    first = json.loads(Path(pairs).read_text().splitlines()[0])
    mixed = Path(pairs).with_name("pair_and_conversation.jsonl")
    mixed.write_text(json.dumps(first) + "\n" + json.dumps(
        {"messages": [*first["prompt"], {"role": "assistant", "content": first["chosen"]}]}) + "\n")
    pair, conversation = score_main(["--model_name_or_path", str(out), "--data_path", str(mixed),
                                     "--output_file", str(tmp_path / "mixed_scores.jsonl")])
    assert set(conversation) == {"score"} and conversation["score"] == pytest.approx(pair["chosen"], abs=1e-4)
    assert pair["chosen"] == pytest.approx(scored[0]["chosen"], abs=1e-4)


@pytest.mark.parametrize(("stage", "extra", "says"), [
    ("reward", (), "reward"),
    ("dpo", ("--loss_type", "kto"), "DPO with --loss_type kto"),
])
def test_stages_not_built_for_pictures_refuse_a_vision_model_in_one_line(stage, extra, says, vlm_dirs, pairs,
                                                                         tmp_path):
    import importlib

    run = importlib.import_module({"reward": "tunesmith.preference.reward", "dpo": "tunesmith.preference.command"}[stage]).run
    with pytest.raises(ConfigError, match=rf"^{says} on a vision-language model \(idefics3\): not built \(SFT, DPO "
                                          r".*reward models of gemma3 train on pictures"):
        run(["--model_name_or_path", vlm_dirs["idefics3"], "--data_path", pairs, "--output_dir", str(tmp_path / "out"),
             *extra])


def test_ppo_refuses_a_vision_reward_model_in_one_line(vlm_dirs, default_model_path, pairs, tmp_path):
    from tunesmith.rl.command import run as ppo_main

    with pytest.raises(ConfigError, match=r"^--reward_model .* is a vision-language reward model \(gemma3\): PPO's "
                                          "rollouts are text"):
        ppo_main(["--model_name_or_path", default_model_path, "--reward_model", vlm_dirs["gemma3"], "--data_path",
                  pairs, "--output_dir", str(tmp_path / "out")])
