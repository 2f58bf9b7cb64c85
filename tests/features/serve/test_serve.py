"""The OpenAI-compatible server: a real `chat/serve.py` process on 127.0.0.1, called with the
official `openai` client (streaming and not) and with plain HTTP; its greedy answers equal the chat
engine's, bad requests get OpenAI's error object with a 4xx, the API key is checked, and a bounded
burst of concurrent requests is batched with every answer complete. Plus the pieces that make the
streamed text: incremental decoding and stop strings."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.server import assert_openai_error, running_server, wait_until_healthy
from tests.helpers.tiny_models import save_random_adapter
from tunesmith.data.template import encode_prompt
from tunesmith.errors import ConfigError
from tunesmith.generation import Engine, Request, SamplingParams
from tunesmith.generation.chat_session import ChatSession
from tunesmith.generation.detokenizer import IncrementalDecoder, StopMatcher
from tunesmith.generation.engine import Batch
from tunesmith.hparams import GenerationArguments, check
from tunesmith.serve.args import ServeArguments
from tunesmith.serve.rules import RULES

ROOT = Path(__file__).resolve().parents[3]
KEY = "test-key"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(chatty_model_dir, tmp_path_factory):
    """A server process on a free port (`--port 0`), its address read from its log."""
    with running_server(tmp_path_factory.mktemp("serve-log") / "server.log", "--model_name_or_path", chatty_model_dir,
                        "--dtype", "float32", "--api_key", KEY, "--served_model_name", "tiny", "--do_sample", "false",
                        "--max_new_tokens", str(MAX_TOKENS), "--batch_wait_ms", "50",
                        "--max_request_bytes", "65536") as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def engine(chatty_model_dir, tokenizer) -> ChatSession:
    model = AutoModelForCausalLM.from_pretrained(chatty_model_dir).eval()
    return ChatSession(model, tokenizer, GenerationArguments(do_sample=False, max_new_tokens=MAX_TOKENS))


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me a story about a cat."},
     {"role": "assistant", "content": "Once upon a time."}, {"role": "user", "content": "Go on, 请继续。"}],
]


def _engine_reply(engine: ChatSession, messages: list[dict]) -> str:
    engine.clear()
    engine.system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = [m for m in messages if m["role"] != "system"]
    engine.messages = turns[:-1]
    engine.turn_systems = [engine.system] * (len(turns) // 2)
    outcome = engine.handle(turns[-1]["content"])
    assert outcome.kind == "answer"
    return outcome.text


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one turn", "system and history"])
def test_streamed_and_whole_answers_equal_the_chat_engines(client, engine, tokenizer, messages):
    expected = _engine_reply(engine, messages)

    whole = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                           max_tokens=MAX_TOKENS)
    stream = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                            max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)

    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens == len(encode_prompt(tokenizer, messages))  # the training template's render
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # streamed token by token
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump() and not chunks[-1].choices


def test_models_health_stop_n_and_seed(client, server):
    assert [m.id for m in client.models.list()] == ["tiny"]
    health = httpx.get(server + "/health").json()  # no key needed
    assert health["status"] == "ok" and health["dtype"] == "float32"  # as --dtype asked

    full = client.chat.completions.create(model="tiny", messages=CONVERSATIONS[0], temperature=0)
    text = full.choices[0].message.content
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == MAX_TOKENS  # server default
    stop = text.split()[2]
    cut = client.chat.completions.create(model="tiny", messages=CONVERSATIONS[0], temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.index(stop)] and cut.choices[0].finish_reason == "stop"

    def sampled():
        reply = client.chat.completions.create(model="tiny", messages=CONVERSATIONS[0], temperature=1.0,
                                               n=2, seed=7, max_tokens=8)
        return [c.message.content for c in reply.choices]

    first = sampled()
    assert len(first) == 2 and first[0] != first[1] and sampled() == first  # n replies; a seed repeats them


BAD_REQUESTS = [
    ("missing messages", {"model": "tiny"}, 400, "`messages` is required"),
    ("unknown role", {"messages": [{"role": "bot", "content": "Hi"}]}, 400,
     r"`messages\[0\].role`: unknown role 'bot' \(expected one of system, user, assistant, tool\)"),
    ("role order", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, 400,
     r"`messages\[1\].role`: wrong role order: 'user' cannot come after 'user'"),
    ("ends with a reply", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
     400, "the last turn must be 'user' or 'tool'"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, r"`messages\[0\].content\[0\]`: pictures are not read from paths here: send the picture as a data: URL"),
    ("image for a text model", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
     400, "is a text-only model's: it cannot show these messages' images"),
    ("audio part", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     400, "content part of type 'input_audio': tunesmith reads text, image and tool_call parts"),
    ("huge max_tokens", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10**6}, 400,
     r"plus max_tokens \(1000000\) make 1000031 tokens, 997983 more than the model's context of 2048 tokens"),
    ("negative max_tokens", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": -1}, 400,
     r"`max_tokens` must be at least 1 \(got -1\)"),
    ("temperature", {"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}, 400,
     "`temperature` must be a number"),
    ("n", {"messages": [{"role": "user", "content": "Hi"}], "n": 100}, 400, r"`n` must be at most 16"),
    ("unknown field", {"messages": [{"role": "user", "content": "Hi"}], "max_token": 5}, 400,
     "unrecognized request argument supplied: max_token"),
    ("tools unrendered", {"messages": [{"role": "user", "content": "Hi"}],
                          "tools": [{"type": "function", "function": {"name": "get_weather"}}]}, 400,
     r"`tools`: this model's chat template does not render tools \(its prompt is the same without them\)"),
    ("tool calls unrendered", {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}, 400,
     "check `tool calls rendered` failed: the chat template does not render the assistant's tool calls"),
    ("too many stops", {"messages": [{"role": "user", "content": "Hi"}], "stop": [str(i) for i in range(17)]}, 400,
     r"`stop` takes at most 16 sequences \(got 17\)"),
    ("body over the limit", {"messages": [{"role": "user", "content": "x" * 70000}]}, 413,
     r"more than this server's limit of 65536 \(--max_request_bytes\)"),
    ("logit_bias", {"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"42": 5}}, 400,
     "`logit_bias` is not supported by this server"),
    ("other model", {"model": "gpt-9", "messages": [{"role": "user", "content": "Hi"}]}, 404,
     "the model 'gpt-9' does not exist here: this server serves 'tiny'"),
]


@pytest.mark.parametrize("name, body, status, message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_an_openai_error_object(server, name, body, status, message):
    reply = httpx.post(server + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(reply, status, message)


def test_bad_json_an_unknown_path_and_the_api_key(server, client):
    auth = {"Authorization": f"Bearer {KEY}"}
    bad_json = httpx.post(server + "/v1/chat/completions", content=b'{"messages": [', headers=auth)
    assert bad_json.status_code == 400 and "the request body is not valid JSON" in bad_json.json()["error"]["message"]
    nowhere = httpx.get(server + "/v1/embeddings", headers=auth)
    assert nowhere.status_code == 404 and "POST /v1/chat/completions" in nowhere.json()["error"]["message"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = httpx.post(server + "/v1/chat/completions", json={"messages": CONVERSATIONS[0]}, headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).models.list()
    assert client.models.list().data  # the server took none of it badly


NESTED = b"[" * 30000 + b"]" * 30000
RAW_BODIES = [
    ("lists 30000 deep", "/v1/chat/completions", NESTED, "the request body nests lists and objects more than 64 "
     "levels deep; send a flatter body"),
    ("lists 30000 deep, completions", "/v1/completions", NESTED, "more than 64 levels deep"),
    ("a field 100 deep", "/v1/completions", b'{"prompt": "Hi", "stop": ' + b"[" * 100 + b"]" * 100 + b"}",
     "more than 64 levels deep"),
    ("top level a list", "/v1/chat/completions", b'[{"messages": []}]', "the request body must be a JSON object, got list"),
    ("part type a list", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": [{"type": ["text"]}]}]}).encode(),
     r"`messages\[0\].content\[0\].type`: content part of type \"\['text'\]\": tunesmith reads text"),
]


@pytest.mark.parametrize("name, route, body, message", RAW_BODIES, ids=[b[0] for b in RAW_BODIES])
def test_bad_json_shapes_get_a_400_never_a_500(server, name, route, body, message):
    """Nesting past the recursion limit was a 500 with a RecursionError logged (the server's log is checked for
    tracebacks when the fixture stops); a part's type that is a list was a TypeError."""
    reply = httpx.post(server + route, content=body, headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(reply, 400, message)


def test_a_chunked_body_is_refused_once_it_passes_the_limit(server):
    """Without a Content-Length the limit used to go unchecked: the body was read and tokenized whole."""
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}]}).encode()

    def chunks():
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    reply = httpx.post(server + "/v1/chat/completions", content=chunks(), headers={"Authorization": f"Bearer {KEY}"})
    assert reply.request.headers["transfer-encoding"] == "chunked"
    error = assert_openai_error(reply, 413, r"the request body \(sent without a Content-Length\) passed 65536 bytes, "
                                r"more than this server's limit of 65536 \(--max_request_bytes\)")
    assert error["code"] == "request_too_large"
    assert httpx.get(server + "/health").json()["status"] == "ok"


