"""PPOTrainer on tiny random models: the policy equals the reference at step 0, rollouts are scored
where they were sampled, reward rises under a known reward, only adapter weights move, resume
continues the same run, the recipe and the eval script run end to end, and bad settings fail
with messages that say what to change."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.tiny_models import build_tiny_model_dir
from tunesmith.data.formats import Row
from tunesmith.data.prompts import Prompt, encode_prompts, left_pad
from tunesmith.errors import UserError
from tunesmith.hparams import (
    FinetuningArguments,
    ModelArguments,
    PromptDataArguments,
    TrainingArguments,
    check,
    parse_run,
)
from tunesmith.models.loader import inference_model_args, load_for_inference
from tunesmith.models.scoring import sequence_scores
from tunesmith.rl import PPOTrainer, RewardModelScorer, build_actor_critic
from tunesmith.rl.args import PPOArguments
from tunesmith.rl.losses import logprobs_from_logits
from tunesmith.rl.rollout import sequence_inputs
from tunesmith.rl.rules import RULES

ROOT = Path(__file__).resolve().parents[3]
WORDS = ["cat", "blue sky", "seven", "a long walk home", "tea", "why not", "rivers and lakes", "ok"]
TIME_KEYS = {"time_generate", "time_score", "time_train"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # PPO on a tiny model is many small ops: on two shared cores a second thread only adds
    # synchronisation (measured 6x slower under load).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_even_token_model(path: Path, tokenizer, bias: float = 1.0) -> str:
    """A tiny random Llama (untied output layer) with one hidden direction that raises every even
    token id at once. With ~49k near-uniform tokens a reward for one token would almost never be
    sampled; a reward for the share of even tokens is dense, and learnable through that direction."""
    from transformers import LlamaForCausalLM

    build_tiny_model_dir(path, tokenizer)
    model = LlamaForCausalLM.from_pretrained(path)
    model.config.tie_word_embeddings = False
    head = model.get_input_embeddings().weight.detach().clone()
    head[:, 0] = torch.where(torch.arange(head.size(0)) % 2 == 0, bias, -bias)
    model.lm_head.weight = nn.Parameter(head)
    model.save_pretrained(path)
    return str(path)


def even_share(prompts_ids: list[list[int]], responses_ids: list[list[int]]) -> list[float]:
    return [sum(t % 2 == 0 for t in r) / len(r) for r in responses_ids]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, tokenizer) -> str:
    return build_even_token_model(tmp_path_factory.mktemp("even-llama"), tokenizer)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[Prompt]:
    raw = [Prompt(Row("words.jsonl", i, {}), [{"role": "user", "content": f"Say {w}."}]) for i, w in enumerate(WORDS, 1)]
    return encode_prompts(tokenizer, raw, max_length=512)


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory, policy_dir) -> str:
    """A LoRA adapter with random (nonzero) B, so the SFT policy differs from the base."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(policy_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("sft-adapter")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tokenizer) -> str:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(2)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny-rm")
    LlamaForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def make_trainer(output_dir, model_dir, tokenizer, prompts, *, adapter=None, finetuning_type="lora",
                 resume_from=None, ppo=None, training=None) -> PPOTrainer:
    model_args = ModelArguments(model_name_or_path=model_dir, adapter_name_or_path=adapter)
    finetuning_args = FinetuningArguments(finetuning_type=finetuning_type, lora_r=8, lora_alpha=16)
    training_args = TrainingArguments(**{
        "output_dir": str(output_dir), "report_to": [], "per_device_train_batch_size": 8, "learning_rate": 1e-2,
        "lr_scheduler_type": "constant", "save_strategy": "no", "max_steps": 1, "seed": 0, **(training or {})})
    ppo_args = PPOArguments(**{"max_new_tokens": 8, "ppo_epochs": 2, "num_mini_batches": 2,
                               "rollout_log_samples": 0, **(ppo or {})})
    torch.manual_seed(0)
    model = build_actor_critic(model_args, finetuning_args, training_args, ppo_args.temperature, resume_from)
    return PPOTrainer(model, tokenizer, prompts, ppo_args, training_args, reward_fn=even_share,
                      resume_from=resume_from)


# --------------------------------------------------------------------------- step 0


