"""Reward model: where the score is read, the pairwise loss, training through the recipe (LoRA and
full), and scores that survive a save/load round trip through reward/score.py."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import EvalPrediction

from tests.helpers.rows import POLITE, RUDE, write_jsonl
from tunesmith.data.preference import encode_reply
from tunesmith.errors import ConfigError
from tunesmith.hparams import FinetuningArguments, ModelArguments, check, parse_run
from tunesmith.models.loader import inference_model_args, load_for_inference, load_model
from tunesmith.models.scoring import score_head, sequence_scores
from tunesmith.preference import reward, score
from tunesmith.preference.args import RewardArguments
from tunesmith.preference.reward_trainer import pairwise_loss, preference_metrics
from tunesmith.preference.rules import RULES

REPO = Path(__file__).resolve().parents[3]


def _load_rm(model_dir: str):
    return load_model(ModelArguments(model_name_or_path=model_dir), FinetuningArguments(finetuning_type="full"),
                      is_trainable=False, task="reward")


@pytest.fixture(scope="module")
def tiny_rm(tiny_model_dir):
    return _load_rm(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_gpt2_rm(tmp_path_factory, tokenizer):
    """Learned absolute positions: a left-padded row scores as it does alone only when the position
    ids follow the attention mask (Llama's rotary positions are nearly shift-invariant anyway)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=256,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return _load_rm(str(path))


def _sequences(tokenizer, drop_last: int = 0) -> list[list[int]]:
    context = [{"role": "user", "content": "Hi there"}]
    replies = ["Hello!", "Go away, I do not want to talk to anyone today.", "Hm."]
    return [encode_reply(tokenizer, context, [{"role": "assistant", "content": r}])[0][: -drop_last or None]
            for r in replies]


def _alone(model, ids: list[int]) -> float:
    return sequence_scores(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)).item()


@pytest.mark.parametrize("drop_last", [0, 1], ids=["as_rendered", "ending_with_eos_eq_pad"])
@pytest.mark.parametrize("model_name", ["tiny_rm", "tiny_gpt2_rm"])
def test_padding_side_does_not_change_scores(request, model_name, tokenizer, drop_last):
    model = request.getfixturevalue(model_name)
    sequences = _sequences(tokenizer, drop_last)
    alone = [_alone(model, ids) for ids in sequences]
    for side in ("right", "left"):
        batch = tokenizer.pad({"input_ids": sequences}, padding_side=side, return_tensors="pt")
        batched = sequence_scores(model, batch["input_ids"], batch["attention_mask"])
        assert batched.tolist() == pytest.approx(alone, abs=1e-5), side


def test_the_score_is_read_at_the_last_real_token(tiny_rm, tokenizer):
    # Ending with eos (== pad), where transformers' own pooling would read the token before it.
    ids = _sequences(tokenizer, drop_last=1)[1]
    assert ids[-1] == tokenizer.pad_token_id
    with torch.no_grad():
        hidden = tiny_rm(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1]
    expected = (hidden[0, -1] @ tiny_rm.score.weight[0]).item()
    assert _alone(tiny_rm, ids) == pytest.approx(expected, abs=1e-5)


def test_score_head_is_required(tiny_model_dir):
    lm = load_model(ModelArguments(model_name_or_path=tiny_model_dir), FinetuningArguments(finetuning_type="full"),
                    is_trainable=False)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM has no `score` head: load reward models with"):
        score_head(lm)


def test_pairwise_loss_margin_and_centring():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    plain = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(1.0))) / 2
    assert pairwise_loss(chosen, rejected).item() == pytest.approx(plain)
    with_margin = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2
    assert pairwise_loss(chosen, rejected, torch.tensor([1.0, 0.0])).item() == pytest.approx(with_margin)
    centred = plain + 0.1 * (2.0**2 + 1.0**2) / 2
    assert pairwise_loss(chosen, rejected, None, 0.1).item() == pytest.approx(centred)


