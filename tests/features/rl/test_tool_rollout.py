"""Agent rollouts with tools (tunesmith/rl/toolbox.py, tunesmith/rl/tool_rollout.py), on the real SmolLM2 tokenizer
with tunesmith's chatml_tools template and the one generation engine.

The engine's model is scripted: after each assistant header it writes the reply `script(conversation so far)`
returns, then the end-of-turn token. It reads each row's whole history back from the KV cache, whose keys are
the token ids themselves, so it answers the conversation it is really given (a tool's result included)
whatever the batch does around it: rows joining, leaving, left-padded."""

from __future__ import annotations

import copy
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import GenerationConfig
from transformers.utils import get_json_schema

from tunesmith.data.formats import Row
from tunesmith.data.prompts import Prompt
from tunesmith.data.template import apply_chat_template_override, encode_prompt, render_text
from tunesmith.errors import ConfigError, DataError, TemplateError
from tunesmith.generation import Engine
from tunesmith.rl.rollout import rollout_sampling
from tunesmith.rl.tool_rollout import (
    LENGTH,
    MAX_TOOL_CALLS,
    STOP,
    continuation_ids,
    encode_tool_prompts,
    tool_rollout,
)
from tunesmith.rl.toolbox import Tool, Toolbox, load_tool, result_text

HEADER = "<|im_start|>assistant\n"
RAN: list[tuple] = []  # the calls the tools below received, in order

HERE = "tests.features.rl.test_tool_rollout"  # this module, as --tool_funcs names it (package.module)


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    RAN.append(("add", a, b))
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    RAN.append(("divide", a, b))
    return a / b


def sleepy(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return "awake"


def undocumented(a: int) -> int:
    return a


def unhinted(a):
    """Echo.

    Args:
        a: Anything.
    """
    return a


NOT_A_FUNCTION = 3


class ScriptedLM(nn.Module):
    """A causal LM for the engine that, after the last `<|im_start|>assistant\\n` of a row, writes
    `script(the text up to and including that header)` and then <|im_end|>. Each row's history is the
    cache's keys (token ids) where the attention mask is 1."""

    def __init__(self, tokenizer, script) -> None:
        super().__init__()
        self.tokenizer, self.script = tokenizer, script
        self.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        self.anchor = nn.Parameter(torch.zeros(1))
        self.header = tokenizer(HEADER, add_special_tokens=False)["input_ids"]

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def next_token(self, history: list[int]) -> int:
        n = len(self.header)
        start = max(k + n for k in range(len(history) - n + 1) if history[k:k + n] == self.header)
        reply = self.script(self.tokenizer.decode(history[:start], skip_special_tokens=False))
        target = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        written = history[start:]
        return target[len(written)] if target[:len(written)] == written and len(written) < len(target) \
            else self.tokenizer.eos_token_id

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True, logits_to_keep=0,
                **_):
        if cache is None:  # the idle forward of a ZeRO-3 rank whose rows are done
            return SimpleNamespace(logits=torch.zeros(input_ids.size(0), 1, len(self.tokenizer)))
        keys = input_ids.float()[:, None, :, None]
        history = cache.update(keys, keys, 0)[0][:, 0, :, 0].long()
        logits = torch.full((input_ids.size(0), 1, len(self.tokenizer)), -30.0)
        for b in range(input_ids.size(0)):
            logits[b, 0, self.next_token(history[b][attention_mask[b].bool()].tolist())] = 30.0
        return SimpleNamespace(logits=logits)


@pytest.fixture(scope="module")
def tools_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    apply_chat_template_override(tok, "chatml_tools")
    return tok


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def last_tool_result(text: str) -> str | None:
    found = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text, re.S)
    return found[-1] if found else None


def answer_from_result(first_reply: str):
    """The model's script: `first_reply` to the question; after a tool result, `The answer is <result>.`"""
    def script(text: str) -> str:
        result = last_tool_result(text)
        return first_reply if result is None else f"The answer is {result}."
    return script