LONG_JOBS = [("/v1/chat/completions", {"messages": CONVERSATIONS[0]}), ("/v1/completions", {"prompt": "Hi"})]


@pytest.mark.parametrize("route, body", LONG_JOBS, ids=["chat", "completions"])
def test_a_whole_reply_whose_client_left_stops_generating(server, route, body):
    """16 replies of 2000 tokens fill the batch for many seconds: once their client is gone they end at the
    next step, and a later small request is answered at once instead of waiting for them."""
    auth = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + route, json={**body, "max_tokens": 2000, "n": 16}, headers=auth, timeout=2)
    started = time.monotonic()
    small = httpx.post(server + route, json={**body, "max_tokens": 4}, headers=auth, timeout=60)
    assert small.status_code == 200 and time.monotonic() - started < 3
    health = httpx.get(server + "/health").json()
    assert health["running"] == 0 and health["waiting"] == 0


def test_a_burst_of_concurrent_requests_is_batched_and_every_answer_is_complete(client, server, engine):
    prompts = [[{"role": "user", "content": f"Question {i}:" + " why?" * i}] for i in range(8)]

    def ask(k: int) -> tuple[str, str, int]:
        messages, stream = prompts[k], k % 2 == 1
        reply = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                               max_tokens=MAX_TOKENS, stream=stream,
                                               stream_options={"include_usage": True} if stream else None)
        if not stream:
            return reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage.completion_tokens
        chunks = list(reply)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, [c.choices[0].finish_reason for c in chunks if c.choices][-1], chunks[-1].usage.completion_tokens

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(ask, range(len(prompts)), timeout=120))
    assert time.monotonic() - started < 120

    for k, (text, finish, tokens) in enumerate(answers):
        assert finish in ("stop", "length") and (finish == "stop" or tokens == MAX_TOKENS)
        assert text == _engine_reply(engine, prompts[k])  # left padding changed no answer
    assert httpx.get(server + "/health").json()["largest_batch"] > 1  # some were generated together