@pytest.mark.parametrize("with_sft", [False, True], ids=["base", "sft-adapter"])
def test_policy_equals_reference_before_the_first_update(tmp_path, policy_dir, sft_adapter, tokenizer, prompts,
                                                         with_sft):
    trainer = make_trainer(tmp_path, policy_dir, tokenizer, prompts, adapter=sft_adapter if with_sft else None)
    rollout = trainer.rollout(trainer.batch_prompts(0))
    assert torch.equal(rollout.logprobs, rollout.ref_logprobs)
    assert torch.count_nonzero(rollout.kl) == 0
    if with_sft:
        # The reference is the SFT policy, not the bare base under it.
        with trainer.unwrapped.policy.disable_adapter():
            base = trainer.unwrapped.policy_logits(*rollout.inputs(), rollout.context_length)
        assert not torch.allclose(logprobs_from_logits(base, rollout.response_ids), rollout.ref_logprobs, atol=1e-2)
    assert trainer.train_step()["kl"] == 0.0


def test_rollout_logprobs_are_the_ones_the_replies_were_sampled_with(tmp_path, policy_dir, tokenizer, prompts):
    trainer = make_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={"temperature": 0.7})
    batch = trainer.batch_prompts(0)
    assert len({len(p.input_ids) for p in batch}) > 1, "prompts of different lengths exercise left padding"
    # The engine's log-probabilities of the distribution each token was drawn from (temperature 0.7).
    params = trainer.sampling.replace(logprobs=True, processed_logprobs=True)
    replies = [c[0] for c in trainer.engine.generate([p.input_ids for p in batch], params)]
    query_ids, query_mask = left_pad([p.input_ids for p in batch], tokenizer.pad_token_id)
    width = max(len(r.token_ids) for r in replies)
    response_ids = torch.tensor([r.token_ids + [tokenizer.pad_token_id] * (width - len(r.token_ids)) for r in replies])
    response_mask = torch.tensor([[1] * len(r.token_ids) + [0] * (width - len(r.token_ids)) for r in replies])
    inputs = sequence_inputs(query_ids, query_mask, response_ids, response_mask)
    trained = logprobs_from_logits(trainer.unwrapped.policy_logits(*inputs, query_ids.size(1)), response_ids)
    for k, reply in enumerate(replies):
        sampled = torch.tensor([t.logprob for t in reply.logprobs])
        assert len(sampled) == len(reply.token_ids) > 0
        torch.testing.assert_close(trained[k, :len(sampled)], sampled, atol=1e-4, rtol=1e-4)


def test_samples_per_prompt_groups_replies_and_scores_them_against_each_other(tmp_path, policy_dir, tokenizer,
                                                                              prompts):
    trainer = make_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={"samples_per_prompt": 2})
    steps = [trainer.batch_prompts(step) for step in range(2)]
    for batch in steps:
        assert [p.messages for p in batch[0::2]] == [p.messages for p in batch[1::2]]
    # Two steps of 4 prompts x 2 replies are one pass over the 8 prompts.
    assert sorted(p.row.line for batch in steps for p in batch[0::2]) == list(range(1, len(WORDS) + 1))

    rollout = trainer.rollout(steps[0])
    centered = rollout.rewards.sum(1) + trainer.kl_coef * rollout.kl.sum(1)  # the score part of the rewards
    raw = rollout.scores
    torch.testing.assert_close(centered, torch.stack([raw[0::2] - raw[1::2], raw[1::2] - raw[0::2]], 1).reshape(-1))
    assert raw.unique().numel() > 1  # sampled replies differ, so the check above is not 0 == 0


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def trained(tmp_path_factory, policy_dir, tokenizer, prompts):
    out = tmp_path_factory.mktemp("ppo-run")
    # A small KL coefficient: the optimum of share-of-even-tokens minus the KL penalty is then close
    # to all-even replies (with 0.05 it is near 85%, reached only slowly).
    trainer = make_trainer(out, policy_dir, tokenizer, prompts, ppo={"kl_coef": 0.01}, training={"max_steps": 16})
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    log = trainer.train()
    return trainer, before, log, out


def test_mean_reward_rises_under_a_known_reward(trained):
    _, _, log, _ = trained
    scores = [row["score"] for row in log]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.15 and last > 0.85, scores


def test_policy_and_value_weights_change_and_the_base_does_not(trained):
    trainer, before, _, _ = trained
    model = trainer.unwrapped
    trainable = {id(p) for p in model.trainable_parameters()}
    names = {"policy": 0, "value": 0, "head": 0}
    for name, p in model.named_parameters():
        if id(p) in trainable:
            assert not torch.equal(p, before[name]), f"{name} did not change"
            names["policy" if ".default." in name else "value" if ".value." in name else "head"] += 1
        else:
            assert torch.equal(p, before[name]), f"frozen {name} changed"
    assert all(names.values()), names


