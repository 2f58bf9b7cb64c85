"""Tool calls, reasoning and log-probabilities on /v1/chat/completions, against a real `chat/serve.py`
process called with the official `openai` client.

A random model's reply cannot be a call, so the server's model here is built to write one: a Llama whose
layers add nothing (their output projections are zero), so each next token depends on the last token
only, and whose embedding and output rows chain the tokens of one known reply. After the generation
prompt it writes `REPLY` (text, then a call in tunesmith's chatml_tools format), whatever it was asked and
whether or not the prompt lists tools; after the opening the server forces for tool_choice "required" or a
named function it goes on with the rest of the same call. Refused the tag's ">", it writes a near tag,
`<tool_call*>`, and its call after it (as the tuned demo adapter did in issue #56); under tool_choice "none"
the server bans the token that would finish `<tool_call`, and the reply is text.
Greedy decoding of it is exact, and its log-probabilities are not trivial (the chosen token leads by a
margin of a few nats over 49k others)."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tests.helpers.server import running_server, wait_until_healthy
from tunesmith.data.call_scores import first_call
from tunesmith.data.template import apply_chat_template_override, encode_prompt, render_text
from tunesmith.data.tool_calls import CallFormat, parse_calls
from tunesmith.generation.bans import Bans
from tunesmith.serve.logprobs import TokenTexts
from tunesmith.serve.reply import BARE_CALL_STARTS, CALL_TAG_START, ReplyShape, ReplySplitter, template_text
from tunesmith.serve.tool_choice import ToolChoice

ROOT = Path(__file__).resolve().parents[3]
KEY = "test-key"

CONTENT = "☀ Let me see."
CALL = '{"name": "weather","arguments" : {"city":"Paris"} }'  # spaced so that no token repeats
REPLY = f"{CONTENT} <tool_call>{CALL}"  # the block left open: the reply ends with the end-of-turn token
ARGUMENTS = json.dumps({"city": "Paris"})  # as the server writes them: the model's object, re-serialised
TOOLS = [
    {"type": "function", "function": {"name": "weather", "description": "The weather in a city now.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HISTORY = ASK + [
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ARGUMENTS}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"},
]
# The openings the server forces for tool_choice required and {"function": {"name": "weather"}}.
REQUIRED = '<tool_call>{"name": "'
NAMED = '<tool_call>{"name": "weather", "arguments": '
MARGIN = 6.0  # nats by which the chained token leads
DETOURS = [("call", "*")]  # refused the ">" after "call", the model writes "*>" and goes on with its call


@pytest.fixture(scope="module")
def tools_tokenizer(tokenizer):
    """The real SmolLM2 tokenizer with tunesmith's chatml_tools template, as `--chat_template` installs it."""
    tok = copy.deepcopy(tokenizer)
    apply_chat_template_override(tok, "chatml_tools")
    return tok


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chain_model_dir(path: Path, tokenizer, reply: str, joins: list[tuple[str, str]],
                    detours: list[tuple[str, str]] = ()) -> str:
    """A Llama that, after each (prompt, continuation) of `joins`, greedily writes the continuation (a tail
    of `reply`) and then the end-of-turn token: each token of the reply leads to the next one, and each
    prompt's last token to the continuation's first. Each (after, then) of `detours` is a second choice,
    by half the margin: refused the token that follows the reply's token `after`, the model writes the
    token `then`, and then the refused token, and the rest of the reply after it."""
    reply_ids = _ids(tokenizer, reply) + [tokenizer.eos_token_id]
    assert len(set(reply_ids)) == len(reply_ids), tokenizer.convert_ids_to_tokens(reply_ids)  # one successor each
    following = dict(zip(reply_ids, reply_ids[1:]))
    for prompt, continuation in joins:
        start = next(k for k in range(len(reply_ids)) if tokenizer.decode(reply_ids[k:-1]) == continuation)
        last = _ids(tokenizer, prompt)[-1]
        assert following.setdefault(last, reply_ids[start]) == reply_ids[start], "the chain would branch"
    seconds = {}
    for after, then in detours:
        token = next(i for i in reply_ids if tokenizer.decode([i]) == after)
        (detour,) = _ids(tokenizer, then)
        assert detour not in following, "the detour must be a token of its own"
        following[detour], seconds[token] = following[token], detour
    torch.manual_seed(0)
    hidden = 128
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the embedding of the last token
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        tokens = sorted(set(following))
        assert len(tokens) <= hidden
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        for k, token in enumerate(tokens):  # token k's normed embedding is sqrt(hidden) times basis vector k
            embed[token] = 0
            embed[token, k] = 1
            head[following[token], k] += MARGIN / hidden ** 0.5
            if token in seconds:
                head[seconds[token], k] += MARGIN / 2 / hidden ** 0.5
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer, tools_tokenizer) -> str:
    prompt = render_text(tools_tokenizer, ASK, add_generation_prompt=True, tools=TOOLS)
    joins = [(prompt, REPLY), (prompt + REQUIRED, REPLY[REPLY.index(REQUIRED) + len(REQUIRED):]),
             (prompt + NAMED, REPLY[REPLY.index('" :') + 3:])]
    return chain_model_dir(tmp_path_factory.mktemp("chain-model"), tokenizer, REPLY, joins, DETOURS)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("serve-tools-log") / "server.log", "--model_name_or_path", model_dir,
                        "--chat_template", "chatml_tools", "--dtype", "float32", "--api_key", KEY,
                        "--served_model_name", "chain", "--do_sample", "false", "--max_new_tokens", "40") as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _call(message) -> tuple[str, str]:
    (call,) = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 10
    return call.function.name, call.function.arguments