def test_rows_join_a_running_batch_and_leave_it_with_the_answers_they_get_alone(engine, tokenizer):
    model, stop_ids = engine.model, {tokenizer.eos_token_id}
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": text}])
               for text in ("A long question, " * 8, "Hi", "Why is the sky blue?")]
    lengths = [3, 10, 6]  # the long prompt leaves first: the others' left padding is cut away

    def job(k: int, texts: dict) -> Request:
        return Request(prompts[k], SamplingParams(temperature=0, max_new_tokens=lengths[k]),
                       emit=lambda event: texts.__setitem__(k, texts.get(k, "") + event.text))

    alone: dict[int, str] = {}
    for k in range(3):
        Engine(model, tokenizer).generate([prompts[k]], SamplingParams(temperature=0, max_new_tokens=lengths[k]),
                                          on_event=lambda i, event, k=k: alone.__setitem__(k, alone.get(k, "") + event.text))
    together: dict[int, str] = {}
    batch = Batch(model, tokenizer, stop_ids)
    batch.admit([job(0, together)])
    batch.step()
    batch.admit([job(1, together), job(2, together)])  # mid-generation, with prompts of other lengths
    widths = []
    while len(batch):
        batch.step()
        widths.append(batch.mask.shape[1] if len(batch) else 0)

    assert together == alone and len(alone) == 3
    assert min(w for w in widths if w) < widths[0]  # the long prompt's columns went with it
    assert len(batch) == 0 and batch.cache is None


def test_a_job_cancelled_before_it_ran_hears_its_end(engine, tokenizer):
    """The worker used to drop a cancelled job unseen, so whoever waited for its replies waited forever; and
    after a shutdown began, a job submitted still ran."""
    from tunesmith.generation.worker import Scheduler

    prompt = encode_prompt(tokenizer, CONVERSATIONS[0])
    heard: dict[str, list] = {"kept": [], "dropped": [], "late": []}

    def job(name: str, n: int = 1) -> Request:
        return Request(prompt, SamplingParams(temperature=0, max_new_tokens=3, n=n),
                       emit=lambda event: heard[name].append((event.index, event.finish_reason)))

    scheduler = Scheduler(engine.model, tokenizer, max_batch_size=2, wait_s=0)
    kept, dropped = job("kept"), job("dropped", n=2)
    dropped.cancelled = True
    scheduler.submit(dropped)
    scheduler.submit(kept)
    scheduler.start()
    try:
        deadline = time.monotonic() + 60
        while not (kept.done and dropped.done) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        scheduler.close()
    late = job("late")
    scheduler.submit(late)
    assert heard["dropped"] == [(0, "cancelled"), (1, "cancelled")] and heard["late"] == [(0, "cancelled")]
    assert [c.finish_reason for c in dropped.completions] == ["cancelled", "cancelled"]
    assert heard["kept"][-1] == (0, "length") and scheduler.stats["running"] == 0


