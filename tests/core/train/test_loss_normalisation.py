"""SFT's objective is the mean loss over every trained token of an optimizer step, however the step is laid out:
the first update is the same (relative 1e-5) for batch 8, batch 2 with 4 accumulation steps, packed and padded,
packed rows split into several forwards (--max_forward_tokens), full fine-tuning, and two ranks of batch 4
(measured on a 2-core CPU: 3e-7 to 1e-6 apart).

This is the class of transformers #37766 and the gradient-accumulation bugs of its peers: a loss averaged per
micro-batch (or per rank) and then over micro-batches weighs a token of a short micro-batch more than one of a
long one. The eight conversations here (35 to 110 tokens) train 3 to 76 tokens each, so any such mean gives
another update, and test_a_per_micro_batch_mean_gives_another_update checks that it does.

Every run trains one step on exactly these 8 conversations, so step 1 is the whole data set whatever order the
Trainer's seeded sampler draws (each run records what each forward held, and the tests check that every
conversation was trained once). The update is compared after plain SGD: its step is the gradient times the
learning rate. AdamW's first step is about lr * sign(gradient) per weight, which hides a wrong scale and most of
a wrong weighting, so it is not used here.

    python -m pytest -q tests/core/train/test_loss_normalisation.py   # about 2 minutes on 2 cores, 40 s of it two ranks
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.paths import ROOT
from tests.system.test_distributed import launch
from tunesmith.boundary import entry_point
from tunesmith.constants import IGNORE_INDEX
from tunesmith.sft.command import run as sft_run
from tunesmith.train import losses
from tunesmith.train.stage_trainer import StageTrainer, predicted_targets

TOLERANCE = 1e-5

# Conversations of different lengths that train different numbers of tokens (one to three replies each).
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "I am planning a long walk along the coast next weekend, about twenty kilometres, "
                                 "and I will carry water, a map and some food. Should I bring anything else?"},
     {"role": "assistant", "content": "Sunscreen."}],
    [{"role": "user", "content": "What is 7 times 8?"}, {"role": "assistant", "content": "7 times 8 is 56."},
     {"role": "user", "content": "And what is 7 times 9?"}, {"role": "assistant", "content": "63."}],
    [{"role": "user", "content": "Explain photosynthesis."},
     {"role": "assistant", "content": "Photosynthesis is how plants, algae and some bacteria turn light into chemical "
                                      "energy. In the chloroplasts, chlorophyll absorbs sunlight; that energy splits "
                                      "water into oxygen, protons and electrons, and drives the making of ATP and "
                                      "NADPH. The Calvin cycle then uses them to fix carbon dioxide from the air into "
                                      "sugars, which the plant burns for energy or builds into starch and cellulose."}],
    [{"role": "user", "content": "Name a primary colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "Red is another primary colour."},
     {"role": "user", "content": "And the last?"},
     {"role": "assistant", "content": "Yellow, in the painters' model; in light it is green."}],
    [{"role": "user", "content": "Translate 'good morning' into French and Spanish."},
     {"role": "assistant", "content": "In French: bonjour. In Spanish: buenos días."}],
    [{"role": "user", "content": "Write a haiku about the sea."},
     {"role": "assistant", "content": "Grey waves fold and break,\nsalt wind carries gulls inland,\nthe tide keeps its "
                                      "time."}],
    [{"role": "user", "content": "Give me three tips for sleeping better, one line each, and say why each helps."},
     {"role": "assistant", "content": "1. Keep the same bedtime every day: your body clock learns when to get sleepy.\n"
                                      "2. Avoid screens for an hour before bed: their light delays melatonin.\n"
                                      "3. Keep the bedroom cool: a falling body temperature helps you fall asleep."}],
]

# Plain SGD at a constant rate: the update is -lr * gradient. No clipping (it rescales the gradient to norm 1 and
# would hide a wrong scale), no weight decay (a term of its own, the same in every layout), no dropout (its masks
# depend on how many forwards there are), float32 (bf16's rounding is far above 1e-5). The rate is high so that
# a step stands far above float32's rounding of the weights it is added to (a norm weight of 1.0 moved by 1e-6
# would round away); only step 1 is looked at.
COMMON = ("--max_steps", "1", "--optim", "sgd", "--learning_rate", "100", "--lr_scheduler_type", "constant",
          "--weight_decay", "0", "--max_grad_norm", "0", "--lora_dropout", "0", "--disable_dropout", "true",
          "--bf16", "false", "--save_strategy", "no", "--plot_loss", "false", "--seed", "0")
BATCH_8 = ("--per_device_train_batch_size", "8")
BATCH_2_X_4 = ("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4")
PACKED, PADDED = ("--packing", "true"), ("--packing", "false")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("loss-normalisation") / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    return str(path)


def sft_flags(model_dir: str, data: str, out: Path, *layout: str) -> list[str]:
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), *COMMON, *layout]


def forward_record(inputs: dict) -> dict:
    """What one training forward holds: its examples' lengths (which tell the 8 apart) and its trained tokens."""
    if "cu_seq_lens_q" in inputs:  # a packed row
        lengths = inputs["cu_seq_lens_q"].diff().tolist()
    else:
        lengths = inputs["attention_mask"].sum(1).tolist()
    return {"lengths": lengths, "trained": int((predicted_targets(inputs) != IGNORE_INDEX).sum())}


