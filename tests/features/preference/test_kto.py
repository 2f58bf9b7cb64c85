"""KTO (--loss_type kto): the loss against a hand calculation, every unpaired format read (LLaMA-Factory's
kto_tag data, TRL's unpaired rows, plain and conversational) and pairs split, bad rows named in one line,
the mismatched replies of the KL estimate, a short run whose loss falls and whose held-out pair accuracy is
reported beside DPO's, and the rules that refuse settings KTO cannot use."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers.rows import POLITE, RUDE, write_jsonl
from tunesmith.data.collator import KTOPackingCollator, mismatched_replies
from tunesmith.data.formats import DataError, Row
from tunesmith.data.unpaired import build_kto_datasets, judged_from_row
from tunesmith.errors import ConfigError
from tunesmith.hparams import TrainDataArguments, TrainingArguments, check
from tunesmith.preference import command as dpo
from tunesmith.preference.args import DPOArguments
from tunesmith.preference.dpo_loss import kto_kl, kto_loss
from tunesmith.preference.rules import RULES


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test's own dataset cache."""
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ---- the loss ----

def test_kto_loss_against_a_hand_calculation():
    # KL rows: pi - ref = [0.5, 0.3] -> z0 = max(0, 0.4) = 0.4
    kl = kto_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.3]))
    assert kl.item() == pytest.approx(0.4)
    policy, reference = torch.tensor([-1.0, -3.0, -2.0]), torch.tensor([-1.5, -2.0, -2.0])  # r = [0.5, -1, 0]
    desirable = torch.tensor([True, False, True])
    result = kto_loss(policy, reference, desirable, kl, beta=0.5, desirable_weight=1.5, undesirable_weight=0.8)
    expected = [1.5 * (1 - _sigmoid(0.5 * (0.5 - 0.4))),  # desirable: lambda_D (1 - sigma(beta (r - z0)))
                0.8 * (1 - _sigmoid(0.5 * (0.4 + 1.0))),  # undesirable: lambda_U (1 - sigma(beta (z0 - r)))
                1.5 * (1 - _sigmoid(0.5 * (0.0 - 0.4)))]
    assert result.loss.item() == pytest.approx(sum(expected) / 3)
    assert result.rewards.tolist() == pytest.approx([0.25, -0.5, 0.0])  # beta r
    assert kto_kl(torch.tensor([-2.0]), torch.tensor([-1.0])).item() == 0.0  # clamped at 0


def test_no_gradient_flows_through_the_kl_estimate():
    policy_kl = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl = kto_kl(policy_kl, torch.tensor([-1.5, -2.5]))
    assert not kl.requires_grad
    policy = torch.tensor([-1.0], requires_grad=True)
    kto_loss(policy, torch.tensor([-1.2]), torch.tensor([True]), kl, beta=0.1).loss.backward()
    assert policy.grad is not None and policy_kl.grad is None


# ---- formats ----

# Real rows of LLaMA-Factory's data/kto_en_demo.json (the second with its article shortened). Its
# dataset_info.json entry reads them as sharegpt `messages` with the column `label` as kto_tag.
LLAMA_FACTORY_ROWS = [
    {"messages": [
        {"content": "You will be given a definition of a task first, then an example. Follow the example to solve a new "
                    "instance of the task.\nGiven the Target and Argument texts detect the stance that the argument "
                    "has towards the topic. There are three types of stances \"in favor\", \"against\", and "
                    "\"neutral\". \n\nTopic: Three Gorges Dam\n Argument: The Three Gorges Dam is a cause of "
                    "corruption.\nSolution: against\nWhy? Here, argument is against the given topic, three gorges "
                    "dam. Hence, the answer is \"against\".\n\nNew input: Topic: Assisted suicide\n Argument: "
                    "Physicians can never be obligated to facilitate euthanasia.\nSolution:", "role": "user"},
        {"content": "against\nWhy? In this argument, the stance is against the topic of assisted suicide, as it states "
                    "that physicians should not be obligated to facilitate euthanasia. Therefore, the answer is "
                    "\"against\".", "role": "assistant"}],
     "label": True},
    {"messages": [
        {"content": "Write a multi-choice question for the following article, with the given choices and answer: "
                    "Article: When tea and coffee were first introduced to Europe in the 18th century, people had "
                    "different ideas about their use. [...] Options: A until he was over 83 B until he was 83 C until "
                    "the other had been dead for several years D until he had drunk tea for a few years Answer: B "
                    "until he was 83 Question:\nAnswer:", "role": "user"},
        {"content": " Sure, I'd be happy to help! Here's the multi-choice question based on the article you provided:"
                    "\n\nQuestion: What was the outcome of King Gustaf III's experiment with the two brothers in "
                    "Sweden?\n\nA) One of the brothers lived until he was over 83 years old.\nB) Both brothers lived "
                    "until they were 83 years old.\nC) One of the brothers died before the other.\nD) They both lived "
                    "for several years after the experiment.\n\nAnswer: B) Both brothers lived until they were 83 "
                    "years old.\n\nI hope this helps! Let me know if you have any other questions.",
         "role": "assistant"}],
     "label": False},
]
# TRL's unpaired preference rows, standard and conversational, as its dataset-formats guide gives them.
TRL_STANDARD = {"prompt": "The sky is", "completion": " blue.", "label": True}
TRL_CONVERSATIONAL = {"prompt": [{"role": "user", "content": "What color is the sky?"}],
                      "completion": [{"role": "assistant", "content": "It is green."}], "label": False}