def test_a_busy_port_is_refused_before_the_model_loads(chatty_model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, str(ROOT / "chat" / "serve.py"), "--model_name_or_path", chatty_model_dir,
                               "--port", str(port)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().endswith(f"tunesmith: config error: --host 127.0.0.1 --port {port}: cannot listen "
                                        "there (Address already in use); choose another --port, or stop what uses it")
    assert "Loading weights" not in proc.stderr


def test_health_answers_while_a_large_prompt_is_tokenized(chatty_model_dir, tmp_path):
    """A 6 MB prompt takes seconds to parse, render and tokenize; on the event loop it blocked /health (and
    every other request) all that time."""
    text = "The sky is blue. " * 350_000
    with running_server(tmp_path / "server.log", "--model_name_or_path", chatty_model_dir, "--dtype", "float32") as url:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            big = pool.submit(httpx.post, url + "/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": text}]}, timeout=120)
            waits = []
            while not big.done():
                started = time.monotonic()
                assert httpx.get(url + "/health", timeout=60).status_code == 200
                waits.append(time.monotonic() - started)
                time.sleep(0.05)
        assert_openai_error(big.result(), 400, "more than the model's context of 2048 tokens leaves for a reply")
    assert len(waits) >= 5 and max(waits) < 1.0, waits


def test_sigterm_cancels_a_long_generation_and_the_server_exits_within_seconds(chatty_model_dir, tmp_path):
    """uvicorn's graceful shutdown waits for open requests; a reply of 8000 tokens kept the server up for
    minutes. Now the shutdown cancels it: the waiting client gets a 503 and the process exits at once."""
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "chat" / "serve.py"), "--port", "0", "--model_name_or_path",
                                 chatty_model_dir, "--dtype", "float32", "--context_length", "8192"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        url = wait_until_healthy(proc, log)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long = pool.submit(httpx.post, url + "/v1/chat/completions",
                               json={"messages": CONVERSATIONS[0], "max_tokens": 8000, "n": 4}, timeout=120)
            while httpx.get(url + "/health").json()["requests"] == 0:
                time.sleep(0.1)
            time.sleep(1)  # generating
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            took = time.monotonic() - started
            reply = long.result()
    finally:
        proc.kill()
        proc.wait()
    assert took < 5, log.read_text()[-2000:]
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "server_shutting_down"
    assert "Traceback" not in log.read_text()
    assert proc.returncode == -signal.SIGTERM  # uvicorn re-raises the signal once shut down, as its exit status