def prompts_for(tokenizer, toolbox, *questions: str, **row_fields) -> list[Prompt]:
    prompts = [Prompt(Row("q.jsonl", k + 1, {"prompt": q, **row_fields}), [{"role": "user", "content": q}])
               for k, q in enumerate(questions)]
    return encode_tool_prompts(tokenizer, prompts, toolbox, max_length=1024)


def rollout(tokenizer, script, questions, toolbox, max_tool_calls=3, max_new_tokens=48, **kwargs):
    engine = Engine(ScriptedLM(tokenizer, script), tokenizer)
    prompts = prompts_for(tokenizer, toolbox, *questions)
    return tool_rollout(engine, tokenizer, prompts, rollout_sampling(max_new_tokens, greedy=True), toolbox,
                        max_tool_calls, **kwargs)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def pieces(tokenizer, trajectory, trained: bool) -> str:
    return tokenizer.decode([t for t, m in zip(trajectory.token_ids, trajectory.trained) if m == trained],
                            skip_special_tokens=False)


# --------------------------------------------------------------------------- the loop


def test_a_call_runs_and_the_model_answers_from_its_result(tools_tokenizer):
    RAN.clear()
    toolbox = Toolbox([load_tool(f"{HERE}:add")])
    [t] = rollout(tools_tokenizer, answer_from_result(call("add", '{"a": 2, "b": 3}')), ["What is 2 + 3?"], toolbox)
    assert RAN == [("add", 2, 3)]
    assert (t.finish_reason, t.ended, t.tool_calls, t.failed_calls, t.respliced) == (STOP, True, 1, 0, 0)
    assert [m["role"] for m in t.new_messages] == ["assistant", "tool", "assistant"]
    assert t.new_messages[1]["content"] == "5" and t.new_messages[2]["content"] == "The answer is 5."
    # The tokens are the conversation's rendering, up to the last reply's end-of-turn token.
    whole = ids(tools_tokenizer, render_text(tools_tokenizer, t.messages, tools=toolbox.schemas))
    assert t.prompt_ids + t.token_ids == whole[:len(t.prompt_ids) + len(t.token_ids)]
    assert tools_tokenizer.decode(whole[len(t.prompt_ids) + len(t.token_ids):]) == "\n"
    # Trained: exactly the two replies and their end-of-turn tokens; the result and the headers are not.
    assert pieces(tools_tokenizer, t, True) == call("add", '{"a": 2, "b": 3}') + "<|im_end|>The answer is 5.<|im_end|>"
    assert pieces(tools_tokenizer, t, False) == "\n<|im_start|>tool\n5<|im_end|>\n" + HEADER
    assert len(t.trained) == len(t.token_ids)


def test_the_prompt_lists_the_functions_schemas(tools_tokenizer):
    toolbox = Toolbox([load_tool(f"{HERE}:add"), load_tool(f"{HERE}:divide")])
    [t] = rollout(tools_tokenizer, lambda text: "No tools needed.", ["Hi"], toolbox)
    prompt = tools_tokenizer.decode(t.prompt_ids)
    assert '"name": "add"' in prompt and '"description": "Divide a by b."' in prompt
    assert t.prompt_ids == encode_prompt(tools_tokenizer, [{"role": "user", "content": "Hi"}], toolbox.schemas)
    assert (t.finish_reason, t.tool_calls, pieces(tools_tokenizer, t, False)) == (STOP, 0, "")


def test_a_call_written_unlike_the_template_keeps_the_sampled_tokens(tools_tokenizer):
    """The model writes compact JSON; the template re-serialises the call with spaces. The trajectory keeps the
    model's tokens (they are what it produced and what trains), and the template's text after that turn's end."""
    compact = '<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'
    toolbox = Toolbox([load_tool(f"{HERE}:add")])
    [t] = rollout(tools_tokenizer, answer_from_result(compact), ["What is 2 + 3?"], toolbox)
    assert (t.finish_reason, t.tool_calls, t.respliced) == (STOP, 1, 1)
    assert pieces(tools_tokenizer, t, True) == compact + "<|im_end|>The answer is 5.<|im_end|>"
    rendered = render_text(tools_tokenizer, t.messages, tools=toolbox.schemas)
    assert call("add", '{"a": 2, "b": 3}') in rendered  # the template's spelling differs from the model's
    seen = tools_tokenizer.decode(t.prompt_ids + t.token_ids, skip_special_tokens=False)
    assert seen + "\n" == rendered.replace(call("add", '{"a": 2, "b": 3}'), compact)
    assert t.token_ids[:len(ids(tools_tokenizer, compact)) + 1] == ids(tools_tokenizer, compact) + [
        tools_tokenizer.eos_token_id]


