"""DPO: each loss against a hand calculation, the reply-only loss mask, the reference as the model
without its adapter, a short LoRA run through the recipe, and the rules that refuse impossible settings."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.helpers.rows import POLITE, RUDE, write_jsonl
from tunesmith.data.collator import PreferencePackingCollator
from tunesmith.data.preference import encode_pair
from tunesmith.errors import ConfigError
from tunesmith.hparams import (
    FinetuningArguments,
    ModelArguments,
    TrainingArguments,
    check,
    parse_run,
)
from tunesmith.models.loader import load_model
from tunesmith.preference import command as dpo
from tunesmith.preference.args import DPOArguments
from tunesmith.preference.dpo_loss import preference_loss
from tunesmith.preference.dpo_trainer import DPOTrainer, sequence_logps
from tunesmith.preference.rules import RULES

REPO = Path(__file__).resolve().parents[3]


def _neg_logsigmoid(x: float) -> float:
    return math.log1p(math.exp(-x))


# ---- the losses, on a toy batch of two pairs ----

POLICY_C, POLICY_R = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
REF_C, REF_R = torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0])
LEN_C, LEN_R = torch.tensor([2, 3]), torch.tensor([4, 1])


def _loss(loss_type: str, **kwargs):
    return preference_loss(loss_type, POLICY_C, POLICY_R, LEN_C, LEN_R, REF_C, REF_R, **kwargs)


def test_sigmoid_loss_with_label_smoothing():
    # h = (pi_c - ref_c) - (pi_r - ref_r) = [0.5 + 0.5, -1 - 1] = [1, -2]; beta h = [0.5, -1]
    result = _loss("sigmoid", beta=0.5, label_smoothing=0.1)
    expected = [0.9 * _neg_logsigmoid(x) + 0.1 * _neg_logsigmoid(-x) for x in (0.5, -1.0)]
    assert result.loss.item() == pytest.approx(sum(expected) / 2)
    assert result.chosen_rewards.tolist() == pytest.approx([0.25, -0.5])  # beta (pi_c - ref_c)
    assert result.rejected_rewards.tolist() == pytest.approx([-0.25, 0.5])


def test_ipo_loss_on_length_averaged_logps():
    # averages: pi_c [-0.5, -1], ref_c [-0.75, -2/3], pi_r [-0.5, -1], ref_r [-0.375, -2]
    # h = [0.25 + 0.125, -1/3 - 1] = [0.375, -4/3]; target 1 / (2 beta) = 1
    result = _loss("ipo", beta=0.5)
    assert result.loss.item() == pytest.approx(((0.375 - 1) ** 2 + (-4 / 3 - 1) ** 2) / 2)
    assert result.chosen_rewards.tolist() == pytest.approx([0.5 * 0.25, 0.5 * (-1 + 2 / 3)])


def test_simpo_loss_ignores_the_reference():
    # averages: chosen [-0.5, -1], rejected [-0.5, -1] -> beta * 0 - gamma = -0.5 for both pairs
    result = preference_loss("simpo", POLICY_C, POLICY_R, LEN_C, LEN_R, beta=2.0, gamma=0.5)
    assert result.loss.item() == pytest.approx(_neg_logsigmoid(-0.5))
    assert result.chosen_rewards.tolist() == pytest.approx([-1.0, -2.0])  # beta * average
    rejected = torch.tensor([-4.0, -1.0])  # averages [-1, -1]: margins beta * [0.5, 0] - gamma = [0.5, -0.5]
    result = preference_loss("simpo", POLICY_C, rejected, LEN_C, LEN_R, beta=2.0, gamma=0.5)
    assert result.loss.item() == pytest.approx((_neg_logsigmoid(0.5) + _neg_logsigmoid(-0.5)) / 2)


def test_orpo_loss_is_nll_plus_weighted_odds_ratio():
    rejected = torch.tensor([-4.0, -1.0])  # averages [-1, -1]; chosen averages [-0.5, -1]
    result = preference_loss("orpo", POLICY_C, rejected, LEN_C, LEN_R, beta=0.1)

    def log_odds(lp: float) -> float:
        return lp - math.log(1 - math.exp(lp))

    nll = (1 + 3) / (2 + 3)  # the chosen tokens' mean negative log-prob over the batch
    ratio = [_neg_logsigmoid(log_odds(c) - log_odds(r)) for c, r in ((-0.5, -1.0), (-1.0, -1.0))]
    assert result.loss.item() == pytest.approx(nll + 0.1 * sum(ratio) / 2)
    assert result.rejected_rewards.tolist() == pytest.approx([-0.1, -0.1])


def test_reference_losses_need_the_reference():
    with pytest.raises(ValueError, match="needs the reference"):
        preference_loss("sigmoid", POLICY_C, POLICY_R, LEN_C, LEN_R)


# ---- the loss mask ----

def _mask_rows(tokenizer, context, chosen, rejected, max_length=None):
    enc = encode_pair(tokenizer, context, [{"role": "assistant", "content": chosen}],
                      [{"role": "assistant", "content": rejected}], max_length)
    record = {"chosen_ids": enc.chosen_ids, "rejected_ids": enc.rejected_ids, "chosen_start": enc.chosen_span[0],
              "chosen_end": enc.chosen_span[1], "rejected_start": enc.rejected_span[0],
              "rejected_end": enc.rejected_span[1]}
    batch = PreferencePackingCollator()([record])
    return [tokenizer.decode(batch["reply_targets"][batch["reply_index"] == i]) for i in range(2)]


@pytest.mark.parametrize("max_length", [None, 40], ids=["whole", "context_cut"])
def test_only_the_reply_and_its_end_of_turn_are_in_the_loss(tokenizer, max_length):
    context = [{"role": "system", "content": "Be kind."},
               {"role": "user", "content": "Tell me about the weather today " * 4}]
    chosen, rejected = "It is sunny and warm.", "No."
    assert _mask_rows(tokenizer, context, chosen, rejected, max_length) == [chosen + "<|im_end|>",
                                                                            rejected + "<|im_end|>"]


# ---- the reference ----

def _direct_logps(model, ids: list[int], start: int, end: int) -> float:
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return sum(logp[t - 1, ids[t]].item() for t in range(start, end))


def test_reference_logps_are_the_model_without_its_adapter(tiny_model_dir, tokenizer, tmp_path):
    torch.manual_seed(0)  # lora_A is drawn in load_model: the same adapter whatever ran before
    model = load_model(ModelArguments(model_name_or_path=tiny_model_dir),
                       FinetuningArguments(finetuning_type="lora", lora_r=4, lora_dropout=0.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # zero at initialisation: give the adapter something to change
            torch.nn.init.normal_(p, std=0.5)
    model.eval()
    trainer = DPOTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True),
                         dpo_args=DPOArguments(), data_collator=PreferencePackingCollator())
    context = [{"role": "user", "content": "Hi"}]
    enc = encode_pair(tokenizer, context, [{"role": "assistant", "content": "Hello there!"}],
                      [{"role": "assistant", "content": "Go away."}], None)
    record = {"chosen_ids": enc.chosen_ids, "rejected_ids": enc.rejected_ids, "chosen_start": enc.chosen_span[0],
              "chosen_end": enc.chosen_span[1], "rejected_start": enc.rejected_span[0],
              "rejected_end": enc.rejected_span[1]}
    batch = PreferencePackingCollator()([record])

    base = load_model(ModelArguments(model_name_or_path=tiny_model_dir), FinetuningArguments(finetuning_type="full"),
                      is_trainable=False)
    expected = [_direct_logps(base, enc.chosen_ids, *enc.chosen_span),
                _direct_logps(base, enc.rejected_ids, *enc.rejected_span)]
    assert trainer.reference_logps(model, batch).tolist() == pytest.approx(expected, abs=1e-4)
    with torch.no_grad():
        policy, lengths = sequence_logps(model, batch)
    assert lengths.tolist() == [enc.chosen_span[1] - enc.chosen_span[0], enc.rejected_span[1] - enc.rejected_span[0]]
    assert abs(policy[0].item() - expected[0]) > 1e-2  # the adapter is on outside the reference


# ---- training through the recipe ----

def test_short_lora_run_learns_the_pairs_and_saves_a_loadable_adapter(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    questions = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice."]
    rows = [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]} for i, q in enumerate(questions)]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "dpo"
    trainer = dpo.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", data, "--eval_data_path", data,
        "--output_dir", str(out), "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0",
        "--max_seq_length", "64", "--per_device_train_batch_size", "4", "--max_steps", "4",
        "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--logging_steps", "1", "--beta", "0.5",
        "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false",
    ])
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 4
    # A new adapter starts as the reference itself: every margin is 0 and the loss is log 2.
    assert logs[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)
    assert logs[0]["margin"] == pytest.approx(0.0, abs=1e-4)
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert logs[-1]["margin"] > 0
    for key in ("rewards/chosen", "rewards/rejected", "accuracy", "logps/chosen", "logps/rejected"):
        assert key in logs[-1]
    evaluation = trainer.state.log_history[-1]
    assert evaluation["eval_accuracy"] > 0.5 and evaluation["eval_loss"] < math.log(2)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reloaded = PeftModel.from_pretrained(base, str(out))
    assert any("lora_A" in name for name, _ in reloaded.named_parameters())


def test_a_run_that_continues_an_adapter_uses_that_adapter_as_its_reference(tiny_model_dir, tmp_path):
    """Continuing the SFT adapter, the reference is the SFT policy, not the bare base: before the first
    update the policy equals it, so every margin is 0 and the loss log 2, although the SFT adapter moves
    the log-probs away from the base's."""
    torch.manual_seed(0)  # lora_A is drawn in load_model: the same adapter whatever ran before
    sft = load_model(ModelArguments(model_name_or_path=tiny_model_dir),
                     FinetuningArguments(finetuning_type="lora", lora_r=4, lora_dropout=0.0))
    for name, p in sft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    sft.save_pretrained(tmp_path / "sft")
    rows = [{"prompt": "Hi?", "chosen": POLITE[0], "rejected": RUDE[0]}] * 4
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    trainer, _ = dpo.build_trainer([
        "--model_name_or_path", tiny_model_dir, "--adapter_name_or_path", str(tmp_path / "sft"), "--data_path", data,
        "--output_dir", str(tmp_path / "dpo"), "--max_seq_length", "64", "--report_to", "none"])
    batch = trainer.data_collator([trainer.train_dataset[0]])
    model = trainer.model.eval()
    result, _ = trainer.pair_loss(model, batch)
    assert result.loss.item() == pytest.approx(math.log(2), abs=1e-5)
    assert result.chosen_rewards.abs().max().item() < 1e-5
    with torch.no_grad(), model.disable_adapter():
        base, _ = sequence_logps(model, batch)
    assert abs(base[0].item() - trainer.reference_logps(model, batch)[0].item()) > 1e-2
    assert [n for n, p in model.named_parameters() if p.requires_grad and ".reference." in n] == []

    trainer.save_model(str(tmp_path / "saved"))  # what the run made, without the frozen reference it started from
    saved = sorted(p.name for p in (tmp_path / "saved").iterdir())
    assert "adapter_model.safetensors" in saved and "reference" not in saved
    assert "reference" in trainer.model.peft_config  # and still there to train against