def test_saved_policy_adapter_reproduces_the_trained_policy(trained, tokenizer):
    trainer, _, log, out = trained
    for name in ("adapter_config.json", "adapter_model.safetensors", "value/adapter_model.safetensors",
                 "value_head.safetensors", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == list(range(1, 17))
    assert not list(out.glob(".*tmp"))
    loaded, _ = load_for_inference(inference_model_args(str(out)))
    rollout = trainer.rollout(trainer.batch_prompts(0))
    inputs = rollout.inputs()
    expected = trainer.unwrapped.policy_logits(*inputs, rollout.context_length)
    got = loaded(input_ids=inputs[0], attention_mask=inputs[1], position_ids=inputs[2]).logits
    torch.testing.assert_close(got[:, rollout.context_length - 1:-1], expected, atol=1e-5, rtol=1e-5)


def test_resume_continues_the_same_run(tmp_path, policy_dir, tokenizer, prompts):
    settings = {"ppo": {"adaptive_kl": True, "kl_target": 0.1, "kl_horizon": 10, "ema_decay": 0.9},
                "training": {"max_steps": 4, "save_strategy": "steps", "save_steps": 2}}
    straight = make_trainer(tmp_path / "a", policy_dir, tokenizer, prompts, **settings)
    straight_log = straight.train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    state = json.loads((checkpoint / "trainer_state.json").read_text())  # the Trainer stages' format
    kl_coef = json.loads((checkpoint / "rl_state.json").read_text())["kl_coef"]
    assert state["global_step"] == 2 and state["max_steps"] == 4 and kl_coef != pytest.approx(0.05)
    assert {p.name for p in (tmp_path / "a").iterdir() if p.name.startswith(("checkpoint", ".check"))} == {
        "checkpoint-2", "checkpoint-4"}

    resumed = make_trainer(tmp_path / "b", policy_dir, tokenizer, prompts, resume_from=str(checkpoint), **settings)
    assert resumed.step == 2 and resumed.kl_coef == kl_coef
    resumed_log = resumed.train()
    assert [r["step"] for r in resumed_log] == [1, 2, 3, 4]
    for a, b in zip(straight_log, resumed_log):
        assert {k: v for k, v in a.items() if k not in TIME_KEYS} == pytest.approx(
            {k: v for k, v in b.items() if k not in TIME_KEYS}, rel=1e-4, abs=1e-5)
    for name, average in straight.ema.average.items():  # the policy's moving average continues too
        torch.testing.assert_close(resumed.ema.average[name], average, atol=1e-6, rtol=1e-5)


def test_full_finetuning_keeps_a_separate_frozen_reference(tmp_path, policy_dir, tokenizer, prompts):
    trainer = make_trainer(tmp_path, policy_dir, tokenizer, prompts, finetuning_type="full",
                           ppo={"ppo_epochs": 1}, training={"learning_rate": 1e-4})
    model = trainer.unwrapped
    reference = {n: p.detach().clone() for n, p in model.reference.named_parameters()}
    policy_before = model.policy.lm_head.weight.detach().clone()
    assert trainer.train_step()["kl"] == 0.0
    assert not torch.equal(model.policy.lm_head.weight, policy_before)
    assert all(torch.equal(p, reference[n]) for n, p in model.reference.named_parameters())


# --------------------------------------------------------------------------- reward model


def test_reward_model_scores_the_chat_rendering_of_prompt_and_reply(reward_model_dir, tokenizer, prompts):
    from tunesmith.data.template import render_text

    rm, rm_tokenizer = load_for_inference(inference_model_args(reward_model_dir), task="reward")
    scorer = RewardModelScorer(rm, rm_tokenizer, tokenizer, batch_size=2)
    reply = tokenizer("Blue sky.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    unfinished = tokenizer("A long", add_special_tokens=False)["input_ids"]
    texts = scorer.texts(prompts[:2], [reply, unfinished])
    assert texts[0] == render_text(tokenizer, [*prompts[0].messages, {"role": "assistant", "content": "Blue sky."}])
    # Same tokenizer: the scored tokens are exactly prompt + reply (+ the template's newline after EOS).
    ids = rm_tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert ids == [*prompts[0].input_ids, *reply, *tokenizer("\n", add_special_tokens=False)["input_ids"]]
    scores = scorer(prompts[:3], [reply, unfinished, reply])
    alone = [torch.tensor([rm_tokenizer(t, add_special_tokens=False)["input_ids"]])
             for t in scorer.texts(prompts[:3], [reply, unfinished, reply])]
    direct = torch.cat([sequence_scores(rm, ids, torch.ones_like(ids)) for ids in alone])
    # Batched with right padding, each score is the one its sequence gets alone.
    torch.testing.assert_close(scores, direct, atol=1e-5, rtol=1e-5)


def test_recipe_trains_resumes_and_eval_compares(tmp_path, policy_dir, reward_model_dir, capsys):
    from tunesmith.rl import evaluate_command as eval_policy
    from tunesmith.rl.command import run as main

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in WORDS), encoding="utf-8")
    out = tmp_path / "ppo"
    flags = ["--model_name_or_path", policy_dir, "--reward_model", reward_model_dir, "--data_path", str(data),
             "--output_dir", str(out), "--per_device_train_batch_size", "4", "--max_new_tokens", "6",
             "--ppo_epochs", "1", "--save_steps", "2", "--report_to", "tensorboard", "--lora_r", "4"]
    main([*flags, "--max_steps", "2"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # --report_to tensorboard, as the Trainer stages take it (TensorBoard keeps the run config in a folder of its own)
    boards = [EventAccumulator(str(p.parent)).Reload() for p in out.rglob("events.out.tfevents.*")]
    (board,) = [b for b in boards if "train/score" in b.Tags()["scalars"]]  # tagged as the Trainer stages tag
    assert [e.step for e in board.Scalars("train/score")] == [1, 2] and "train/kl" in board.Tags()["scalars"]
    assert re.search(r"^step 2/2 \| score -?\d+\.\d{3} ± \d+\.\d{3} \| kl ", capsys.readouterr().out, re.M)
    first = (out / "metrics.jsonl").read_text().splitlines()
    assert (out / "checkpoint-2" / "trainer_state.json").is_file() and (out / "tunesmith_config.json").is_file()
    assert {"score", "score_std", "kl", "entropy", "clipfrac", "value_loss", "approx_kl", "reply_length",
            "time_generate", "time_train"} <= set(json.loads(first[0]))

    # Running the same command with more steps continues from the last checkpoint.
    trainer = main([*flags, "--max_steps", "3"])
    log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert trainer.step == 3 and log[:2] == [json.loads(line) for line in first] and log[2]["step"] == 3

    common = ["--reward_model", reward_model_dir, "--data_path", str(data), "--max_new_tokens", "6"]
    same = eval_policy.run(["--sft", str(out), "--ppo", str(out), *common])  # the first spellings still work
    assert same["kl_policy_baseline"] == 0.0 and same["baseline_reward"] == same["policy_reward"]
    assert same["policy_higher"] == same["policy_lower"] == 0 and same["reward_change"] == 0.0
    capsys.readouterr()
    result = eval_policy.run(["--baseline", policy_dir, "--policy", str(out), *common, "--show", "2",
                              "--output_file", str(tmp_path / "e.jsonl")])
    assert result["kl_policy_baseline"] != 0.0 and result["prompts"] == len(WORDS)
    assert result["reward_change"] == pytest.approx(result["policy_reward"] - result["baseline_reward"], abs=1e-5)
    assert result["policy_higher"] + result["policy_lower"] <= len(WORDS)
    printed = capsys.readouterr().out
    assert re.search(r"mean reward: baseline -?\d+\.\d{3} -> policy -?\d+\.\d{3} \(change [+-]\d+\.\d{3} ± "
                     r"\d+\.\d{3}", printed)
    assert re.search(r"KL\(policy \|\| baseline\): -?\d+\.\d{3} nats/reply", printed)
    assert printed.count("\n  baseline (") == 2 and printed.count("\n  policy   (") == 2
    assert "> Say cat.\n" in printed


# --------------------------------------------------------------------------- settings


def ppo_settings(**overrides):
    data = {"data_path": [str(ROOT / "data/demo/prompts.jsonl")]}
    ppo = {"reward_model": str(ROOT)}
    training = {"output_dir": "unused", "per_device_train_batch_size": 8, "max_steps": 1, "report_to": []}
    finetuning = {}
    for key, value in overrides.items():
        target = (data if key in PromptDataArguments.__dataclass_fields__ else ppo if key in PPOArguments.__dataclass_fields__
                  else finetuning if key == "finetuning_type" else training)
        target[key] = value
    return dict(data=PromptDataArguments(**data), ppo=PPOArguments(**ppo), finetuning=FinetuningArguments(**finetuning),
                training=TrainingArguments(**training))


@pytest.mark.parametrize("overrides, match", [
    ({"data_path": []}, r"--data_path is required"),
    ({"reward_model": None}, r"--reward_model or --reward_funcs is required: the output directory of reward/train.py"),
    ({"reward_model": "no/such/rm"}, r"--reward_model no/such/rm: no such directory"),
    ({"num_mini_batches": 3}, r"--num_mini_batches 3 must divide --per_device_train_batch_size 8"),
    ({"num_mini_batches": 2, "gradient_accumulation_steps": 3},
     r"--gradient_accumulation_steps 3 must divide the mini-batch of 4 rows"),
    ({"samples_per_prompt": 3}, r"--samples_per_prompt 3 must divide --per_device_train_batch_size 8"),
    ({"temperature": 0.0}, r"--temperature must be positive \(got 0.0\)"),
    ({"max_new_tokens": 0}, r"--max_new_tokens \(0\) and --ppo_epochs \(2\) must be at least 1"),
    ({"gradient_checkpointing": True}, r"--gradient_checkpointing cannot be used with LoRA PPO"),
    ({"max_steps": -1, "num_train_epochs": 0}, r"set --max_steps .* or --num_train_epochs"),
    ({"loss_type": "luspo"}, r"--loss_type luspo is LUSPO: .* add --importance_sampling_level sequence"),
    ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, r"--loss_type vespo .* leave"),
    ({"epsilon_high": -0.1}, r"--epsilon_high must be >= 0 \(got -0.1\)"),
    ({"delta": 4.0, "loss_type": "sapo"}, r"--loss_type sapo has none: drop --delta"),
    ({"delta": 1.1}, r"--delta 1.1 must exceed the clip's ceiling"),
    ({"scale_rewards": "none"}, r"--scale_rewards none scales --advantage grpo's group advantages; --advantage gae"),
    ({"multi_objective_aggregation": "normalize_then_sum", "advantage": "grpo", "samples_per_prompt": 2},
     r"normalize_then_sum \(GDPO\) .* two or more sources"),
    ({"dynamic_sampling": True}, r"--dynamic_sampling drops groups .* use --advantage grpo or rloo"),
    ({"top_entropy_quantile": 1.5}, r"--top_entropy_quantile must be between 0 and 1 \(got 1.5"),
    ({"overlong_buffer": 100}, r"--overlong_buffer 100 must be between 0 \(off\) and --max_new_tokens \(48\)"),
    ({"sapo_temperature_neg": 0.0}, r"--sapo_temperature_pos and --sapo_temperature_neg must be positive"),
])
def test_bad_ppo_settings_say_what_to_change(overrides, match):
    with pytest.raises(UserError, match=match):
        check(check_paths=True, feature_rules=RULES, **ppo_settings(**overrides))


def test_trainer_needs_exactly_one_reward(tmp_path, tokenizer, prompts):
    with pytest.raises(ValueError, match="needs a reward_model and/or reward_funcs, or else one reward_fn"):
        PPOTrainer(None, tokenizer, prompts, PPOArguments(), TrainingArguments(output_dir=str(tmp_path)))


def test_demo_config_parses():
    run = parse_run("ppo", [str(ROOT / "configs" / "ppo_lora_demo.yaml")], check_paths=False)
    model, data, ppo, training = run.model, run.data, run.ppo, run.training
    assert data.data_path == ["data/demo/prompts.jsonl"] and ppo.reward_model and model.adapter_name_or_path
    assert training.max_steps > 0 and training.per_device_train_batch_size % ppo.num_mini_batches == 0


def test_help_documents_every_ppo_flag(capsys):
    from tunesmith.rl.command import run

    with pytest.raises(SystemExit) as exit_info:
        run(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(f"--{f.name} " in out for f in dataclasses.fields(PPOArguments))


# --------------------------------------------------------------------------- the critic from the reward model


def build_reward_model(path: Path, base_dir: str, finetuning_type: str, tokenizer) -> str:
    """A reward model of the policy's base with random (nonzero) LoRA B and score head: a LoRA adapter (SEQ_CLS,
    the head in modules_to_save, as reward/train.py saves one) or a full sequence classifier."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(3)
    model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1)
    if finetuning_type == "lora":
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                 task_type=TaskType.SEQ_CLS))
    for name, p in model.named_parameters():
        if "lora_B" in name or "score" in name:
            p.data.normal_(0, 0.5)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_the_critic_starts_as_the_reward_model(tmp_path, policy_dir, tokenizer, prompts, finetuning_type, caplog):
    """DeepSpeed-Chat's critic initialisation: before any update, V(prefix) is the reward model's score of that
    prefix at every response position (its body as the value adapter or model, its head as the value head)."""
    from tunesmith.models.scoring import score_head
    from tunesmith.rl import critic_start

    rm_dir = build_reward_model(tmp_path / "rm", policy_dir, finetuning_type, tokenizer)
    model_args = ModelArguments(model_name_or_path=policy_dir)
    finetuning_args = FinetuningArguments(finetuning_type=finetuning_type, lora_r=8, lora_alpha=16)
    critic = critic_start(PPOArguments(reward_model=rm_dir), model_args, finetuning_args)
    assert critic == rm_dir
    model = build_actor_critic(model_args, finetuning_args, None, critic=critic)

    context = prompts[0].input_ids
    ids = torch.tensor([list(context) + [11, 12, 13, 14]])
    mask, positions = torch.ones_like(ids), torch.arange(ids.size(1)).unsqueeze(0)
    values = model.values(ids, mask, positions, len(context))
    rm, _ = load_for_inference(inference_model_args(rm_dir), task="reward")
    hidden = rm(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    expected = score_head(rm)(hidden)[0, len(context) - 1:-1, 0]
    assert values.abs().min() > 1e-3 and torch.allclose(values[0], expected, atol=1e-4)

    # `base` (and GRPO) keep the zero value head; a reward model that does not fit falls back, or is refused by name.
    assert critic_start(PPOArguments(reward_model=rm_dir, critic_model_name_or_path="base"), model_args,
                        finetuning_args) is None
    other = "full" if finetuning_type == "lora" else "lora"
    misfit = build_reward_model(tmp_path / "misfit", policy_dir, other, tokenizer)
    with caplog.at_level("INFO", logger="tunesmith.rl.models"):
        assert critic_start(PPOArguments(reward_model=misfit), model_args, finetuning_args) is None
    assert "critic: starts from the base with a zero value head" in caplog.text
    with pytest.raises(UserError, match=rf"--critic_model_name_or_path {re.escape(misfit)} is "):
        critic_start(PPOArguments(reward_model=rm_dir, critic_model_name_or_path=misfit), model_args, finetuning_args)


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_damaged_critic_or_reference_adapter_is_one_line_naming_the_file(tmp_path, policy_dir, sft_adapter,
                                                                           tokenizer):
    """The adapters PPO loads beside the policy (the critic's reward adapter; the SFT adapter as reference when the
    policy comes from a checkpoint) are checked as the policy's own are (issue 51), not a safetensors traceback."""
    import shutil

    finetuning_args = FinetuningArguments(finetuning_type="lora", lora_r=8, lora_alpha=16)
    rm_dir = build_reward_model(tmp_path / "rm", policy_dir, "lora", tokenizer)
    cut_short(Path(rm_dir) / "adapter_model.safetensors")
    with pytest.raises(UserError, match=rf"^--critic_model_name_or_path .*: {rm_dir}/adapter_model.safetensors: not "
                                        "a whole safetensors file"):
        build_actor_critic(ModelArguments(model_name_or_path=policy_dir), finetuning_args, None, critic=rm_dir)
    damaged = shutil.copytree(sft_adapter, tmp_path / "sft")
    cut_short(damaged / "adapter_model.safetensors")
    with pytest.raises(UserError, match=rf"^--adapter_name_or_path {damaged}: {damaged}/adapter_model.safetensors"):
        build_actor_critic(ModelArguments(model_name_or_path=policy_dir, adapter_name_or_path=str(damaged)),
                           finetuning_args, None, resume_from=sft_adapter, value_model=False)


# --------------------------------------------------------------------------- PPO-ptx


def test_ptx_adds_the_supervised_loss_and_resumes_with_the_same_batches(tmp_path, policy_dir, reward_model_dir):
    """--ptx_data_path: the SFT loss of its conversations joins every update (logged as ptx_loss) and falls as the
    policy learns them; a run stopped and resumed draws the same ptx batches as one that never stopped."""
    from tunesmith.rl.command import run as main

    prompts_file, ptx_file = tmp_path / "prompts.jsonl", tmp_path / "ptx.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in WORDS), encoding="utf-8")
    conversations = [[{"role": "user", "content": f"Spell {w}."}, {"role": "assistant", "content": " ".join(w)}]
                     for w in ("cat", "dog", "sun")]
    ptx_file.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations), encoding="utf-8")

    def flags(out: Path, steps: int) -> list[str]:
        return ["--model_name_or_path", policy_dir, "--reward_model", reward_model_dir, "--data_path",
                str(prompts_file), "--ptx_data_path", str(ptx_file), "--ptx_coef", "20", "--output_dir", str(out),
                "--per_device_train_batch_size", "4", "--num_mini_batches", "2", "--max_new_tokens", "4",
                "--ppo_epochs", "1", "--learning_rate", "3e-2", "--lr_scheduler_type", "constant", "--lora_r", "4",
                "--save_steps", "2",
                "--report_to", "none", "--max_steps", str(steps)]

    whole = main(flags(tmp_path / "whole", 4)).log_history
    ptx = [row["ptx_loss"] for row in whole]
    assert ptx[-1] < ptx[0] - 0.5, ptx

    main(flags(tmp_path / "resumed", 2))
    resumed = main(flags(tmp_path / "resumed", 4)).log_history
    assert [row["ptx_loss"] for row in resumed] == pytest.approx(ptx, abs=1e-5)