def test_errors_and_timeouts_become_the_tool_messages_text(tools_tokenizer):
    toolbox = Toolbox([load_tool(f"{HERE}:divide"), load_tool(f"{HERE}:sleepy"),
                       load_tool(f"{HERE}:add")], timeout=0.3)
    replies = {"a": call("divide", '{"a": 1, "b": 0}'), "b": call("sleepy", '{"seconds": 5}'),
               "c": call("add", '{"a": "two", "b": 3}'), "d": call("add", '{"a": 1, "c": 3}')}

    def script(text: str) -> str:
        question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text)[-1]
        return replies[question] if last_tool_result(text) is None else "Sorry."

    began = time.monotonic()
    trajectories = rollout(tools_tokenizer, script, list(replies), toolbox)
    assert time.monotonic() - began < 3  # the sleeping call was not waited for
    results = [t.new_messages[1]["content"] for t in trajectories]
    assert results == ["error: ZeroDivisionError: division by zero", "error: sleepy did not finish within 0.3 seconds",
                       'error: bad arguments for add: `a` must be integer, got "two"',
                       "error: bad arguments for add: missing b; no parameter c"]
    assert all((t.tool_calls, t.failed_calls, t.finish_reason) == (1, 1, STOP) for t in trajectories)


def test_max_tool_calls_ends_the_loop(tools_tokenizer):
    RAN.clear()
    toolbox = Toolbox([load_tool(f"{HERE}:add")])
    [t] = rollout(tools_tokenizer, lambda text: call("add", '{"a": 1, "b": 1}'), ["Again and again"], toolbox,
                  max_tool_calls=2)
    assert len(RAN) == 2 and (t.tool_calls, t.finish_reason, t.ended) == (2, MAX_TOOL_CALLS, True)
    assert [m["role"] for m in t.new_messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert t.new_messages[-1]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1, "b": 1}}
    assert t.trained[-1] and t.token_ids[-1] == tools_tokenizer.eos_token_id  # ends with the asking reply's end


def test_the_trajectory_budget_and_the_turn_limit_cut(tools_tokenizer):
    toolbox = Toolbox([load_tool(f"{HERE}:add")])
    looping = lambda text: call("add", '{"a": 1, "b": 1}')  # noqa: E731
    [t] = rollout(tools_tokenizer, looping, ["Loop"], toolbox, max_tool_calls=10, max_trajectory_tokens=60)
    assert t.finish_reason == LENGTH and not t.ended and len(t.token_ids) <= 60 and 1 <= t.tool_calls < 10
    [t] = rollout(tools_tokenizer, looping, ["Loop"], toolbox, max_new_tokens=5)  # a call cut short is no call
    assert (t.finish_reason, t.tool_calls, len(t.token_ids), all(t.trained)) == (LENGTH, 0, 5, True)


def test_rows_continue_independently_in_one_batch(tools_tokenizer):
    toolbox = Toolbox([load_tool(f"{HERE}:add")])

    def script(text: str) -> str:
        calls = text.count("<|im_start|>tool")
        if "direct" in text:
            return "Four."
        return call("add", f'{{"a": {calls}, "b": 1}}') if calls < 2 else "Done."

    engine = Engine(ScriptedLM(tools_tokenizer, script), tools_tokenizer)
    sizes = []
    generate = engine.generate
    engine.generate = lambda prompts, *a, **k: sizes.append(len(prompts)) or generate(prompts, *a, **k)
    prompts = prompts_for(tools_tokenizer, toolbox, "Count twice", "direct answer", "Count twice too")
    direct, *counting = tool_rollout(engine, tools_tokenizer, [prompts[1], prompts[0], prompts[2]],
                                     rollout_sampling(48, greedy=True), toolbox, max_tool_calls=4)
    assert sizes == [3, 2, 2]
    assert (direct.tool_calls, direct.new_messages[-1]["content"]) == (0, "Four.")
    for t in counting:
        assert [m["content"] for m in t.new_messages if m["role"] == "tool"] == ["1", "2"]
        assert (t.tool_calls, t.new_messages[-1]["content"], t.respliced) == (2, "Done.", 0)