SKY = [{"role": "user", "content": "What color is the sky?"}]


def _row(data: dict, line: int = 3) -> Row:
    return Row("kto.jsonl", line, data)


@pytest.mark.parametrize(("data", "context", "reply", "desirable"), [
    (LLAMA_FACTORY_ROWS[0], LLAMA_FACTORY_ROWS[0]["messages"][:1], LLAMA_FACTORY_ROWS[0]["messages"][1:], True),
    (LLAMA_FACTORY_ROWS[1], LLAMA_FACTORY_ROWS[1]["messages"][:1], LLAMA_FACTORY_ROWS[1]["messages"][1:], False),
    ({"messages": SKY + [{"role": "assistant", "content": "Blue."}], "kto_tag": True}, SKY,
     [{"role": "assistant", "content": "Blue."}], True),
    ({"conversations": [{"from": "human", "value": "What color is the sky?"}, {"from": "gpt", "value": "Green."}],
      "system": "Be brief.", "label": False},
     [{"role": "system", "content": "Be brief."}] + SKY, [{"role": "assistant", "content": "Green."}], False),
    (TRL_STANDARD, [{"role": "user", "content": "The sky is"}], [{"role": "assistant", "content": " blue."}], True),
    (TRL_CONVERSATIONAL, SKY, TRL_CONVERSATIONAL["completion"], False),
    ({"instruction": "What color is the sky?", "output": "Blue.", "label": True}, SKY,
     [{"role": "assistant", "content": "Blue."}], True),
], ids=["llama_factory_true", "llama_factory_false", "kto_tag_column", "sharegpt_system", "trl_standard",
        "trl_conversational", "alpaca"])
def test_every_unpaired_format_is_read(data, context, reply, desirable):
    item = judged_from_row(_row(data))
    strip = [{"role": m["role"], "content": m["content"]} for m in item.context]
    assert strip == context
    assert [{"role": m["role"], "content": m["content"]} for m in item.replies[0][0]] == reply
    assert item.replies[0][1] is desirable and len(item.replies) == 1


def test_a_pair_is_one_desirable_and_one_undesirable_reply():
    item = judged_from_row(_row({"prompt": "Hi", "chosen": POLITE[0], "rejected": RUDE[0]}))
    assert item.context == [{"role": "user", "content": "Hi"}]
    assert [(reply[0]["content"], desirable) for reply, desirable in item.replies] == [(POLITE[0], True),
                                                                                      (RUDE[0], False)]


@pytest.mark.parametrize(("data", "match"), [
    ({"messages": SKY + [{"role": "assistant", "content": "Blue."}]},
     r"^kto.jsonl:line 3: field `label`: missing: a KTO row marks its reply desirable or not with `label` "
     r"true/false .* add the label, or leave the row out$"),
    ({**TRL_STANDARD, "label": "yes"}, r"^kto.jsonl:line 3: field `label`: expected true \(a desirable reply\) or "
                                       r"false \(an undesirable one\), got 'yes'$"),
    ({**TRL_STANDARD, "label": 1}, r"field `label`: expected true .* got 1$"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "label": True}, r"field `label`: a label beside `chosen`"),
    ({"completion": "Blue.", "label": True}, r"field `prompt`: missing \(TRL's unpaired rows give `prompt`"),
    ({"messages": SKY, "label": True},
     r"field `messages`: wrong role order: the last turn must be 'assistant', not 'user'"),
    ({"prompt": "Hi", "completion": [{"role": "user", "content": "x"}], "label": True},
     r"field `completion\[0\]`: a reply holds assistant \(and tool\) messages only"),
], ids=["no_label", "label_string", "label_number", "label_and_pair", "no_prompt", "no_reply", "user_reply"])
def test_a_bad_row_is_named_in_one_line(data, match):
    with pytest.raises(DataError, match=match) as caught:
        judged_from_row(_row(data))
    assert "\n" not in str(caught.value)