def _losses(tiny_model_dir: str, data: str, out: Path, *flags: str) -> tuple[DPOTrainer, list[float]]:
    trainer = dpo.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(out), "--lora_r", "8",
        "--lora_alpha", "16", "--lora_dropout", "0", "--max_seq_length", "64", "--per_device_train_batch_size", "2",
        "--max_steps", "3", "--learning_rate", "1e-3", "--lr_scheduler_type", "constant", "--logging_steps", "1",
        "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false", *flags])
    return trainer, [r["loss"] for r in trainer.state.log_history if "loss" in r]


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_precomputed_reference_trains_exactly_as_the_reference_in_each_step(tiny_model_dir, tmp_path,
                                                                           finetuning_type):
    """With --precompute_ref_logps the reference is scored once before training (for full fine-tuning by
    the model itself, before its first update; else by a frozen copy in every step): the same losses."""
    rows = [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]}
            for i, q in enumerate(["Hi?", "2 + 2?", "Help?", "Paris?", "Name?", "Why?"])]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    flags = ("--finetuning_type", finetuning_type, "--beta", "0.5")
    in_step, losses = _losses(tiny_model_dir, data, tmp_path / "in_step", *flags)
    precomputed, precomputed_losses = _losses(tiny_model_dir, data, tmp_path / "pre", *flags,
                                              "--precompute_ref_logps", "true")
    assert (in_step.reference_model is not None) == (finetuning_type == "full")
    assert precomputed.reference_model is None
    assert precomputed.train_dataset.column_names[-2:] == ["reference_chosen_logps", "reference_rejected_logps"]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4)  # the policy starts as its reference
    assert losses[-1] < losses[0]
    assert precomputed_losses == pytest.approx(losses, abs=1e-4)
    if finetuning_type == "full":  # the frozen copy stayed the starting model while the policy moved
        start = load_model(ModelArguments(model_name_or_path=tiny_model_dir), FinetuningArguments(finetuning_type="full"),
                           is_trainable=False)
        reference, policy = in_step.reference_model.state_dict(), in_step.model.state_dict()
        for name, weight in start.state_dict().items():
            assert torch.equal(reference[name], weight), name
        assert not torch.equal(policy["model.layers.0.mlp.up_proj.weight"], start.state_dict()["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.parametrize("bits", ["4", "8"])
def test_qlora_run_trains_against_the_quantized_base_without_its_adapter(tiny_model_dir, tmp_path, bits):
    import bitsandbytes as bnb

    rows = [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]}
            for i, q in enumerate(["Hi?", "2 + 2?", "Help?", "Paris?"])]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    trainer, losses = _losses(tiny_model_dir, data, tmp_path / "qlora", "--quantization_bit", bits, "--beta", "0.5",
                              "--learning_rate", "1e-2")
    layer = trainer.model.get_base_model().model.layers[0].mlp.up_proj.base_layer
    assert isinstance(layer, bnb.nn.Linear4bit if bits == "4" else bnb.nn.Linear8bitLt)
    assert losses[0] == pytest.approx(math.log(2), abs=1e-3)
    assert losses[-1] < losses[0]
    assert (tmp_path / "qlora" / "adapter_model.safetensors").is_file()