def _synced_rank(rank: int, port: int, model_path: str, out: str) -> None:
    """One of two ranks of a synced engine (as under ZeRO-3): rank 0's row calls twice, rank 1's answers at once."""
    import json
    import os

    import torch.distributed as dist

    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import load_tokenizer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        tok = load_tokenizer(ModelArguments(model_name_or_path=model_path))
        apply_chat_template_override(tok, "chatml_tools")
        toolbox = Toolbox([load_tool(f"{HERE}:add")])
        script = lambda text: ("Four." if "direct" in text else  # noqa: E731
                               call("add", '{"a": 1, "b": 1}') if text.count("<|im_start|>tool") < 2 else "Done.")
        engine = Engine(ScriptedLM(tok, script), tok, synced=True)
        prompts = prompts_for(tok, toolbox, "Count twice" if rank == 0 else "direct answer")
        [t] = tool_rollout(engine, tok, prompts, rollout_sampling(48, greedy=True), toolbox, 4)
        Path(out, f"rank{rank}.json").write_text(json.dumps([t.tool_calls, t.new_messages[-1]["content"]]))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_synced_ranks_run_as_many_rounds_as_the_busiest(tmp_path, default_model_path):
    """Under ZeRO-3 every forward is collective: the rank whose row is done after one round keeps stepping
    (idle forwards) while the other's row calls its tools, and both finish."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_synced_rank, args=(port, default_model_path, str(tmp_path)), nprocs=2, start_method="spawn")
    assert json.loads((tmp_path / "rank0.json").read_text()) == [2, "Done."]
    assert json.loads((tmp_path / "rank1.json").read_text()) == [0, "Four."]


def test_prompts_must_be_encoded_with_their_tools(tools_tokenizer):
    toolbox = Toolbox([load_tool(f"{HERE}:add")])
    messages = [{"role": "user", "content": "Hi"}]
    plain = Prompt(Row("q.jsonl", 1, {"prompt": "Hi"}), messages, tuple(encode_prompt(tools_tokenizer, messages)))
    engine = Engine(ScriptedLM(tools_tokenizer, lambda text: "Hello."), tools_tokenizer)
    with pytest.raises(ValueError, match=r"q.jsonl:line 1: the prompt's input_ids are not its rendering with its "
                                         r"tools; encode the prompts with encode_tool_prompts"):
        tool_rollout(engine, tools_tokenizer, [plain], rollout_sampling(8, greedy=True), toolbox, 2)
    [fitted] = encode_tool_prompts(tools_tokenizer, [plain], toolbox, max_length=1024)
    assert list(fitted.input_ids) == encode_prompt(tools_tokenizer, messages, toolbox.schemas)
    assert encode_tool_prompts(tools_tokenizer, [plain], toolbox, max_length=20) == []  # the tools alone are longer


def test_a_rows_own_tools_are_offered_and_must_be_loaded(tools_tokenizer):
    toolbox = Toolbox([load_tool(f"{HERE}:add"), load_tool(f"{HERE}:divide")])
    own = [{"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    [prompt] = prompts_for(tools_tokenizer, toolbox, "What is 2 + 3?", tools=own)
    assert toolbox.offered(prompt) == own and '"description": "Adds."' in tools_tokenizer.decode(prompt.input_ids)
    assert "divide" not in tools_tokenizer.decode(prompt.input_ids)
    stranger = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    with pytest.raises(DataError, match=r"q.jsonl:line 1: field `tools`: offers get_time, which no --tool_funcs "
                                        r"function provides \(loaded: add, divide\)"):
        prompts_for(tools_tokenizer, toolbox, "Time?", tools=stranger)


def test_a_template_that_shows_no_tools_is_refused(tokenizer, tools_tokenizer):
    """SmolLM2's own template ignores `tools`: the policy would never see the functions."""
    toolbox = Toolbox([load_tool(f"{HERE}:add")])
    with pytest.raises(TemplateError, match="does not render tools .*--chat_template chatml_tools"):
        prompts_for(tokenizer, toolbox, "What is 2 + 3?")
    no_calls = copy.deepcopy(tools_tokenizer)
    no_calls.chat_template = no_calls.chat_template.replace("message['tool_calls'] or []", "[]")
    with pytest.raises(TemplateError, match=r"does not render the assistant's tool calls \(a call turn renders as an "
                                            r"empty reply\)"):
        prompts_for(no_calls, toolbox, "What is 2 + 3?")