@pytest.mark.parametrize("overrides, match", [
    (["--ptx_coef", "2"], r"--ptx_coef weighs the supervised loss of --ptx_data_path, which is not given"),
    (["--ptx_data_path", "no/such.jsonl"], r"--ptx_data_path no/such.jsonl: "),
    (["--ptx_data_path", str(ROOT / "data/demo/sft.jsonl"), "--ptx_coef", "0"], r"--ptx_coef must be > 0"),
    (["--ema_decay", "1"], r"--ema_decay must be between 0 and 1, both excluded \(got 1.0\)"),
    (["--ema_decay", "0.99", "--deepspeed", str(ROOT / "configs/ds_zero3.json")],
     r"--ema_decay keeps a whole copy of the policy's weights, which ZeRO-3 holds only in shards"),
    (["--advantage", "grpo", "--samples_per_prompt", "2", "--critic_model_name_or_path", "base"],
     r"--critic_model_name_or_path starts PPO's value model, and --advantage grpo has none"),
])
def test_ptx_ema_and_critic_misuse_is_one_line(overrides, match):
    with pytest.raises(UserError, match=match):
        parse_run("ppo", ["--reward_model", str(ROOT), "--data_path", str(ROOT / "data/demo/prompts.jsonl"),
                          *overrides])