# ---- settings ----

@pytest.mark.parametrize("dpo_args, finetuning_type, words", [
    (DPOArguments(beta=0.0), "lora", r"--beta must be > 0 \(got 0.0\)"),
    (DPOArguments(label_smoothing=0.5), "lora", r"--label_smoothing must be in \[0, 0.5\) \(got 0.5\)"),
    (DPOArguments(loss_type="ipo", label_smoothing=0.1), "lora", r"applies to --loss_type sigmoid only \(got ipo"),
    (DPOArguments(loss_type="simpo", precompute_ref_logps=True), "lora", r"simpo has no reference model to score"),
    (DPOArguments(precompute_ref_logps=True), "lora", r"cannot be used with ZeRO-3.*or use ZeRO-2"),
    (DPOArguments(loss_type="ipo"), "full", r"ipo with --finetuning_type full keeps a frozen copy.*not shard"),
], ids=["beta", "label_smoothing", "smoothing_ipo", "precompute_simpo", "precompute_zero3", "full_ipo_zero3"])
def test_impossible_settings_are_refused(dpo_args, finetuning_type, words):
    zero3 = TrainingArguments(output_dir="unused", deepspeed=str(REPO / "configs" / "ds_zero3.json"), use_cpu=True,
                              report_to="none")
    with pytest.raises(ConfigError, match=words):
        check(dpo=dpo_args, finetuning=FinetuningArguments(finetuning_type=finetuning_type), training=zero3,
              feature_rules=RULES)