def test_a_template_that_rewrites_the_turns_before_a_call_is_refused(tools_tokenizer):
    tok = copy.deepcopy(tools_tokenizer)
    tok.chat_template = "{{ messages | length }}" + tok.chat_template  # every render differs from the one before
    messages = [{"role": "user", "content": "2 + 3?"}]
    sampled = {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2}}}]}
    so_far = encode_prompt(tok, messages) + ids(tok, '<tool_call>{"name":"add","arguments":{"a":2}}</tool_call>') + [
        tok.eos_token_id]
    with pytest.raises(TemplateError, match="cannot continue a conversation after a tool call: rendered with the tool "
                                            "results, the turns before the call change"):
        continuation_ids(tok, [*messages, sampled], [{"role": "tool", "content": "5"}], None, so_far, tok.eos_token_id)


# --------------------------------------------------------------------------- functions as tools


def test_a_function_becomes_the_schema_transformers_writes():
    tool = load_tool(f"{HERE}:add")
    assert tool.name == "add" and tool.fn is add and tool.schema == get_json_schema(add)
    assert tool.schema["function"]["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(("spec", "message"), [
    ("add", r"--tool_funcs add: expected package.module:function"),
    ("no_such_module_here:f", r"--tool_funcs no_such_module_here:f: cannot import no_such_module_here \(No module "
                              r"named 'no_such_module_here'\); is its folder on PYTHONPATH\?"),
    (f"{HERE}:subtract", rf"--tool_funcs {HERE}:subtract: {HERE} has no function 'subtract' \(it has: .*\badd\b.*\)"),
    (f"{HERE}:NOT_A_FUNCTION", r"test_tool_rollout.NOT_A_FUNCTION is a int, not a function"),
    (f"{HERE}:undocumented", rf"--tool_funcs {HERE}:undocumented: cannot describe it to the model: .*no docstring.* "
                             r"\(give it a docstring"),
    (f"{HERE}:unhinted", r"cannot describe it to the model: Argument a is missing a type hint"),
])
def test_a_function_that_cannot_be_a_tool_is_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_tool(spec)


def test_two_functions_of_one_name_are_refused():
    with pytest.raises(ConfigError, match=rf"--tool_funcs {HERE}:add and other:add: two functions named 'add'"):
        Toolbox([load_tool(f"{HERE}:add"), Tool("other:add", add, get_json_schema(add))])


def test_a_calls_result_is_text():
    assert [result_text(v) for v in ("plain", 5, 2.5, None, True, {"t": "18°C"}, [1, 2])] == [
        "plain", "5", "2.5", "null", "true", '{"t": "18°C"}', "[1, 2]"]
    assert result_text(object).startswith("<class")
    tool = load_tool(f"{HERE}:add")
    assert tool('{"a": 1, "b": 2}').text == "3" and not tool({"a": 1, "b": 2}).failed
    assert tool("[1]").text == "error: the arguments must be a JSON object, not list"
    assert tool("{oops").text.startswith("error: the arguments are not JSON")
    assert tool({"a": True, "b": 2}).text == "error: bad arguments for add: `a` must be integer, got true"
    assert tool({"a": 1}).text == "error: bad arguments for add: missing b"