def test_preference_metrics():
    metrics = preference_metrics(EvalPrediction(predictions=[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [2.0, 1.0]],
                                                label_ids=[0, 0, 0, 0]))
    assert metrics == pytest.approx({"accuracy": 0.5, "margin": 0.0, "chosen_score": 1.5, "rejected_score": 1.5})


def test_negative_centring_coefficient_is_refused():
    with pytest.raises(ConfigError, match=r"--center_rewards_coefficient must be >= 0 \(got -0.5\)"):
        check(reward=RewardArguments(center_rewards_coefficient=-0.5), feature_rules=RULES)


def test_shipped_config_parses_and_points_at_the_demo_data():
    config = REPO / "configs" / "reward_lora_demo.yaml"
    run = parse_run("reward", [str(config)])
    data, finetuning, training = run.data, run.finetuning, run.training
    assert finetuning.finetuning_type == "lora"
    assert all(os.path.isfile(p) for p in data.data_path + data.eval_data_path)
    assert training.output_dir == "outputs/rm_demo"


# ---- training through the recipe, then scoring the saved result ----

@pytest.fixture(scope="module")
def preference_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefs")
    questions = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice."]
    train = []
    for i, q in enumerate(questions * 3):
        good, bad = POLITE[i % 3], RUDE[i % 3]
        if i % 2:
            train.append({"conversations": [{"from": "human", "value": q}], "chosen": good, "rejected": bad})
        else:
            train.append({"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": good}],
                          "rejected": [{"role": "assistant", "content": bad}], "margin": 0.5})
    evaluation = [{"conversations": [{"from": "human", "value": "How are you?"}], "chosen": POLITE[0], "rejected": RUDE[1]},
                  {"prompt": "Tell me a joke.", "chosen": POLITE[2], "rejected": RUDE[2], "margin": 1.0},
                  {"conversations": [{"from": "human", "value": "Hello"}], "chosen": {"from": "gpt", "value": POLITE[1]},
                   "rejected": {"from": "gpt", "value": RUDE[0]}}]
    conversations = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": POLITE[0]}]},
                     {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": RUDE[1]}]}]
    return {"train": write_jsonl(folder / "train.jsonl", train),
            "eval": write_jsonl(folder / "eval.jsonl", evaluation),
            "mixed": write_jsonl(folder / "mixed.jsonl", [evaluation[0], *conversations, evaluation[1]])}


def _train(model_dir: str, files: dict, output_dir: Path, finetuning_type: str):
    lr = "5e-3" if finetuning_type == "lora" else "1e-3"
    return reward.run([
        "--model_name_or_path", model_dir, "--data_path", files["train"], "--eval_data_path", files["eval"],
        "--output_dir", str(output_dir), "--finetuning_type", finetuning_type, "--lora_r", "8", "--lora_alpha", "16",
        "--max_seq_length", "64", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8",
        "--num_train_epochs", "4", "--learning_rate", lr, "--lr_scheduler_type", "constant", "--logging_steps", "1",
        "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false",
    ])


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_training_lowers_the_loss_and_scores_survive_save_and_load(
    tiny_model_dir, tokenizer, preference_files, tmp_path, finetuning_type, capsys
):
    out = tmp_path / "rm"
    trainer = _train(tiny_model_dir, preference_files, out, finetuning_type)

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05
    assert "accuracy" in trainer.state.log_history[0] and "trained_tokens" in trainer.state.log_history[0]

    # The trained model, scored in memory...
    model = trainer.model.eval()
    eval_pairs = [(POLITE[0], RUDE[1], "How are you?"), (POLITE[2], RUDE[2], "Tell me a joke."),
                  (POLITE[1], RUDE[0], "Hello")]
    context = lambda q: [{"role": "user", "content": q}]  # noqa: E731
    reply = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
    in_memory = [[_alone(model, encode_reply(tokenizer, context(q), reply(side))[0]) for side in (c, r)]
                 for c, r, q in eval_pairs]

    # ...equals the saved model scored by reward/score.py (mixed rows, one output line per row, in order).
    results = score.run(["--model_name_or_path", str(out), "--data_path", preference_files["mixed"],
                          "--output_file", str(tmp_path / "scores.jsonl"), "--batch_size", "2"])
    written = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert written == results and [sorted(r) for r in results] == [
        ["chosen", "rejected"], ["score"], ["score"], ["chosen", "rejected"]]
    assert [results[0]["chosen"], results[0]["rejected"]] == pytest.approx(in_memory[0], abs=1e-4)
    assert [results[3]["chosen"], results[3]["rejected"]] == pytest.approx(in_memory[1], abs=1e-4)
    assert results[1]["score"] == pytest.approx(_alone(model, encode_reply(tokenizer, context("Hi"), reply(POLITE[0]))[0]),
                                                abs=1e-4)

    # The evaluation at the end of training saw the same scores, and the margin column reached the loss.
    metrics = json.loads((out / "eval_results.json").read_text())
    chosen, rejected = torch.tensor(in_memory).T
    assert metrics["eval_accuracy"] == pytest.approx((chosen > rejected).float().mean().item())
    assert metrics["eval_margin"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-4)
    assert metrics["eval_loss"] == pytest.approx(
        pairwise_loss(chosen, rejected, torch.tensor([0.0, 1.0, 0.0])).item(), abs=1e-4)
    printed = capsys.readouterr().out
    accuracy = sum(c > r for c, r in in_memory[:2]) / 2
    assert f"pairs: 2  accuracy: {accuracy:.4f}" in printed

    if finetuning_type == "lora":
        # PEFT keeps a trainable copy of the `score` head (SEQ_CLS modules_to_save) and saves it with the adapter.
        head = score_head(model)
        assert not torch.equal(head.modules_to_save["default"].weight, head.original_module.weight)
        with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
            saved = [k for k in f.keys() if "score" in k]
            assert len(saved) == 1
            assert torch.equal(f.get_tensor(saved[0]), head.modules_to_save["default"].weight.detach())
        reloaded, _ = load_for_inference(inference_model_args(str(out)), task="reward")
        assert _alone(reloaded, encode_reply(tokenizer, context("Hi"), reply(RUDE[1]))[0]) == pytest.approx(
            results[2]["score"], abs=1e-5)


@pytest.mark.slow
@pytest.mark.heavy  # 5 min of a 42-min fresh-clone run on this session's slower machine: room for the architectures
def test_short_lora_run_on_the_demo_pairs_raises_held_out_accuracy(tmp_path):
    # In bf16 (a bf16 base under a float32 head, the class that crashed on GPUs in issue 31): about 1.5x faster
    # than float32 here, which the tiny-model tests cover.
    trainer, _ = reward.build_trainer([
        str(REPO / "configs" / "reward_lora_demo.yaml"), "--output_dir", str(tmp_path), "--max_samples", "64",
        "--report_to", "none", "--plot_loss", "false", "--bf16", "true",
    ])
    assert trainer.args.bf16 and trainer.model.get_base_model().model.embed_tokens.weight.dtype == torch.bfloat16
    before = trainer.evaluate()["eval_accuracy"]
    trainer.train()
    after = trainer.evaluate()["eval_accuracy"]
    print(f"held-out accuracy before {before:.3f}, after {after:.3f}")
    assert after >= before + 0.15, (before, after)


def test_load_report_is_quiet_about_the_new_score_head_only(tiny_model_dir, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    def reports() -> list[str]:
        return [r.getMessage() for r in caplog.records if "LOAD REPORT" in r.getMessage()]

    _load_rm(tiny_model_dir)
    assert reports() == []  # a causal LM checkpoint has no score head: nothing is wrong

    # A checkpoint that also lacks a real weight still gets transformers' report.
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = load_file(str(broken / "model.safetensors"))
    del weights["model.norm.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    _load_rm(str(broken))
    assert len(reports()) == 1 and "model.norm.weight" in reports()[0]


def test_a_bfloat16_model_trains_its_float32_score_head_without_autocast(tiny_model_dir, preference_files, tmp_path):
    """The class of failure first seen on a GPU: the body in bfloat16, the trained head upcast to float32,
    no autocast around the forward (here `--dtype bfloat16` without `--bf16`). The head's linear layers
    cast their own input, so the run trains, and the score keeps the head's float32."""
    out = tmp_path / "rm-bf16"
    trainer = reward.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", preference_files["train"], "--output_dir", str(out),
        "--dtype", "bfloat16", "--lora_r", "8", "--max_seq_length", "64", "--per_device_train_batch_size", "4",
        "--max_steps", "3", "--learning_rate", "5e-3", "--logging_steps", "1", "--save_strategy", "no",
        "--report_to", "none", "--plot_loss", "false",
    ])
    head = score_head(trainer.model)
    assert head.original_module.weight.dtype == torch.bfloat16
    assert head.modules_to_save["default"].weight.dtype == torch.float32
    assert not torch.equal(head.modules_to_save["default"].weight.to(torch.bfloat16), head.original_module.weight)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert sequence_scores(trainer.model, ids, torch.ones_like(ids)).dtype == torch.float32
    # PPO's reward model: the saved adapter loads for inference on a bfloat16 body and scores.
    reloaded, _ = load_for_inference(inference_model_args(str(out), dtype="bfloat16"), task="reward")
    assert math.isfinite(sequence_scores(reloaded, ids, torch.ones_like(ids)).item())


def test_lora_learning_rate_moves_lora_and_the_score_head_at_their_own_rates(tiny_model_dir, preference_files,
                                                                             tmp_path):
    """Adam's first step moves every weight with a gradient by about its group's learning rate: the LoRA B
    matrices by --lora_learning_rate, the score head (the other trained weight) by --learning_rate."""
    trainer = reward.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", preference_files["train"], "--output_dir",
        str(tmp_path / "rm"), "--lora_r", "8", "--max_seq_length", "64", "--per_device_train_batch_size", "4",
        "--max_steps", "1", "--learning_rate", "1e-3", "--lora_learning_rate", "2e-2", "--weight_decay", "0",
        "--lr_scheduler_type", "constant", "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false",
    ])
    head = score_head(trainer.model)  # PEFT's trained copy, and the original it was copied from
    head_step = (head.modules_to_save["default"].weight - head.original_module.weight).abs().max().item()
    lora_b_step = max(p.detach().abs().max().item() for n, p in trainer.model.named_parameters() if ".lora_B." in n)
    assert head_step == pytest.approx(1e-3, rel=0.05)
    assert lora_b_step == pytest.approx(2e-2, rel=0.05)