# --------------------------------------------------------------------------- EMA of the policy


def test_ema_averages_the_policy_after_every_update_and_saves_a_loadable_adapter(tmp_path, policy_dir, tokenizer,
                                                                                  prompts):
    """--ema_decay d: after each optimizer step ema = d * ema + (1 - d) * policy, from the policy at step 0;
    output_dir/ema is an adapter of the base that loads for chat/serve/eval with exactly those weights."""
    trainer = make_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={"ema_decay": 0.5},
                           training={"max_steps": 2})
    weights = trainer.unwrapped.policy_weights()
    assert weights and all(".lora_" in name and ".default." in name for name in weights)
    expected = {name: p.detach().clone() for name, p in weights.items()}
    update = trainer.ema.update

    def update_and_follow() -> None:
        update()
        for name, p in weights.items():
            expected[name] = 0.5 * expected[name] + 0.5 * p.detach()

    trainer.ema.update = update_and_follow
    trainer.train()
    updates = 2 * trainer.ppo.ppo_epochs * trainer.ppo.num_mini_batches
    assert trainer.optimizer.optimizer.state[next(iter(weights.values()))]["step"] == updates

    loaded, _ = load_for_inference(inference_model_args(str(tmp_path / "ema")))
    saved = dict(loaded.named_parameters())
    for name, value in expected.items():
        torch.testing.assert_close(saved[name], value, atol=1e-6, rtol=1e-5)
        assert not torch.equal(value, weights[name].detach())  # the average lags the policy
    assert (tmp_path / "ema" / "tokenizer_config.json").is_file()