# --------------------------------------------------------------------------- the flags and the policy evaluation


def clock() -> str:
    """The time now, where the model is."""
    RAN.append(("clock",))
    return "noon"


def saw_noon(prompts, replies, **fields) -> list[float]:
    """A reward function: 1 where the trajectory holds the clock's answer."""
    return [float("noon" in reply) for reply in replies]


def test_the_tool_flags_parse_split_and_check():
    from tunesmith.hparams import parse_run
    from tunesmith.rl.args import ToolUseArguments

    base = ["--policy", "p", "--baseline", "b", "--data_path", "q.jsonl", "--reward_funcs", "m:f"]
    tools = parse_run("eval_policy", [*base, "--tool_funcs", "m:a,m:b", "n:c"], check_paths=False).tool_use
    assert (tools.tool_funcs, tools.max_tool_calls, tools.tool_timeout, tools.max_trajectory_tokens) == (
        ["m:a", "m:b", "n:c"], 4, 10.0, None)
    assert parse_run("eval_policy", base, check_paths=False).tool_use == ToolUseArguments()
    with pytest.raises(ConfigError, match=r"--max_tool_calls and --tool_timeout given without --tool_funcs: they "
                                          r"limit the tool loop"):
        parse_run("eval_policy", [*base, "--max_tool_calls", "2", "--tool_timeout", "1"], check_paths=False)
    with pytest.raises(ConfigError, match=r"--max_tool_calls -1: must be 0 or more"):
        ToolUseArguments(["m:a"], max_tool_calls=-1)
    with pytest.raises(ConfigError, match=r"--tool_timeout 0: must be above 0"):
        ToolUseArguments(["m:a"], tool_timeout=0)


def test_eval_policy_runs_the_tool_loop_and_scores_the_trajectory(tmp_path, tools_tokenizer, tiny_model_dir, capsys):
    """The policy calls the clock after every assistant header (a chain model, test_serve_tools.py's): one call
    runs, the next one asked for ends the trajectory at --max_tool_calls 1. The reward reads the tool's result
    in the trajectory; the random baseline makes no call. Prompts are rendered with the policy's template."""
    import json

    from tests.features.serve.test_serve_tools import chain_model_dir
    from tunesmith.rl import evaluate_command as eval_policy

    reply = '<tool_call>{"name": "clock"}'  # unclosed: a chain model writes each token once
    toolbox = Toolbox([load_tool(f"{HERE}:clock")])
    asked = render_text(tools_tokenizer, [{"role": "user", "content": "Time?"}], add_generation_prompt=True,
                        tools=toolbox.schemas)
    policy = chain_model_dir(tmp_path / "policy", tools_tokenizer, reply, [(asked, reply)])
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in ("Time?", "What time is it?")))
    RAN.clear()
    result = eval_policy.run(["--baseline", tiny_model_dir, "--policy", policy, "--data_path", str(data),
                              "--reward_funcs", f"{HERE}:saw_noon", "--tool_funcs", f"{HERE}:clock",
                              "--max_tool_calls", "1", "--max_new_tokens", "12", "--output_file",
                              str(tmp_path / "e.jsonl")])
    assert (result["policy_tool_calls"], result["policy_failed_tool_calls"], result["baseline_tool_calls"]) == (2, 0, 0)
    assert (result["saw_noon_baseline"], result["saw_noon_policy"]) == (0.0, 1.0)
    assert len(RAN) >= 2  # the greedy policy's calls (its replies sampled for the KL are near random)
    rows = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [m["role"] for m in rows[0]["policy_messages"]] == ["assistant", "tool", "assistant"]
    assert rows[0]["policy_messages"][1]["content"] == "noon" and rows[0]["policy_finish"] == MAX_TOOL_CALLS
    assert "tool calls: baseline 0 (0 failed) -> policy 2 (0 failed), at most 1 per reply" in capsys.readouterr().out