def test_a_file_of_every_form_builds_examples_and_held_out_pairs(tokenizer, tmp_path):
    rows = [*LLAMA_FACTORY_ROWS, TRL_STANDARD, TRL_CONVERSATIONAL, {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go."}]
    (tmp_path / "kto.json").write_text(json.dumps(rows))  # LLaMA-Factory's files are JSON arrays
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Hi", "chosen": "Hello!", "rejected": "Go."}] * 3)
    data = TrainDataArguments(data_path=[str(tmp_path / "kto.json")], eval_data_path=[pairs], max_seq_length=512)
    train, held_out = build_kto_datasets(tokenizer, data, DPOArguments(loss_type="kto"))
    assert train["desirable"] == [True, False, True, False, True, False]
    assert [train["line"][i] for i in (0, 4, 5)] == [1, 1, 1] and train["array_index"][4:] == [5, 5]
    first = train[4]
    assert tokenizer.decode(first["ids"][first["start"]:first["end"]]) == "Hello!<|im_end|>"
    assert len(held_out) == 3 and "chosen_ids" in held_out.column_names

    (tmp_path / "eval.jsonl").write_text(json.dumps(TRL_STANDARD) + "\n")
    data.eval_data_path = [str(tmp_path / "eval.jsonl")]
    with pytest.raises(DataError, match=r"eval.jsonl:line 1: field `label`: an unpaired row in the evaluation data: "
                                        r"KTO is evaluated on held-out preference pairs"):
        build_kto_datasets(tokenizer, data, DPOArguments(loss_type="kto"))


def test_unbalanced_weights_are_warned_about(tokenizer, tmp_path, caplog):
    rows = [{**TRL_STANDARD, "label": True}] + [{**TRL_STANDARD, "label": False}] * 3
    data = TrainDataArguments(data_path=[write_jsonl(tmp_path / "kto.jsonl", rows)])
    with caplog.at_level("INFO"):
        build_kto_datasets(tokenizer, data, DPOArguments(loss_type="kto"))
    assert "train: 1 desirable and 3 undesirable replies" in caplog.text
    assert "outside the KTO paper's [1, 4/3]: try --desirable_weight in [3.00, 4.00]" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        build_kto_datasets(tokenizer, data, DPOArguments(loss_type="kto", desirable_weight=3.5))
    assert "outside" not in caplog.text


# ---- the KL estimate's mismatched replies ----

def test_each_prompt_meets_a_reply_of_another_prompt():
    # (ids, start, end): prompts [1, 2] and [3] ; a pair (rows 0 and 2 share a prompt), then another reply
    rows = [([1, 2, 10, 11], 2, 4), ([3, 20], 1, 2), ([1, 2, 12], 2, 3), ([4, 30, 31], 1, 3)]
    assert mismatched_replies(rows) == [([1, 2, 30, 31], 2, 4), ([3, 10, 11], 1, 3), ([1, 2, 20], 2, 3),
                                        ([4, 12], 1, 2)]
    # a pair batch, chosen then rejected: a shift of one keeps every prompt away from its own pair
    pair = [([1, 10], 1, 2), ([2, 20], 1, 2), ([1, 11], 1, 2), ([2, 21], 1, 2)]
    assert [ids for ids, _, _ in mismatched_replies(pair)] == [[1, 21], [2, 10], [1, 20], [2, 11]]


def test_the_collator_packs_the_replies_and_their_mismatched_twins_apart():
    features = [{"ids": [1, 2, 10, 11], "start": 2, "end": 4, "desirable": True},
                {"ids": [3, 20, 21], "start": 1, "end": 3, "desirable": False}]
    batch = KTOPackingCollator()(features)
    assert batch["desirable"].tolist() == [True, False] and batch["pairs"] is False
    assert batch["reply_targets"].tolist() == [10, 11, 20, 21]
    assert batch["kl"]["input_ids"].tolist() == [[1, 2, 20, 21, 3, 10, 11]]
    assert batch["kl"]["reply_targets"].tolist() == [20, 21, 10, 11]
    assert batch["kl"]["reply_index"].tolist() == [0, 0, 1, 1]


# ---- training through the recipe ----

QUESTIONS = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice.", "Hi?", "Why?"]


def _kto_rows() -> list[dict]:
    """The DPO run's pairs as unpaired rows, in TRL's form and LLaMA-Factory's."""
    rows = []
    for i, q in enumerate(QUESTIONS):
        rows.append({"prompt": q, "completion": POLITE[i % 3], "label": True})
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": RUDE[i % 3]}],
                     "label": False})
    return rows