def grpo_command(data: Path, policy: str, out: Path) -> list[str]:
    """`tunesmith ppo` for a 4-step GRPO run with checkpoints at steps 2 and 4."""
    import sys

    return [sys.executable, "-m", "tunesmith", "ppo", "--model_name_or_path", policy, "--data_path", str(data),
            "--output_dir", str(out), "--advantage", "grpo", "--samples_per_prompt", "2", "--reward_funcs",
            "exact_answer", "answer_format", "--per_device_train_batch_size", "4", "--max_new_tokens", "4",
            "--ppo_epochs", "1", "--max_steps", "4", "--save_steps", "2", "--lora_r", "4", "--report_to", "none"]


@pytest.fixture(scope="module")
def straight_grpo(tmp_path_factory, policy_dir) -> tuple[Path, Path]:
    """(the prompts file, the output folder of the uninterrupted run, trained in this process)."""
    from tunesmith.rl.command import run as main

    folder = tmp_path_factory.mktemp("grpo-straight")
    data = folder / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {w}.", "answer": w}) + "\n" for w in WORDS), encoding="utf-8")
    main(grpo_command(data, policy_dir, folder / "straight")[4:])
    return data, folder / "straight"


def logged_rows(out: Path) -> list[dict]:
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in logged]


def test_a_run_killed_mid_way_resumes_bit_identical(tmp_path, policy_dir, straight_grpo):
    """kill -9 a GRPO run once checkpoint-2 is published; the same command continues from it and every logged
    value of steps 3 and 4 equals an uninterrupted run's, as the Trainer stages resume."""
    import os
    import signal
    import subprocess
    import time

    data, straight = straight_grpo

    def command(out: Path) -> list[str]:
        return grpo_command(data, policy_dir, out)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = subprocess.Popen(command(tmp_path / "killed"), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    published = tmp_path / "killed" / "checkpoint-2" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not published.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert published.exists()
    resumed = subprocess.run(command(tmp_path / "killed"), env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr and "checkpoint-2 (step 2)" in resumed.stderr

    def rows(out: Path) -> list[dict]:
        return logged_rows(out)

    assert [r["step"] for r in rows(tmp_path / "killed")] == [1, 2, 3, 4]
    assert rows(tmp_path / "killed") == rows(straight)


def die_at(moment: str) -> None:
    """In a child process: SIGKILL itself (kill -9, at an exact moment) when the run reaches `moment`."""
    import os
    import signal

    import tunesmith.train.lifecycle as lifecycle

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if moment == "writing checkpoint-4":  # its optimizer state written, its random state not
        save = torch.save

        def save_or_die(obj, path, *args, **kwargs):
            if Path(path).parent.name == ".checkpoint-4.tmp" and Path(path).name.startswith("rng_state"):
                die()
            save(obj, path, *args, **kwargs)

        torch.save = save_or_die
    elif moment == "publishing the final save":  # one file of the finished model moved into place, the rest not
        def half(staging, target) -> None:
            first = next(p for p in sorted(Path(staging).iterdir()) if p.is_file())
            os.replace(first, Path(target) / first.name)
            die()

        lifecycle.publish_files = half


def killed_at(moment: str, argv: list[str]) -> int:
    """`tunesmith ppo argv` in a forked child (this process's imports, no start-up) killed at `moment`: its exit
    status as os.waitstatus_to_exitcode gives it (-9)."""
    import os

    from tunesmith.rl.command import run

    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            die_at(moment)
            run(argv)
        finally:
            os._exit(3)  # reached only if the moment never came
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_grpo_run_killed_at_each_moment_of_its_lifecycle_resumes_bit_identical(tmp_path, policy_dir, straight_grpo,
                                                                                   caplog):
    """kill -9 while checkpoint-4 is half written (after checkpoint-2, mid-step: the test above), then, run again,
    while the final save is half published: each rerun of the same command continues from the last complete
    checkpoint, and the run ends with the uninterrupted run's log and bit-identical weights, no staging folder left
    (train/lifecycle.py, shared with the Trainer stages)."""
    from safetensors.torch import load_file

    from tunesmith.rl.command import run

    data, straight = straight_grpo
    out = tmp_path / "killed"
    argv = grpo_command(data, policy_dir, out)[4:]
    assert killed_at("writing checkpoint-4", argv) == -9
    assert (out / ".checkpoint-4.tmp").is_dir() and (out / "checkpoint-2").is_dir()
    assert not (out / "checkpoint-4").exists()
    assert killed_at("publishing the final save", argv) == -9  # it resumed checkpoint-2
    assert not (out / ".checkpoint-4.tmp").exists() and (out / "checkpoint-4").is_dir()
    assert (out / ".final-model.tmp").is_dir()
    with caplog.at_level("INFO", logger="tunesmith"):
        run(argv)
    assert f"resuming from {out / 'checkpoint-4'} (step 4)" in caplog.text
    assert [r["step"] for r in logged_rows(out)] == [1, 2, 3, 4]
    assert logged_rows(out) == logged_rows(straight)
    assert not (out / ".final-model.tmp").exists()
    weights, expected = load_file(out / "adapter_model.safetensors"), load_file(straight / "adapter_model.safetensors")
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in expected)
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4