def test_tools_render_into_the_prompt_and_the_reply_comes_back_as_a_call(client, tools_tokenizer):
    reply = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS)

    with_tools = encode_prompt(tools_tokenizer, ASK, tools=TOOLS)
    assert reply.usage.prompt_tokens == len(with_tools) > len(encode_prompt(tools_tokenizer, ASK)) + 20
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == CONTENT  # the text before the call
    assert _call(choice.message) == ("weather", ARGUMENTS)
    assert reply.usage.completion_tokens == len(_ids(tools_tokenizer, REPLY))


def test_tool_choice_none_gives_text_and_required_or_a_named_function_force_the_call(client, tools_tokenizer):
    prompt = render_text(tools_tokenizer, ASK, add_generation_prompt=True, tools=TOOLS)

    none = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="none")
    required = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="required")
    named = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "weather"}})
    cut = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, max_tokens=2,
                                         tool_choice={"type": "function", "function": {"name": "weather"}})

    # The model writes the tag's first tokens, " <", "tool", "_", but the "call" that would finish `<tool_call` is
    # banned, so the reply goes on as text; the prompt leaves the tools out.
    text = none.choices[0].message.content
    assert text.startswith(CONTENT + " <tool_") and "<tool_call" not in text, text
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    assert none.usage.prompt_tokens == len(encode_prompt(tools_tokenizer, ASK))
    for reply, opening in ((required, REQUIRED), (named, NAMED)):
        assert reply.usage.prompt_tokens == len(_ids(tools_tokenizer, prompt + opening))  # the opening is prompt
        assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
        assert _call(reply.choices[0].message) == ("weather", ARGUMENTS)
    # A forced call the model did not finish is its text, the opening put back, ended as the engine ended it.
    assert cut.choices[0].message.content == NAMED + ' {"city'
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.tool_calls is None


def test_tool_choice_none_is_text_streamed_sampled_and_beside_requests_that_call(server, client):
    """The chained model always writes the call; under tool_choice none its tag never comes, whether the reply
    is streamed, sampled, or shares the engine's batch with requests that may call."""
    whole = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="none")
    chunks = list(client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="none",
                                                 stream=True))
    sampled = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="none",
                                             temperature=0.2, seed=5, n=2)
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda choice: client.chat.completions.create(
            model="chain", messages=ASK, tools=TOOLS, tool_choice=choice), ["none", "auto"] * 3))

    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert not any(d.tool_calls for d in deltas) and chunks[-1].choices[0].finish_reason != "tool_calls"
    for choice in sampled.choices:  # at temperature 0.2 the chain holds; the tag is refused all the same
        assert choice.message.content.startswith(CONTENT + " <tool_") and "<tool_call" not in choice.message.content
    for reply, asked in zip(together, ["none", "auto"] * 3):
        message = reply.choices[0].message
        if asked == "none":
            assert message.content == whole.choices[0].message.content and message.tool_calls is None
        else:
            assert message.content == CONTENT and _call(message) == ("weather", ARGUMENTS)
    # Rows of both kinds shared a batch: 3 of each were sent, and the largest batch held more than 3 rows.
    assert httpx.get(server + "/health").json()["largest_batch"] > 3