@contextlib.contextmanager
def recording(forwards: list[dict]) -> Iterator[None]:
    """Within the block, every training forward of an SFT run appends its forward_record to `forwards`."""
    original = StageTrainer.compute_loss

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            forwards.append(forward_record(inputs))
        return original(self, model, inputs, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StageTrainer, "compute_loss", compute_loss)
        yield


@dataclass
class FirstStep:
    update: dict[str, torch.Tensor]  # the change of every trained tensor in step 1
    loss: float  # the loss logged for step 1
    forwards: list[list[dict]]  # per rank, what each training forward held (forward_record)


def first_step(out: Path, forwards: list[list[dict]], base_model: str | None = None) -> FirstStep:
    """Step 1 of a run saved in `out`. A LoRA run's update is its saved B matrices: PEFT starts B at zero, and A
    does not move in step 1 (its gradient is proportional to B). A full run's is the saved weights less
    `base_model`'s."""
    if base_model is None:
        update = {k: v for k, v in load_file(str(out / "adapter_model.safetensors")).items() if "lora_B" in k}
    else:
        before = load_file(str(Path(base_model) / "model.safetensors"))
        update = {k: v - before[k] for k, v in load_file(str(out / "model.safetensors")).items()}
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return FirstStep(update, next(r["loss"] for r in history if r.get("step") == 1 and "loss" in r), forwards)


def train_first_step(model_dir: str, data: str, out: Path, *layout: str, full: bool = False) -> FirstStep:
    """One step of `tunesmith sft` in this process, as a user runs it (LoRA, or with `full` every weight)."""
    forwards: list[dict] = []
    with recording(forwards):
        sft_run(sft_flags(model_dir, data, out, *layout, *(("--finetuning_type", "full") if full else ())))
    return first_step(out, [forwards], model_dir if full else None)