def test_every_loss_may_train_every_weight_without_zero3():
    for loss_type in ("sigmoid", "ipo", "simpo", "orpo"):
        check(dpo=DPOArguments(loss_type=loss_type), finetuning=FinetuningArguments(finetuning_type="full"),
              feature_rules=RULES)


def test_shipped_config_and_command():
    from tunesmith.cli import usage

    run = parse_run("dpo", [str(REPO / "configs" / "dpo_lora_demo.yaml")], check_paths=False)
    assert run.model.adapter_name_or_path == "outputs/sft_demo" and run.dpo.loss_type == "sigmoid"
    assert run.data.eval_data_path == ["data/demo/preference_eval.jsonl"]
    assert "dpo " in usage()


def test_simpo_margin_is_simpo_gamma_and_the_old_gamma_stops_with_its_new_name(tmp_path):
    """--gamma meant SimPO's margin in DPO and the GAE discount in PPO; now one meaning per flag."""
    from tunesmith.hparams import parse_run

    root = Path(__file__).resolve().parents[3]
    data = str(root / "data/demo/preference.jsonl")
    args = parse_run("dpo", ["--data_path", data, "--loss_type", "simpo", "--simpo_gamma", "0.8"])
    assert args.dpo.simpo_gamma == 0.8
    with pytest.raises(ConfigError, match=r"^--gamma is renamed: use --simpo_gamma \(SimPO's target margin"):
        parse_run("dpo", ["--data_path", data, "--gamma", "0.8"])
    config = tmp_path / "dpo.yaml"
    config.write_text(f"data_path: {data}\ngamma: 0.8\n")
    with pytest.raises(ConfigError, match=r"dpo.yaml:2: gamma is renamed: use simpo_gamma"):
        parse_run("dpo", [str(config)])
    assert parse_run("ppo", ["--data_path", str(root / "data/demo/prompts.jsonl"), "--reward_model", str(root),
                             "--gamma", "0.9"]).ppo.gamma == 0.9