def _run(tiny_model_dir, tmp_path, name, data, held_out, *flags):
    return dpo.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", data, "--eval_data_path", held_out,
        "--output_dir", str(tmp_path / name), "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0",
        "--max_seq_length", "64", "--max_steps", "4", "--learning_rate", "1e-2", "--lr_scheduler_type", "constant",
        "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false", *flags])


def test_short_kto_run_learns_and_reports_held_out_pair_accuracy_beside_dpo(tiny_model_dir, tmp_path):
    held_out = write_jsonl(tmp_path / "held_out.jsonl", [
        {"prompt": q, "chosen": POLITE[(i + 1) % 3], "rejected": RUDE[(i + 2) % 3]}
        for i, q in enumerate(["Where is Rome?", "What time is it?", "Tell me a joke.", "Thanks!"])])
    trainer = _run(tiny_model_dir, tmp_path, "kto", write_jsonl(tmp_path / "kto.jsonl", _kto_rows()), held_out,
                   "--loss_type", "kto", "--beta", "0.5", "--per_device_train_batch_size", "4")
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 4
    # A new adapter starts as the reference: every reward and the KL estimate are 0, the loss 1 - sigma(0).
    assert logs[0]["loss"] == pytest.approx(0.5, abs=1e-4)
    assert logs[0]["kl"] == pytest.approx(0.0, abs=1e-4)
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert logs[-1]["rewards/desirable"] > logs[-1]["rewards/undesirable"]
    for key in ("logps/desirable", "logps/undesirable"):
        assert key in logs[-1]
    kto_eval = trainer.state.log_history[-1]
    assert kto_eval["eval_accuracy"] > 0.5 and kto_eval["eval_margin"] > 0 and "eval_kl" in kto_eval

    # DPO on the same pairs (the rows above, paired), evaluated on the same held-out pairs
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]}
                                                   for i, q in enumerate(QUESTIONS)])
    dpo_eval = _run(tiny_model_dir, tmp_path, "dpo", pairs, held_out, "--beta", "0.5",
                    "--per_device_train_batch_size", "2").state.log_history[-1]
    print(f"held-out pair accuracy: KTO {kto_eval['eval_accuracy']:.3f} (margin {kto_eval['eval_margin']:.3f}), "
          f"DPO {dpo_eval['eval_accuracy']:.3f} (margin {dpo_eval['eval_margin']:.3f})")
    assert dpo_eval["eval_accuracy"] > 0.5


def test_a_run_from_a_paired_file_splits_each_pair(tiny_model_dir, tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": q, "chosen": POLITE[i % 3], "rejected": RUDE[i % 3]}
                                                   for i, q in enumerate(QUESTIONS[:2])])
    trainer, _ = dpo.build_trainer([
        "--model_name_or_path", tiny_model_dir, "--data_path", pairs, "--output_dir", str(tmp_path / "out"),
        "--loss_type", "kto", "--max_seq_length", "64", "--report_to", "none"])
    assert trainer.train_dataset["desirable"] == [True, False, True, False]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    result, _ = trainer.kto_batch_loss(trainer.model.eval(), batch)
    assert result.loss.item() == pytest.approx(0.5, abs=1e-5)  # the policy is its reference before training


# ---- settings ----

@pytest.mark.parametrize(("dpo_args", "batch", "match"), [
    (DPOArguments(loss_type="kto", desirable_weight=0.0), 4, r"--desirable_weight and --undesirable_weight must be > 0"),
    (DPOArguments(undesirable_weight=2.0), 4, r"apply to --loss_type kto only \(got sigmoid"),
    (DPOArguments(loss_type="kto", precompute_ref_logps=True), 4,
     r"--precompute_ref_logps cannot be used with --loss_type kto"),
    (DPOArguments(loss_type="kto"), 1, r"--loss_type kto with --per_device_train_batch_size 1: KTO estimates"),
], ids=["weight", "weights_kto_only", "precompute", "batch_of_one"])
def test_settings_kto_cannot_use_are_refused(dpo_args, batch, match):
    training = TrainingArguments(output_dir="unused", per_device_train_batch_size=batch, use_cpu=True,
                                 report_to="none")
    with pytest.raises(ConfigError, match=match):
        check(dpo=dpo_args, training=training, feature_rules=RULES)


def test_val_size_is_refused_naming_eval_data_path():
    with pytest.raises(ConfigError, match=r"--val_size with --loss_type kto: .* give them as --eval_data_path"):
        check(dpo=DPOArguments(loss_type="kto"), data=TrainDataArguments(data_path=["x"], val_size=0.1),
              check_paths=False, feature_rules=RULES)
