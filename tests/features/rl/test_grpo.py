"""GRPO and RLOO in the RL stage (`--advantage grpo|rloo`) on tiny random models: no value model is created,
trained or saved; advantages are the group's; the KL can be a loss term; reward functions get the rows'
fields and their mistakes name the function and the row; resume repeats the next step exactly; the
shipped reward functions, the demo data and the evaluation with reward functions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tunesmith.rl.trainer as ppo_trainer
from tests.features.rl.test_ppo_trainer import (
    TIME_KEYS,
    WORDS,
    build_even_token_model,
    even_share,
    ppo_settings,
)
from tunesmith.data.formats import Row
from tunesmith.data.prompts import Prompt, encode_prompts, left_pad
from tunesmith.data.reward_funcs import (
    answer_format,
    exact_answer,
    extract_answer,
    final_number,
    length_penalty,
)
from tunesmith.errors import ConfigError, DataError, UserError
from tunesmith.hparams import FinetuningArguments, ModelArguments, TrainingArguments, check
from tunesmith.rl import PPOTrainer, build_actor_critic
from tunesmith.rl.args import PPOArguments
from tunesmith.rl.losses import group_advantages, truncate_after_eos
from tunesmith.rl.reward_sources import Rewards, load_reward_function
from tunesmith.rl.rules import RULES

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # many small ops: a second thread on two shared cores only adds waiting
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, tokenizer) -> str:
    return build_even_token_model(tmp_path_factory.mktemp("even-llama"), tokenizer)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[Prompt]:
    raw = [Prompt(Row("words.jsonl", i, {"prompt": f"Say {w}.", "answer": str(i)}),
                  [{"role": "user", "content": f"Say {w}."}]) for i, w in enumerate(WORDS, 1)]
    return encode_prompts(tokenizer, raw, max_length=512)


CALLS: list[dict] = []


def short_replies(prompts, replies, **fields):
    """A text reward for the tests: shorter is better; records what it was given."""
    CALLS.append({"prompts": prompts, "replies": replies, **fields})
    return [-len(r) / 10 for r in replies]


def make_grpo_trainer(output_dir, model_dir, tokenizer, prompts, *, resume_from=None, ppo=None, training=None,
                      **rewards) -> PPOTrainer:
    ppo_args = PPOArguments(**{"advantage": "grpo", "samples_per_prompt": 4, "kl_in_loss": True, "kl_coef": 0.01,
                               "max_new_tokens": 8, "ppo_epochs": 2, "num_mini_batches": 2, "rollout_log_samples": 0,
                               **(ppo or {})})
    training_args = TrainingArguments(**{
        "output_dir": str(output_dir), "report_to": [], "per_device_train_batch_size": 8, "learning_rate": 1e-2,
        "lr_scheduler_type": "constant", "save_strategy": "no", "max_steps": 1, "seed": 0, **(training or {})})
    torch.manual_seed(0)
    model = build_actor_critic(ModelArguments(model_name_or_path=model_dir), FinetuningArguments(lora_r=8, lora_alpha=16),
                               training_args, ppo_args.temperature, resume_from, value_model=ppo_args.uses_value_model)
    return PPOTrainer(model, tokenizer, prompts, ppo_args, training_args, resume_from=resume_from,
                      **{"reward_fn": even_share, **rewards})


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, policy_dir, tokenizer, prompts):
    out = tmp_path_factory.mktemp("grpo-run")
    trainer = make_grpo_trainer(out, policy_dir, tokenizer, prompts, training={"max_steps": 8})
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    log = trainer.train()
    return trainer, before, log, out


def test_grpo_has_no_value_model_and_saves_none(grpo_run):
    trainer, before, log, out = grpo_run
    model = trainer.unwrapped
    assert model.value_head is None and set(model.policy.peft_config) == {"default"}
    assert not any("value" in n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():  # only the policy adapter trains
        assert torch.equal(p, before[name]) != ("lora_" in name and ".default." in name), name
    assert (out / "adapter_model.safetensors").is_file() and (out / "reward.png").is_file()
    assert not (out / "value").exists() and not (out / "value_head.safetensors").exists()
    assert "value_loss" not in log[0] and "value_mean" not in log[0] and log[0]["kl"] == 0.0
    assert all(r["kl_loss"] >= 0 for r in log) and log[-1]["kl_loss"] > 0  # k3 in the loss: never negative


def test_grpo_raises_the_reward(grpo_run):
    scores = [row["score"] for row in grpo_run[2]]
    assert sum(scores[-2:]) / 2 > sum(scores[:2]) / 2 + 0.1, scores


def test_grpo_rollout_gives_each_reply_its_group_advantage(tmp_path, policy_dir, tokenizer, prompts):
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={"kl_in_loss": False, "kl_coef": 0.1})
    r = trainer.rollout(trainer.batch_prompts(0))
    # KL in the reward: the sequence reward is the score less kl_coef times the summed KL.
    sequence = r.scores - 0.1 * r.kl.sum(1)
    expected = group_advantages(sequence, 4)
    mask = r.response_mask.bool()
    torch.testing.assert_close(r.advantages, torch.where(mask, expected.unsqueeze(1), 0.0))
    assert r.values is None and r.returns is None

    trainer.ppo.advantage = "rloo"
    r = trainer.rollout(trainer.batch_prompts(0))
    groups = (r.scores - 0.1 * r.kl.sum(1)).reshape(-1, 4)
    loo = (groups - (groups.sum(1, keepdim=True) - groups) / 3).reshape(-1)
    torch.testing.assert_close(r.advantages[:, 0], loo)


def hf_generate_responses(engine, prompts, params, pad_token_id, max_batch_size=None):
    """The rollout's generation before the engine: transformers' generate() on the left-padded batch."""
    from transformers import GenerationConfig

    query_ids, query_mask = left_pad(prompts, pad_token_id)
    config = GenerationConfig(max_new_tokens=params.max_new_tokens, min_new_tokens=0, do_sample=True,
                              temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                              repetition_penalty=1.0, num_beams=1, eos_token_id=sorted(engine.stop_ids),
                              pad_token_id=pad_token_id, use_cache=True)
    with torch.no_grad():
        out = engine.model.generate(input_ids=query_ids, attention_mask=query_mask, generation_config=config)
    return truncate_after_eos(out[:, query_ids.size(1):], config.eos_token_id, pad_token_id)


def test_a_seeded_grpo_run_gets_the_same_rewards_from_the_engine_as_from_generate(tmp_path, policy_dir, tokenizer,
                                                                                   prompts, monkeypatch):
    """The engine draws a batch's tokens in one multinomial over the rows still running, from the global
    generator, as generate() does; so a seeded run samples the same replies, scores them the same and
    trains the same, as long as no reply ends before the others (generate() keeps drawing for finished rows,
    the engine lets them go: from then on the draws, not their distribution, differ). The replies here run to
    max_new_tokens, which the test checks."""
    settings = {"training": {"max_steps": 3}, "ppo": {"temperature": 0.9}}
    engine_log = make_grpo_trainer(tmp_path / "engine", policy_dir, tokenizer, prompts, **settings).train()
    monkeypatch.setattr(ppo_trainer, "generate_responses", hf_generate_responses)
    generate_log = make_grpo_trainer(tmp_path / "generate", policy_dir, tokenizer, prompts, **settings).train()
    assert [r["score"] for r in engine_log] == [r["score"] for r in generate_log]
    assert len({r["score"] for r in engine_log}) > 1  # the steps differ: not the same constant
    assert all(r["eos_rate"] == 0 for r in engine_log + generate_log)
    keys = ("policy_loss", "kl_loss", "kl", "approx_kl")
    assert [r[k] for r in engine_log for k in keys] == pytest.approx([r[k] for r in generate_log for k in keys],
                                                                     rel=1e-5, abs=1e-7)


def test_grpo_resume_repeats_the_next_step_exactly(tmp_path, policy_dir, tokenizer, prompts):
    settings = {"ppo": {"adaptive_kl": True, "kl_target": 0.1, "kl_horizon": 10},
                "training": {"max_steps": 3, "save_strategy": "steps", "save_steps": 2}}
    straight_log = make_grpo_trainer(tmp_path / "a", policy_dir, tokenizer, prompts, **settings).train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert not (checkpoint / "value").exists() and not (checkpoint / "value_head.safetensors").exists()
    resumed = make_grpo_trainer(tmp_path / "b", policy_dir, tokenizer, prompts, resume_from=str(checkpoint), **settings)
    assert resumed.step == 2
    resumed_log = resumed.train()
    assert [r["step"] for r in resumed_log] == [1, 2, 3]
    assert {k: v for k, v in resumed_log[2].items() if k not in TIME_KEYS} == pytest.approx(
        {k: v for k, v in straight_log[2].items() if k not in TIME_KEYS}, rel=1e-4, abs=1e-6)


def test_reward_functions_get_the_rows_fields_and_are_logged_per_source(tmp_path, policy_dir, tokenizer, prompts):
    CALLS.clear()
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo={
        "reward_funcs": ["tests.features.rl.test_grpo:short_replies", "answer_format"],
        "reward_weights": [2.0, 1.0]}, reward_fn=None)
    row = trainer.train_step()
    call = CALLS[0]
    batch = trainer.batch_prompts(0)
    assert call["prompts"] == [p.messages for p in batch] and call["answer"] == [p.row.data["answer"] for p in batch]
    assert "prompt" not in call  # the prompt field itself is not passed twice
    assert row["score/short_replies"] == pytest.approx(-sum(map(len, call["replies"])) / 10 / 8, abs=1e-5)
    assert row["score"] == pytest.approx(2 * row["score/short_replies"] + row["score/answer_format"], abs=1e-5)


# --------------------------------------------------------------------------- reward functions


def test_shipped_reward_functions():
    replies = ["3 + 4 = 7.\nAnswer: 7", "Answer: 7.0\n", "answer: 7", "Answer: 8", "The answer is 7.",
               "Answer: 7\nBut maybe 8.", "Answer: seven", "Answer: 3 + 4 = 7", "Answer: 7 or 8",
               "Add 3 and 4. Answer: 3 + 4 = 7", "Sum. Answer: N"]
    assert [extract_answer(r) for r in replies] == ["7", "7.0", None, "8", None, None, "seven", "3 + 4 = 7", "7 or 8",
                                                    "3 + 4 = 7", "N"]
    # A numeric answer is the last number after the last line's `Answer:`; the strict format is `Answer: <number>`.
    assert exact_answer([], replies, answer=["7"] * 11) == [1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0]
    assert answer_format([], replies) == [1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert answer_format([], ["So: Answer: 7"]) == [0.0] and extract_answer("So: Answer: 7", strict=True) is None
    assert exact_answer([], ["Answer: Paris", "Answer: Paris, France"], answer=["paris"] * 2) == [1.0, 0.0]
    assert length_penalty([], ["x" * 50, "x" * 100, "x" * 150]) == [0.0, 0.0, -0.5]
    # final_number: a number of the last line, no format asked; a tool's result on an earlier line is not it.
    trajectory = '<tool_call>{"name": "calculate"}</tool_call>\ntool\n10063\nassistant\n'
    got = final_number([], [trajectory + "It is 10,063.", trajectory, "10063 is 347 times 29.", "= 10063.0\n",
                            "10063\nIt is 10062."], answer=["10063"] * 5)
    assert got == [1.0, 0.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="final_number needs a number"):
        final_number([], ["Paris"], answer=["Paris"])


def test_reward_function_errors_name_the_function_and_the_row(prompts):
    rows = [Prompt(Row("data/q.jsonl", 3, {"prompt": "1 + 1?", "answer": "2"}), []),
            Prompt(Row("data/q.jsonl", 7, {"prompt": "2 + 2?"}), [])]
    rewards = Rewards(None, [load_reward_function("exact_answer")])
    rewards.tokenizer = type("T", (), {"batch_decode": staticmethod(lambda ids, **kw: ["Answer: 2"] * len(ids))})()
    with pytest.raises(DataError, match=r"reward function exact_answer failed on data/q.jsonl:line 7: ValueError: "
                                        r"the row has no `answer` field"):
        rewards(rows, [[1], [2]])
    assert rewards(rows[:1], [[1]])[0].tolist() == [1.0]


@pytest.mark.parametrize("spec, match", [
    ("no_such_module:f", r"--reward_funcs no_such_module:f: cannot import no_such_module"),
    ("tunesmith.data.reward_funcs:nope", r"has no function 'nope' \(it has: answer_format, exact_answer, "),
    ("nope", r"tunesmith.data.reward_funcs has no function 'nope'"),
    ("tunesmith.data.reward_funcs:LENGTH_BUDGET", r"is a int, not a function"),
    ("tunesmith.data.reward_funcs:last_line", r"must accept \(prompts, replies, \*\*fields\)"),
])
def test_reward_functions_that_cannot_load_are_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        load_reward_function(spec)


def wrong_length(prompts, replies, **fields):
    return [1.0]


def not_a_number(prompts, replies, **fields):
    return ["high"] * len(replies)


@pytest.mark.parametrize("name, match", [("wrong_length", r"returned 1 values for 2 replies"),
                                         ("not_a_number", r"returned 'high' among its values")])
def test_reward_functions_returning_the_wrong_thing_are_named(prompts, name, match):
    fn = load_reward_function(f"tests.features.rl.test_grpo:{name}")
    with pytest.raises(ConfigError, match=rf"reward function tests.features.rl.test_grpo:{name} {match} "
                                          r"\(batch from words.jsonl:line 1\)"):
        fn(prompts[:2], ["a", "b"])


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("overrides, match", [
    ({"advantage": "grpo", "samples_per_prompt": 1}, r"--advantage grpo compares each reply .* --samples_per_prompt"),
    ({"advantage": "rloo", "samples_per_prompt": 4, "vf_coef": 0.5},
     r"--vf_coef 0.5 belongs to the value model of --advantage gae; --advantage rloo has none"),
    ({"advantage": "grpo", "samples_per_prompt": 4, "whiten_rewards": True}, r"--whiten_rewards True belongs"),
    ({"kl_in_loss": True, "kl_estimator": "k1"}, r"--kl_estimator k1 with --kl_in_loss"),
    ({"reward_model": None}, r"--reward_model or --reward_funcs is required"),
    ({"reward_funcs": ["exact_answer"], "reward_weights": [1.0, 2.0]}, r"--reward_weights has 2 values for 1"),
])
def test_bad_grpo_settings_say_what_to_change(overrides, match):
    with pytest.raises(UserError, match=match):
        check(check_paths=False, feature_rules=RULES, **ppo_settings(**overrides))


def test_reward_functions_alone_are_enough_and_kl_in_loss_defaults_to_k3():
    check(check_paths=False, feature_rules=RULES, **ppo_settings(reward_model=None, reward_funcs=["exact_answer"],
                                                                 advantage="grpo", samples_per_prompt=4, vf_coef=0.1))
    assert PPOArguments(kl_in_loss=True).kl_estimator == "k3" and PPOArguments().kl_estimator == "k1"


# --------------------------------------------------------------------------- demo data and evaluation


def test_demo_data_is_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts/make_grpo_demo.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    for name in ("grpo_train.jsonl", "grpo_eval.jsonl"):
        assert (tmp_path / name).read_text() == (ROOT / "data/demo" / name).read_text(), name
    train = [json.loads(line) for line in (ROOT / "data/demo/grpo_train.jsonl").read_text().splitlines()]
    held_out = [json.loads(line) for line in (ROOT / "data/demo/grpo_eval.jsonl").read_text().splitlines()]
    questions = {r["messages"][-1]["content"] for r in train}
    assert not questions & {r["messages"][-1]["content"] for r in held_out}  # held out means not trained on
    assert all(exact_answer([], [f"Answer: {r['answer']}"], answer=[r["answer"]]) == [1.0] for r in held_out)


def test_eval_rl_reports_accuracy_and_format_with_paired_errors(tmp_path, policy_dir, tokenizer, capsys, caplog):
    from tunesmith.evaluation import command as evaluation

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{i} + 1?"}], "answer": str(i + 1)})
                            + "\n" for i in range(4)))
    trained = make_grpo_trainer(tmp_path / "policy", policy_dir, tokenizer,
                                encode_prompts(tokenizer, [Prompt(Row("q", 1, {}), [{"role": "user", "content": "hi"}])] * 4,
                                               512))
    trained.train()
    # through the one front door, `tunesmith eval`, with the old spelling --prompts: taken, and said to be old
    result = evaluation.run(["--policy", str(tmp_path / "policy"), "--prompts", str(data), "--max_new_tokens", "4",
                              "--reward_funcs", "exact_answer", "answer_format", "--show", "1",
                              "--output_file", str(tmp_path / "e.jsonl")])
    assert "--prompts is deprecated, use --data_path" in caplog.text
    assert result["prompts"] == 4 and result["exact_answer_baseline"] == 0.0
    assert {"answer_format_change", "answer_format_change_stderr", "kl_policy_baseline"} <= set(result)
    printed = capsys.readouterr().out
    assert "exact_answer: baseline 0.000 -> policy 0.000 (change +0.000 ± 0.000, paired standard error)" in printed
    first = json.loads((tmp_path / "e.jsonl").read_text().splitlines()[0])
    assert {"baseline_exact_answer", "policy_answer_format"} <= set(first)


def test_prompt_rows_keep_their_answer_and_a_malformed_one_names_file_and_line(tmp_path):
    from tunesmith.data.prompts import load_prompts

    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "1 + 1?"}], "answer": 2, "level": "easy"}) + "\n")
    bad.write_text(json.dumps({"prompt": "1 + 1?", "answer": "2"}) + "\n" + json.dumps({"prompt": "2 + 2?", "answer": [4]}) + "\n")
    assert load_prompts([str(good)])[0].row.data == {"messages": [{"role": "user", "content": "1 + 1?"}], "answer": 2,
                                                     "level": "easy"}
    with pytest.raises(DataError, match=rf"{bad}:line 2: field `answer`: expected the reference answer as a non-empty "
                                        r"string or a number, got \[4\]"):
        load_prompts([str(bad)])