def test_score_renders_a_row_with_its_tools_as_training_does(default_model_path):
    """reward/score.py scores the very tokens the reward model trained on: a row's `tools` are rendered (the
    chatml_tools template lists them in the system turn), for pairs and conversations alike."""
    from tunesmith.data.formats import Row
    from tunesmith.data.preference import encode_pair_record, pair_from_row
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.preference.score import _sequences

    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=default_model_path, chat_template="chatml_tools"))
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}}}}]
    pair = Row("p.jsonl", 1, {"prompt": [{"role": "user", "content": "Weather in Paris?"}],
                              "chosen": [{"role": "assistant", "content": "Let me check."}],
                              "rejected": [{"role": "assistant", "content": "No."}], "tools": tools})
    trained = encode_pair_record(tokenizer, pair_from_row(pair), 512).records[0]
    assert _sequences(tokenizer, pair, 512) == [trained["chosen_ids"], trained["rejected_ids"]]
    assert "get_weather" in tokenizer.decode(trained["chosen_ids"])

    conversation = Row("c.jsonl", 1, {"messages": [{"role": "user", "content": "Weather in Paris?"},
                                                   {"role": "assistant", "content": "Let me check."}], "tools": tools})
    assert _sequences(tokenizer, conversation, 512) == [trained["chosen_ids"]]