def test_a_history_with_calls_and_their_results_is_rendered_by_the_template(client, tools_tokenizer):
    reply = client.chat.completions.create(model="chain", messages=HISTORY, tools=TOOLS)

    as_read = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18°C, sunny", "tool_call_id": "call_1", "name": "weather"}]
    expected = encode_prompt(tools_tokenizer, as_read, tools=TOOLS)
    assert reply.usage.prompt_tokens == len(expected)
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>' in tools_tokenizer.decode(
        expected) and "18°C, sunny" in tools_tokenizer.decode(expected)


def test_streamed_calls_come_in_openais_chunks_and_the_client_reassembles_them(client):
    with client.chat.completions.stream(model="chain", messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    chunks = list(client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, stream=True))

    assert final.choices[0].finish_reason == "tool_calls" and final.choices[0].message.content == CONTENT
    assert _call(final.choices[0].message) == ("weather", ARGUMENTS)
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == CONTENT
    assert sum(1 for d in deltas if d.content) > 2  # the text streamed before the call
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].index == 0 and calls[0].id.startswith("call_") and calls[0].type == "function"
    assert calls[0].function.name == "weather" and calls[0].function.arguments == ""
    assert "".join(c.function.arguments for c in calls) == ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"


def test_logprobs_are_the_models_own_with_the_top_alternatives(client, model_dir, tools_tokenizer):
    k = 3
    reply = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, logprobs=True, top_logprobs=k)
    chunks = list(client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, logprobs=True,
                                                 top_logprobs=k, stream=True))

    prompt_ids = encode_prompt(tools_tokenizer, ASK, tools=TOOLS)
    reply_ids = _ids(tools_tokenizer, REPLY)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logprobs = model(torch.tensor([prompt_ids + reply_ids])).logits[0, len(prompt_ids) - 1:-1].float().log_softmax(-1)
    content = reply.choices[0].logprobs.content
    assert [c.token for c in content] == [tools_tokenizer.decode([i]) for i in reply_ids]
    for entry, token, row in zip(content, reply_ids, logprobs):
        assert entry.logprob == pytest.approx(row[token].item(), abs=1e-4) and entry.logprob < -1  # not trivial
        top = row.topk(k)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [t.token for t in entry.top_logprobs] == [tools_tokenizer.decode([i]) for i in top.indices.tolist()]
    assert b"".join(bytes(c.bytes) for c in content) == REPLY.encode()  # "☀" spans tokens: their own bytes
    assert any(c.token == "\ufffd" for c in content)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert sum(1 for c in chunks if c.choices and c.choices[0].logprobs) > 2  # each chunk with its own tokens


