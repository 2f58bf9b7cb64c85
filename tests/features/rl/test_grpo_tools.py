"""Tools in the RL stage's rollouts (--tool_funcs): the trainer samples whole trajectories through the tool loop,
the reward sees them whole (tool results included), and only the tokens the policy sampled train: a tool's result
and the template's wrapping are context. The policy is the tiny random model; its rollouts come from the scripted
engine of tests/features/rl/test_tool_rollout.py (a model that calls `add`, then answers from the result), so the calls are
certain while the log-probabilities, the KL and the update are the policy's own."""

from __future__ import annotations

import math

import pytest
import torch

from tests.features.rl import test_grpo, test_tool_rollout
from tests.features.rl.test_grpo import make_grpo_trainer
from tests.features.rl.test_tool_rollout import HEADER, ScriptedLM, answer_from_result, call, prompts_for
from tunesmith.data.tool_calls import ToolCall
from tunesmith.generation import Engine
from tunesmith.rl.args import ToolUseArguments
from tunesmith.rl.tool_funcs import calculate
from tunesmith.rl.toolbox import Toolbox, load_tool

one_thread, policy_dir = test_grpo.one_thread, test_grpo.policy_dir  # their fixtures
tools_tokenizer = test_tool_rollout.tools_tokenizer

SEEN: list[str] = []


def noisy_reward(tokenizer):
    """Records each trajectory as the reward sees it; scores vary within a group, so advantages are not 0."""
    def reward(prompts_ids, responses_ids):
        SEEN.extend(tokenizer.decode(r, skip_special_tokens=False) for r in responses_ids)
        return torch.rand(len(responses_ids)).tolist()
    return reward


def tool_trainer(tmp_path, policy_dir, tokenizer, advantage="grpo"):
    toolbox = Toolbox([load_tool("tests.features.rl.test_tool_rollout:add")])
    prompts = prompts_for(tokenizer, toolbox, "What is 2 + 3?", "What is 4 + 4?")
    ppo = {"advantage": advantage, "max_new_tokens": 40}
    if advantage == "gae":
        ppo |= {"kl_in_loss": False, "samples_per_prompt": 1}
    trainer = make_grpo_trainer(tmp_path, policy_dir, tokenizer, prompts, ppo=ppo,
                                reward_fn=noisy_reward(tokenizer), toolbox=toolbox,
                                tool_use=ToolUseArguments(tool_funcs=["tests.features.rl.test_tool_rollout:add"]))

    def script(text: str) -> str:
        a, b = (int(x) for x in text.rsplit("What is ", 1)[1].split("?")[0].split(" + "))
        return answer_from_result(call("add", f'{{"a": {a}, "b": {b}}}'))(text)

    trainer.engine = Engine(ScriptedLM(tokenizer, script), tokenizer)  # the rollouts' sampler; the policy scores them
    return trainer


def test_only_the_policys_own_tokens_train_and_the_reward_sees_the_whole_trajectory(tmp_path, policy_dir,
                                                                                    tools_tokenizer):
    SEEN.clear()
    trainer = tool_trainer(tmp_path, policy_dir, tools_tokenizer)
    r = trainer.rollout(trainer.batch_prompts(0))
    assert r.ended.all() and len(SEEN) == 8
    assert "<|im_start|>tool\n5<|im_end|>" in SEEN[0] or "<|im_start|>tool\n8<|im_end|>" in SEEN[0]
    for row in range(8):
        tokens = r.response_ids[row][r.response_mask[row].bool()]
        trained = r.action_mask[row][r.response_mask[row].bool()].bool()
        context = tools_tokenizer.decode(tokens[~trained], skip_special_tokens=False)
        answer = "5" if "2 + 3" in tools_tokenizer.decode(r.query_ids[row]) else "8"
        assert context == f"\n<|im_start|>tool\n{answer}<|im_end|>\n{HEADER}"
        assert tools_tokenizer.decode(tokens[trained], skip_special_tokens=False).endswith(
            f"The answer is {answer}.<|im_end|>")
    assert torch.equal(r.loss_mask, r.action_mask)
    zero = r.action_mask == 0
    assert (r.advantages[zero & r.response_mask.bool()] == 0).all()  # advantages only where the policy acted
    # The KL counts the policy's own tokens only: the reference and the policy agree before the first update,
    # so it is zero, and it stays zero on the inserted tokens.
    assert (r.kl[zero] == 0).all()


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_a_step_with_tool_calls_trains_and_logs_the_calls(tmp_path, policy_dir, tools_tokenizer, advantage):
    trainer = tool_trainer(tmp_path, policy_dir, tools_tokenizer, advantage)
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if "lora_" in n}
    row = trainer.train_step()
    assert row["tool_calls"] == 1.0 and row["tool_failures"] == 0.0 and row["eos_rate"] == 1.0
    assert math.isfinite(row["policy_loss"])
    assert any(not torch.equal(p, before[n]) for n, p in trainer.unwrapped.named_parameters() if n in before)


def test_the_shipped_calculator_is_exact_and_runs_no_code():
    assert [calculate(e) for e in ("347 * 29", "(12 + 7) / 4", "10 / 2", "-3 ** 2", "7 // 2")] == [
        "10063", "4.75", "5", "-9", "3"]
    toolbox = Toolbox([load_tool("tunesmith.rl.tool_funcs:calculate")])
    assert toolbox.schemas[0]["function"]["parameters"]["required"] == ["expression"]
    calls = [ToolCall("calculate", '{"expression": "__import__(\\"os\\").getcwd()"}'),
             ToolCall("calculate", '{"expression": "2 ** 100000"}')]
    results = toolbox.run(calls)
    assert all(r.failed for r in results)
    assert "not arithmetic" in results[0].text and "too large" in results[1].text


@pytest.mark.parametrize(("old", "new"), [("tunesmith.ppo.tool_funcs:multiply", "tunesmith.rl.tool_funcs"),
                                          ("tunesmith.ppo.reward_funcs:exact_answer", "tunesmith.data.reward_funcs")])
def test_a_run_config_naming_a_moved_module_still_imports_its_function_with_a_warning(old, new, caplog):
    """Run configs written before tunesmith/ppo became tunesmith/rl (the shipped tools demo's among them) name
    tunesmith.ppo.tool_funcs and tunesmith.ppo.reward_funcs: the functions still import, and the log names the new
    module."""
    import importlib

    from tunesmith.utils.imports import import_function

    name = old.rpartition(":")[2]
    with caplog.at_level("WARNING", logger="tunesmith.utils.imports"):
        assert import_function(old, "tool_funcs") is getattr(importlib.import_module(new), name)
    assert f"is now {new}" in caplog.text