@pytest.mark.parametrize("flags, message", [
    (dict(port=70000), r"--port must be in 0..65535 \(got 70000\); 0 takes any free port"),
    (dict(host="0.0.0.0"), r"--host 0.0.0.0 serves the model to every machine that can reach this one: give --api_key "
     r"KEY too \(or set TUNESMITH_API_KEY\), or keep the default --host 127.0.0.1 \(--allow_no_api_key"),
    (dict(max_batch_size=0), r"--max_batch_size must be at least 1 and --batch_wait_ms at least 0 \(got 0 and 10.0\)"),
    (dict(context_length=4), r"--context_length must be at least 8 tokens \(got 4\)"),
    (dict(adapter=["tuned"]), r"--adapter: 'tuned' is not NAME=PATH; give each adapter as NAME=PATH"),
    (dict(max_request_bytes=10), r"--max_request_bytes must be at least 1024 \(got 10\)"),
])
def test_serve_flags_are_checked(flags, message, monkeypatch):
    monkeypatch.delenv("TUNESMITH_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=message):
        check(feature_rules=RULES, serve=ServeArguments(**flags))


def test_a_host_other_than_loopback_is_served_with_a_key_or_when_asked(monkeypatch):
    monkeypatch.delenv("TUNESMITH_API_KEY", raising=False)
    for flags in (dict(host="0.0.0.0", api_key="k"), dict(host="0.0.0.0", allow_no_api_key=True), dict(host="::1"),
                  dict(host="localhost")):
        check(feature_rules=RULES, serve=ServeArguments(**flags))
    monkeypatch.setenv("TUNESMITH_API_KEY", "from-the-environment")
    check(feature_rules=RULES, serve=ServeArguments(host="0.0.0.0"))
    assert ServeArguments(host="0.0.0.0").key() == "from-the-environment"


def test_serve_refuses_beam_search_and_one_adapter_name_twice(adapter_dir):
    from tunesmith.errors import PathError

    with pytest.raises(PathError, match="--adapter: /nonexistent: not a LoRA adapter folder"):
        check(feature_rules=RULES, serve=ServeArguments(adapter=["tuned=/nonexistent"]))
    with pytest.raises(ConfigError, match="--num_beams cannot be used with serve"):
        check(feature_rules=RULES, serve=ServeArguments(), generation=GenerationArguments(num_beams=2))
    with pytest.raises(ConfigError, match="two adapters share a NAME"):
        check(feature_rules=RULES, serve=ServeArguments(adapter=[f"a={adapter_dir}", f"a={adapter_dir}"]))
    assert ServeArguments(adapter=[[f"a={adapter_dir}"], [f"b={adapter_dir}"]]).adapters() == {
        "a": adapter_dir, "b": adapter_dir}  # repeated flags arrive as lists: flattened


def test_incremental_decoding_never_splits_a_character(tokenizer):
    text = "Café ☕ 你好，世界! 🎉🎉 naïve"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(tokenizer)

    pieces = [decoder.add(i) for i in ids] + [decoder.flush()]

    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert len(ids) > len(text.split()) and sum(1 for p in pieces if p) > 5


def test_stop_strings_are_held_back_until_they_cannot_match():
    matcher = StopMatcher(("END", "\n\n"))
    shown = []
    for piece in ["Hello E", "N", "ough. ", "Bye E", "ND and more"]:
        matcher.feed(piece)
        shown.append(matcher.release())

    assert shown == ["Hello ", "", "ENough. ", "Bye ", ""]
    assert matcher.stopped and matcher.text == "Hello ENough. Bye "


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, chatty_model_dir, tokenizer) -> str:
    return save_random_adapter(chatty_model_dir, tokenizer, str(tmp_path_factory.mktemp("served-adapter")), seed=5)


def test_several_adapters_over_one_base_are_served_by_name(chatty_model_dir, adapter_dir, tokenizer, tmp_path):
    """--adapter NAME=PATH: /v1/models lists the base and the adapter, a request's `model` picks one, and
    concurrent requests for both (one batch, peft's mixed-adapter forward) answer as each model alone."""
    with running_server(tmp_path / "server.log", "--model_name_or_path", chatty_model_dir, "--dtype", "float32",
                        "--served_model_name", "base", "--adapter", f"tuned={adapter_dir}", "--do_sample", "false",
                        "--max_new_tokens", str(MAX_TOKENS), "--batch_wait_ms", "200",
                        "--max_request_bytes", "4096") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["base", "tuned"]
        messages = CONVERSATIONS[1]

        def ask(name: str) -> str:
            reply = client.chat.completions.create(model=name, messages=messages, temperature=0, max_tokens=MAX_TOKENS)
            return reply.choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(ask, ["base", "tuned"], timeout=120))
        prompt = encode_prompt(tokenizer, messages)
        params = SamplingParams(temperature=0, max_new_tokens=MAX_TOKENS)
        from peft import PeftModel

        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(chatty_model_dir), adapter_dir).eval()
        base = AutoModelForCausalLM.from_pretrained(chatty_model_dir).eval()
        expected = [Engine(m, tokenizer).generate([prompt], params)[0][0].text for m in (base, tuned)]
        assert answers == expected and expected[0] != expected[1]
        assert httpx.get(url + "/health").json()["largest_batch"] == 2  # the two shared a batch

        with pytest.raises(openai.NotFoundError, match="'other' does not exist here: this server serves 'base', 'tuned'"):
            ask("other")
        big = httpx.post(url + "/v1/chat/completions", content=b"{" + b" " * 5000 + b"}",
                         headers={"Content-Type": "application/json"})
        assert big.status_code == 413 and "more than this server's limit of 4096" in big.json()["error"]["message"]
        assert ask("tuned") == expected[1]  # still up


def test_serving_picks_bf16_where_the_hardware_computes_it():
    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import serving_model_args
    from tunesmith.utils.hardware import native_bf16

    native = native_bf16(on_cpu=not torch.cuda.is_available())
    assert serving_model_args(ModelArguments(dtype="auto")).dtype == ("bfloat16" if native else "auto")
    assert serving_model_args(ModelArguments(dtype="float32")).dtype == "float32"
    assert serving_model_args(ModelArguments(dtype="auto", quantization_bit=4)).dtype == "auto"