ASKED = {"messages": ASK}
BAD_REQUESTS = [
    ("tool without a name", {**ASKED, "tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools[0].function.name", r"`tools\[0\].function.name` must be 1 to 64 letters"),
    ("tool of another type", {**ASKED, "tools": [{"type": "retrieval"}]}, "tools[0].type",
     r"`tools\[0\].type` must be 'function'"),
    ("parameters not a schema", {**ASKED, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "must be a JSON schema object"),
    ("tool message without tool_call_id", {"messages": HISTORY[:2] + [{"role": "tool", "content": "18°C"}],
                                           "tools": TOOLS}, "messages[2].tool_call_id",
     r"`messages\[2\].tool_call_id` is required"),
    ("tool_choice naming another function", {**ASKED, "tools": TOOLS,
                                             "tool_choice": {"type": "function", "function": {"name": "lunch"}}},
     "tool_choice", "names the function 'lunch', which is not in `tools` \\('weather', 'clock'\\)"),
    ("tool_choice required without tools", {**ASKED, "tool_choice": "required"}, "tool_choice",
     "needs `tools` to call"),
    ("top_logprobs without logprobs", {**ASKED, "top_logprobs": 2}, "top_logprobs",
     "`top_logprobs` needs `logprobs: true`"),
    ("top_logprobs over 20", {**ASKED, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
     r"`top_logprobs` must be in 0..20 \(got 21\)"),
]


@pytest.mark.parametrize("name, body, param, message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_tool_and_logprob_requests_get_an_openai_error(server, client, name, body, param, message):
    import re

    reply = httpx.post(server + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})

    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and re.search(message, error["message"]), error
    assert client.models.list().data  # the server goes on


CALL_TEXTS = [
    ("chatml_tools", 'Sure.\n<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
     ("Sure.", [("weather", {"city": "Oslo"})])),
    ("hermes, two calls", '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>',
     ("", [("weather", {"city": "Oslo"}), ("clock", {})])),
    ("arguments as JSON text", '<tool_call>{"name": "clock", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>',
     ("", [("clock", {"tz": "UTC"})])),
    ("left open at a stop string", '<tool_call>{"name": "clock", "arguments": {"tz": "é"}}',
     ("", [("clock", {"tz": "é"})])),
    ("llama 3, bare", '{"name": "weather", "parameters": {"city": "Oslo"}}', ("", [("weather", {"city": "Oslo"})])),
    ("bare list", ' [{"name": "clock", "arguments": {}}]', ("", [("clock", {})])),
    ("unknown function", '<tool_call>{"name": "lunch", "arguments": {}}</tool_call>', None),
    ("broken JSON", '<tool_call>{"name": "clock", "arguments": {</tool_call>', None),
    ("arguments not an object", '<tool_call>{"name": "clock", "arguments": [1]}</tool_call>', None),
    ("bare JSON answer, no arguments", '{"name": "clock"}', None),
    ("plain text", "It is sunny {mostly}.", None),
]


@pytest.mark.parametrize("text, expected", [c[1:] for c in CALL_TEXTS], ids=[c[0] for c in CALL_TEXTS])
def test_calls_are_parsed_from_the_formats_templates_teach(text, expected):
    parsed = parse_calls(text, ["weather", "clock"])

    if expected is None:
        assert parsed is None
        return
    content, calls = parsed
    assert (content, [(c.name, json.loads(c.arguments)) for c in calls]) == expected
    assert len({c.id for c in calls}) == len(calls)


def test_the_forced_opening_follows_the_templates_call_format(tools_tokenizer):
    chatml = CallFormat.of(template_text(tools_tokenizer))
    hermes = CallFormat.of("{{- '<tool_call>\\n' + tool_call | tojson + '\\n</tool_call>' }}")
    llama = CallFormat.of("""{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}""")

    assert chatml.opening(ToolChoice("required")) == REQUIRED
    assert chatml.opening(ToolChoice("function", "weather")) == NAMED
    assert hermes.opening(ToolChoice("required")) == '<tool_call>\n{"name": "'
    assert llama.opening(ToolChoice("function", "f")) == '{"name": "f", "parameters": '
    assert CallFormat.of(template_text(tools_tokenizer)).opening(ToolChoice("function", 'say "hi"')).endswith(
        '{"name": "say \\"hi\\"", "arguments": ')


def test_tool_choice_none_bans_the_call_opening_of_the_templates_format(tools_tokenizer):
    chatml, none = template_text(tools_tokenizer), ToolChoice("none")
    hermes = "{{- '<tool_call>\\n' + tool_call | tojson + '\\n</tool_call>' }}"
    llama = """{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}"""

    for template in (chatml, hermes):  # the tag's opening and whatever follows it, anywhere in the reply
        shape = ReplyShape.of(template, "", TOOLS, none)
        assert (shape.banned, shape.banned_openings, shape.names) == (("<tool_call",), (), None)
    bare = ReplyShape.of(llama, "", TOOLS, none)  # a bare JSON call: its opening, at the reply's start
    assert (bare.banned, bare.banned_openings) == ((), ('{"name"', '[{"name"'))
    for shape in (ReplyShape.of(chatml, "", TOOLS, ToolChoice()), ReplyShape.of(chatml, "", None, none),
                  ReplyShape.of(chatml, "", TOOLS, ToolChoice("required"))):
        assert shape.banned == shape.banned_openings == ()  # auto, no tools, or a forced call: nothing banned


ASKED_AROUND = [ASK, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Is it cold in Montreal?"}],
                HISTORY]


def _none_contents(client, messages: list[dict]) -> list[str]:
    """The content of a tool_choice none reply to `messages`, whole and streamed (its deltas joined)."""
    whole = client.chat.completions.create(model="chain", messages=messages, tools=TOOLS, tool_choice="none")
    chunks = list(client.chat.completions.create(model="chain", messages=messages, tools=TOOLS, tool_choice="none",
                                                 stream=True))
    assert whole.choices[0].message.tool_calls is None and not any(c.choices[0].delta.tool_calls for c in chunks)
    return [whole.choices[0].message.content, "".join(c.choices[0].delta.content or "" for c in chunks)]


def test_tool_choice_none_leaves_the_tools_out_and_a_model_tuned_to_call_answers_in_text(client, tools_tokenizer):
    """Issue #56: the model calls whatever it is asked, and refused the exact tag writes `<tool_call*>` and its
    call after it; under "none" neither the tag's opening nor a call's JSON reaches the content."""
    for messages in ASKED_AROUND:
        auto = client.chat.completions.create(model="chain", messages=messages, tools=TOOLS)
        assert _call(auto.choices[0].message) == ("weather", ARGUMENTS)  # the control: left free, it calls

        for content in _none_contents(client, messages):
            assert content.startswith(CONTENT) and CALL_TAG_START not in content, content
            assert first_call(content) is None and '"name"' not in content, content
    none = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="none")
    assert none.usage.prompt_tokens == len(encode_prompt(tools_tokenizer, ASK))  # the prompt lists no tools


def test_keep_tools_when_tool_choice_none_lists_them_and_still_bans_the_call(model_dir, tools_tokenizer,
                                                                             tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("serve-keep-tools") / "server.log", "--model_name_or_path",
                        model_dir, "--chat_template", "chatml_tools", "--dtype", "float32", "--api_key", KEY,
                        "--served_model_name", "chain", "--do_sample", "false", "--max_new_tokens", "40",
                        "--keep_tools_when_tool_choice_none", "true") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        none = client.chat.completions.create(model="chain", messages=ASK, tools=TOOLS, tool_choice="none")
        contents = _none_contents(client, ASK)

    assert none.usage.prompt_tokens == len(encode_prompt(tools_tokenizer, ASK, tools=TOOLS))
    assert contents[0] == contents[1] == none.choices[0].message.content
    assert contents[0].startswith(CONTENT + " <tool_") and CALL_TAG_START not in contents[0], contents[0]


def _spellings(vocabulary: frozenset[str], text: str) -> list[list[str]]:
    """Every way to write `text` as a sequence of the vocabulary's token texts."""
    if not text:
        return [[]]
    return [[text[:k], *rest] for k in range(1, len(text) + 1) if text[:k] in vocabulary
            for rest in _spellings(vocabulary, text[k:])]


def _refused(bans: Bans, ids: dict[str, int], pieces: list[str], anywhere=(), openings=()) -> bool:
    """Whether one of the pieces (token texts, in order) is banned after the text before it."""
    text = ""
    for piece in pieces:
        if ids[piece] in bans.tokens(text, anywhere, openings):
            return True
        text += piece
    return False


BAN_CASES = [  # (the text a model would write, whether it holds what tool_choice none bans)
    ("anywhere", "<tool_call>", True), ("anywhere", " <tool_call*>", True), ("anywhere", "Sure.<tool_calls>", True),
    ("anywhere", "\n<tool_call>\n{", True), ("anywhere", "ok <tool_call", True),
    ("anywhere", "a tool call is", False), ("anywhere", "<tool> tool_call", False), ("anywhere", "</tool_call>", False),
    ("anywhere", "<tool_cal", False), ("anywhere", "< tool_call", False),
    ("openings", '{"name":', True), ("openings", ' { "name"', True), ("openings", '[{"name"', True),
    ("openings", '\n{\n  "name"', True), ("openings", '{"city"', False), ("openings", 'Sure: {"name"', False),
    ("openings", "name", False),
]


@pytest.mark.parametrize("where, text, banned", BAN_CASES, ids=[f"{w}:{t!r}" for w, t, _ in BAN_CASES])
def test_the_ban_of_tool_choice_none_refuses_every_spelling_of_a_call_and_nothing_else(tokenizer, where, text,
                                                                                        banned):
    """With SmolLM2's real vocabulary, every sequence of tokens that spells `text` (a greedy model may take
    any) has a token the ban refuses when `text` holds the call tag's opening, or opens as a bare JSON call;
    none when it does not."""
    bans = Bans.of(tokenizer)
    ids = {t: i for i, t in enumerate(bans.texts())}
    rules = {"anywhere": (CALL_TAG_START,)} if where == "anywhere" else {"openings": BARE_CALL_STARTS}
    spellings = _spellings(frozenset(ids), text)

    assert len(spellings) > 1 or len(text) < 2
    refused = [_refused(bans, ids, pieces, **rules) for pieces in spellings]
    assert refused == [banned] * len(spellings), [p for p, r in zip(spellings, refused) if r != banned]


THINKING = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")


def _split(shape: ReplyShape, text: str, seed: int = 0) -> tuple[dict, object]:
    """The deltas of `text` fed in random pieces, joined per field, and the whole reply."""
    rng, splitter, joined, at = random.Random(seed), ReplySplitter(shape), {}, 0
    while at < len(text):
        step = rng.randint(1, 4)
        for delta in splitter.feed(text[at:at + step]):
            for key, value in delta.items():
                joined[key] = joined.get(key, "") + value
        at += step
    rest, reply = splitter.finish()
    for delta in rest:
        for key, value in delta.items():
            joined[key] = joined.get(key, "") + value
    return joined, reply


def test_reasoning_is_split_from_the_reply_when_the_template_thinks(tokenizer):
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING
    prompt = render_text(thinking, ASK, add_generation_prompt=True)
    opened = ReplyShape.of(template_text(thinking), prompt, None, ToolChoice())
    in_reply = ReplyShape.of("... <think> ...", "<|im_start|>assistant\n", None, ToolChoice())
    plain = ReplyShape.of(template_text(tokenizer), "<|im_start|>assistant\n", None, ToolChoice())

    assert opened.opened and in_reply.reasoning and not in_reply.opened and not plain.reasoning
    for shape, text in ((opened, "The user asks about Paris.\n</think>\n\nIt is sunny."),
                        (in_reply, "<think>\nThe user asks about Paris.\n</think>\n\nIt is sunny.")):
        for seed in range(20):
            joined, reply = _split(shape, text, seed)
            assert reply.message() == {"content": "It is sunny.", "reasoning_content": "The user asks about Paris."}
            assert joined == {"reasoning_content": "The user asks about Paris.", "content": "It is sunny."}
    assert _split(plain, "<think>x</think>y")[1].message() == {"content": "<think>x</think>y"}
    assert _split(opened, "cut off while thinking")[1].message() == {"content": "",
                                                                     "reasoning_content": "cut off while thinking"}


@pytest.mark.parametrize("text", [REPLY, "<think>hmm</think>" + REPLY, "{not a call} but text ", "a < b <tool"])
def test_streamed_deltas_join_to_the_whole_reply(text):
    shape = ReplyShape(reasoning=True, names=("weather",))
    whole = _split(shape, text, seed=99)[1]
    for seed in range(30):
        joined, reply = _split(shape, text, seed)
        assert joined.get("content", "") == (reply.content or "") and joined.get("reasoning_content") == reply.reasoning
        assert reply.content == whole.content and [c.arguments for c in reply.calls] == [c.arguments for c in whole.calls]
    assert (whole.content, len(whole.calls)) == ((CONTENT, 1) if REPLY in text else (text, 0))


def test_a_tokens_bytes_are_its_own_even_inside_a_character(tokenizer):
    texts = TokenTexts(tokenizer)
    text = "Café ☀ 你好 <|im_end|>"
    ids = _ids(tokenizer, text)

    entries = [texts.entry(i, -1.0) for i in ids]

    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode()
    assert any(e["token"] == "\ufffd" for e in entries)  # a piece of a character decodes to U+FFFD alone
    assert entries[-1] == {"token": "<|im_end|>", "logprob": -1.0, "bytes": list(b"<|im_end|>")}


@pytest.fixture(scope="session")
def tool_adapter(tmp_path_factory, default_model_path) -> str:
    """The tool demo's LoRA adapter on SmolLM2-135M-Instruct: TUNESMITH_TOOL_ADAPTER when set (say, the one
    `scripts/tool_demo.sh` left in outputs/sft_tools_demo), else trained here as configs/sft_tools_demo.yaml
    trains it (minutes on a CPU), once per session."""
    given = os.environ.get("TUNESMITH_TOOL_ADAPTER")
    if given:
        return given
    from tunesmith.sft.command import run as sft_main

    out = tmp_path_factory.mktemp("sft-tools-demo")
    sft_main([str(ROOT / "configs" / "sft_tools_demo.yaml"), "--data_path", str(ROOT / "data/demo/tools.jsonl"),
              "--output_dir", str(out)])
    return str(out)


@pytest.mark.slow
@pytest.mark.heavy
def test_a_langchain_agent_calls_a_tool_and_answers_from_its_result(tool_adapter, tmp_path):
    """One agent round through LangChain's ChatOpenAI against the tuned adapter: the question, the model's
    call, the tool's result as a ToolMessage, the model's answer from it."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city"""
        return json.dumps({"city": city, "temperature_c": 21, "conditions": "cloudy"})

    # The demo's other two functions, as its conversations offer them beside get_weather.
    others = [t for t in json.loads((ROOT / "data/demo/tools.jsonl").open().readline())["tools"]
              if t["function"]["name"] != "get_weather"]
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        # The adapter's folder carries the chatml_tools template it trained with; the flag says it anyway.
        proc = subprocess.Popen([sys.executable, str(ROOT / "chat" / "serve.py"), "--model_name_or_path", tool_adapter,
                                 "--chat_template", "chatml_tools", "--port", "0", "--dtype", "float32", "--api_key", KEY,
                                 "--served_model_name", "tools", "--do_sample", "false"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        url = wait_until_healthy(proc, log, timeout=300)
        llm = ChatOpenAI(base_url=url + "/v1", api_key=KEY, model="tools", temperature=0, max_tokens=60,
                         max_retries=0).bind_tools([get_weather, *others])
        messages = [HumanMessage("What's the weather in Paris?")]

        call = llm.invoke(messages)
        assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_weather", {"city": "Paris"})], call
        assert call.response_metadata["finish_reason"] == "tool_calls"
        messages += [call, ToolMessage(get_weather.invoke(call.tool_calls[0]["args"]),
                                       tool_call_id=call.tool_calls[0]["id"])]
        answer = llm.invoke(messages)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not answer.tool_calls and answer.response_metadata["finish_reason"] == "stop", answer
    assert "21" in answer.content and "Paris" in answer.content, answer.content
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.heavy
def test_tool_choice_none_on_the_tool_demo_adapter_answers_in_words(tool_adapter, tmp_path):
    """Issue #56 as it was found: the tool demo's adapter (tuned to answer these questions with a call), served,
    asked through the openai client with the tools given: "auto" calls (the control: the adapter would call), and
    "none", streamed and not, gives content with no call tag, no call JSON and no tool_calls."""
    demo_tools = json.loads((ROOT / "data/demo/tools.jsonl").open().readline())["tools"]
    questions = ["What's the weather in Montreal?", "Tell me the local time in Dublin.", "Convert 100 EUR to INR."]
    log = tmp_path / "server.log"
    with running_server(log, "--model_name_or_path", tool_adapter, "--chat_template", "chatml_tools", "--dtype",
                        "float32", "--api_key", KEY, "--served_model_name", "tools", "--do_sample", "false",
                        "--max_new_tokens", "60") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        for question in questions:
            messages = [{"role": "user", "content": question}]
            auto = client.chat.completions.create(model="tools", messages=messages, tools=demo_tools)
            assert auto.choices[0].message.tool_calls, (question, auto.choices[0].message)
            whole = client.chat.completions.create(model="tools", messages=messages, tools=demo_tools,
                                                   tool_choice="none")
            chunks = list(client.chat.completions.create(model="tools", messages=messages, tools=demo_tools,
                                                         tool_choice="none", stream=True))
            assert whole.choices[0].message.tool_calls is None
            assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            for content in (whole.choices[0].message.content or "", streamed):
                assert content.strip(), (question, content)  # words, not an empty reply
                assert "<tool_call" not in content and '"name"' not in content and first_call(content) is None, (
                    question, content)