def relative_difference(update: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """The largest, over the trained tensors, of |update - reference| / |reference| (Frobenius norms)."""
    assert update.keys() == reference.keys() and reference
    assert all(r.norm() > 0 for r in reference.values())
    return max(((update[k] - reference[k]).norm() / reference[k].norm()).item() for k in reference)


def assert_every_conversation_trained_once(step: FirstStep, reference: FirstStep) -> None:
    seen = sorted(n for rank in step.forwards for forward in rank for n in forward["lengths"])
    assert seen == sorted(reference.forwards[0][0]["lengths"]), step.forwards


def assert_same_first_update(step: FirstStep, reference: FirstStep) -> None:
    difference = relative_difference(step.update, reference.update)
    assert difference <= TOLERANCE, f"first update differs by {difference:.2e} (relative)"
    assert step.loss == pytest.approx(reference.loss, rel=TOLERANCE)  # the logged loss is the step's mean too


@pytest.fixture(scope="module")
def reference(tiny_model_dir, data, tmp_path_factory) -> FirstStep:
    """Batch 8, packed: all 8 conversations in one forward."""
    step = train_first_step(tiny_model_dir, data, tmp_path_factory.mktemp("batch8-packed"), *BATCH_8, *PACKED)
    (forward,) = step.forwards[0]
    assert len(set(forward["lengths"])) == 8  # the lengths tell the conversations apart
    return step


@pytest.mark.parametrize("layout, micro_batches", [
    (BATCH_8 + PADDED, 1),
    (BATCH_2_X_4 + PACKED, 4),
    (BATCH_2_X_4 + PADDED, 4),
    # rows cut into forwards of whole conversations of at most this many tokens (a longer one is a forward alone)
    (BATCH_8 + PACKED + ("--max_forward_tokens", "160"), 1),
    (BATCH_2_X_4 + PACKED + ("--max_forward_tokens", "64"), 4),
], ids=["batch8-padded", "batch2x4-packed", "batch2x4-padded", "batch8-packed-split", "batch2x4-packed-split"])
def test_first_update_is_the_same_for_every_layout(tiny_model_dir, data, reference, tmp_path, layout, micro_batches):
    step = train_first_step(tiny_model_dir, data, tmp_path / "out", *layout)
    (forwards,) = step.forwards
    assert_every_conversation_trained_once(step, reference)
    if "--max_forward_tokens" in layout:
        assert len(forwards) > micro_batches  # the rows were split
    else:
        assert len(forwards) == micro_batches
    if micro_batches > 1:  # a mean per micro-batch would weigh their tokens differently
        assert len({forward["trained"] for forward in forwards}) > 1
    assert_same_first_update(step, reference)


def test_full_fine_tuning_batch_2x4_padded_matches_batch_8_packed(tiny_model_dir, data, tmp_path):
    """Every weight trained (the model itself, no PEFT wrapper, takes the loss arguments)."""
    packed = train_first_step(tiny_model_dir, data, tmp_path / "packed", *BATCH_8, *PACKED, full=True)
    padded = train_first_step(tiny_model_dir, data, tmp_path / "padded", *BATCH_2_X_4, *PADDED, full=True)
    assert len(packed.update) > 10 and all("lora" not in k for k in packed.update)
    assert_every_conversation_trained_once(padded, packed)
    assert_same_first_update(padded, packed)


@pytest.mark.distributed
def test_two_ranks_of_batch_4_match_one_process_of_batch_8(tiny_model_dir, data, reference, tmp_path):
    """torchrun, two CPU ranks (gloo, DDP), packed: each rank trains 4 of the conversations."""
    out = tmp_path / "out"
    # each rank runs this file as a script: the repository on its path, for `tests.` imports
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    launch("tests/core/train/test_loss_normalisation.py", 2, str(tmp_path),
           *sft_flags(tiny_model_dir, data, out, "--per_device_train_batch_size", "4", *PACKED),
           env={"PYTHONPATH": python_path})
    forwards = [json.loads((tmp_path / f"forwards-rank{rank}.json").read_text()) for rank in range(2)]
    step = first_step(out, forwards)
    assert [[len(forward["lengths"]) for forward in rank] for rank in forwards] == [[4], [4]]
    assert_every_conversation_trained_once(step, reference)
    assert forwards[0][0]["trained"] != forwards[1][0]["trained"]  # a mean per rank would weigh them differently
    assert_same_first_update(step, reference)


def test_a_per_micro_batch_mean_gives_another_update(tiny_model_dir, data, reference, tmp_path, monkeypatch):
    """The tests above can fail: with the loss of each micro-batch its own mean, divided by the number of
    micro-batches (what the Trainer did before it counted the step's tokens), these conversations give a first
    update far outside the tolerance."""
    original = losses.causal_lm_loss

    def per_micro_batch_mean(*args, num_items_in_batch=None, **kwargs):
        return original(*args, **kwargs) / 4

    monkeypatch.setattr(losses, "causal_lm_loss", per_micro_batch_mean)
    step = train_first_step(tiny_model_dir, data, tmp_path / "out", *BATCH_2_X_4, *PACKED)
    assert relative_difference(step.update, reference.update) > 1000 * TOLERANCE


def run_one_rank(argv: list[str]) -> None:
    """One rank of test_two_ranks_of_batch_4_match_one_process_of_batch_8: `tunesmith sft` with the flags after
    the record folder, recording its forwards to forwards-rank<RANK>.json there."""
    record_dir, flags = argv[0], argv[1:]
    forwards: list[dict] = []
    with recording(forwards):
        sft_run(flags)
    Path(record_dir, f"forwards-rank{os.environ['RANK']}.json").write_text(json.dumps(forwards))


if __name__ == "__main__":  # torchrun tests/core/train/test_loss_normalisation.py RECORD_DIR SFT_FLAGS...
    entry_point(run_one_rank)(sys.argv[1:])
