"""POST /v1/completions, OpenAI's legacy completions API: a real `chat/serve.py` process on a tiny random
model, called with the official `openai` client and plain HTTP. Its greedy text equals the engine's on
the same tokens, its log-probabilities equal an in-process forward's, the choices of several prompts are
numbered prompt-major, bad requests get OpenAI's error object; and lm-eval's `local-completions` model
on it scores a small multiple-choice task (and generates) exactly as lm-eval's own `hf` model does."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.features.serve.test_serve import KEY, ROOT
from tests.helpers.server import assert_openai_error, running_server
from tunesmith.generation import Engine, SamplingParams
from tunesmith.generation.engine import Batch, Request
from tunesmith.serve.completions import _ChoiceLogprobs, encode

TASKS = ROOT / "tests" / "data" / "lm_eval_tasks"
PROMPT = "The quick brown fox, café ☕, jumps"


@pytest.fixture(scope="module")
def server(chatty_model_dir, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("completions-log") / "server.log", "--model_name_or_path", chatty_model_dir,
                        "--dtype", "float32", "--api_key", KEY, "--served_model_name", "tiny", "--do_sample", "false",
                        "--batch_wait_ms", "20") as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(chatty_model_dir):
    return AutoModelForCausalLM.from_pretrained(chatty_model_dir).eval()


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of one forward over `ids` [T, V]: row t scores token t + 1."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def test_string_list_and_token_prompts_are_the_engines_greedy_text(client, model, tokenizer):
    ids = tokenizer(PROMPT)["input_ids"]
    expected = Engine(model, tokenizer).generate([ids], SamplingParams(temperature=0, max_new_tokens=16))[0][0]

    text = client.completions.create(model="tiny", prompt=PROMPT, temperature=0)  # OpenAI's max_tokens: 16
    tokens = client.completions.create(model="tiny", prompt=ids, temperature=0)
    both = client.completions.create(model="tiny", prompt=[PROMPT, "Hi"], temperature=0, max_tokens=5)
    hi = client.completions.create(model="tiny", prompt="Hi", temperature=0, max_tokens=5)

    assert text.object == "text_completion" and text.id.startswith("cmpl-") and text.model == "tiny"
    assert text.choices[0].text == tokens.choices[0].text == expected.text  # no chat template, as is
    assert text.choices[0].finish_reason == "length" and text.usage.completion_tokens == 16
    assert text.usage.prompt_tokens == len(ids) and text.choices[0].logprobs is None
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == expected.text[:len(both.choices[0].text)] and both.choices[1].text == hi.choices[0].text
    assert both.usage.prompt_tokens == len(ids) + hi.usage.prompt_tokens


def _check_offsets(logprobs, text: str) -> None:
    offsets = logprobs.text_offset
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    for token, offset in zip(logprobs.tokens, offsets):
        if "\ufffd" not in token:  # a byte of a split character decodes to U+FFFD alone
            assert text[offset:].startswith(token), (token, offset, text)


def test_echoed_and_generated_logprobs_equal_a_forwards(client, model, tokenizer):
    ids = tokenizer(PROMPT)["input_ids"]

    scored = client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=0, logprobs=5)
    reply = client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=6, logprobs=3, temperature=0)

    choice = scored.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length" and scored.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.tokens == [tokenizer.decode([i]) for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    forward = _logprobs(model, ids)
    expected = forward[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=1e-4)
    for t, top in enumerate(lp.top_logprobs[1:]):
        values, best = forward[t].topk(5)
        assert len(top) == len({tokenizer.decode([i]) for i in best.tolist()}) == 5
        assert torch.allclose(torch.tensor(sorted(top.values(), reverse=True)), values, atol=1e-4)
    _check_offsets(lp, choice.text)

    greedy = Engine(model, tokenizer).generate([ids], SamplingParams(temperature=0, max_new_tokens=6))[0][0]
    every = ids + greedy.token_ids
    forward = _logprobs(model, every)
    lp, text = reply.choices[0].logprobs, reply.choices[0].text
    assert text == PROMPT + greedy.text and reply.usage.completion_tokens == 6
    assert lp.tokens == [tokenizer.decode([i]) for i in every] and lp.token_logprobs[0] is None
    expected = forward[torch.arange(len(every) - 1), torch.tensor(every[1:])]
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=1e-4)  # prompt and reply alike
    for token, logprob, top in zip(lp.tokens[len(ids):], lp.token_logprobs[len(ids):], lp.top_logprobs[len(ids):]):
        assert len(top) == 3 and top[token] == logprob == max(top.values())  # greedy: the chosen is the likeliest
    assert lp.text_offset[len(ids)] == len(PROMPT)  # the reply's offsets count on from the echo
    _check_offsets(lp, text)

    bare = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logprobs=0, temperature=0)
    assert bare.choices[0].logprobs.top_logprobs == [{}] * 3  # logprobs 0: the chosen tokens' alone
    assert bare.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[len(ids):len(ids) + 3], abs=1e-4)


def test_an_echo_keeps_the_prompt_as_sent_with_special_tokens_and_split_characters(tokenizer):
    text = "<|im_start|>user\nCafé ☕ 你好<|im_end|>"
    prompt = encode(text, tokenizer, "`prompt`")
    ids = encode(prompt.ids, tokenizer, "`prompt`")

    assert prompt.ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # a special token, not its letters
    assert prompt.text == ids.text == text and prompt.offsets == ids.offsets
    for token, offset in zip((tokenizer.decode([i]) for i in prompt.ids), prompt.offsets):
        if "\ufffd" not in token:
            assert text[offset:].startswith(token), (token, offset)
        else:  # a byte of a character split over several tokens: the offset of that character
            assert text[offset:].lstrip()[0] in "☕你好", (token, offset)


def test_several_prompts_with_n_are_numbered_prompt_major_and_a_seed_repeats_them(client):
    def sample(prompt):
        reply = client.completions.create(model="tiny", prompt=prompt, temperature=1.0, n=2, seed=7, max_tokens=6)
        return [(c.index, c.text) for c in reply.choices], reply.usage

    both, usage = sample(["Once upon", "In a galaxy"])
    first, _ = sample("Once upon")
    second, _ = sample("In a galaxy")

    assert [i for i, _ in both] == [0, 1, 2, 3] and usage.completion_tokens == 4 * 6
    assert [t for _, t in both] == [t for _, t in first + second]  # prompt k's reply i is choice k * n + i
    assert first[0][1] != first[1][1] and sample("Once upon")[0] == first  # n differ; the seed repeats them


def test_a_stop_string_cuts_the_text_and_its_logprobs(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, temperature=0, max_tokens=12)
    text = full.choices[0].text
    stop = text.split()[2]

    cut = client.completions.create(model="tiny", prompt=PROMPT, temperature=0, max_tokens=12, stop=[stop],
                                    logprobs=1)

    choice = cut.choices[0]
    assert choice.text == text[:text.index(stop)] and choice.finish_reason == "stop"
    assert "".join(choice.logprobs.tokens).startswith(choice.text)  # tokens past the stop string are dropped
    assert max(choice.logprobs.text_offset) < len(choice.text) < len("".join(choice.logprobs.tokens))


def test_a_stream_brings_the_same_text_and_logprobs(client):
    settings = dict(model="tiny", prompt=[PROMPT, "Hi"], temperature=0, max_tokens=8, echo=True, logprobs=2)
    whole = client.completions.create(**settings)
    chunks = list(client.completions.create(**settings, stream=True, stream_options={"include_usage": True}))

    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert all(c.object == "text_completion" for c in chunks) and len(mine) > 2  # streamed piece by piece
        assert "".join(c.text for c in mine) == choice.text and mine[0].text == [PROMPT, "Hi"][choice.index]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            streamed = [x for c in mine for x in getattr(c.logprobs, key)]
            assert streamed == getattr(choice.logprobs, key), key
        assert [c.finish_reason for c in mine][-1] == choice.finish_reason == "length"
        assert all(c.finish_reason is None for c in mine[:-1])
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump() and not chunks[-1].choices


def test_the_end_of_turn_tokens_logprob_is_kept_as_the_last_generated_token(model, tokenizer):
    # A loglikelihood client reads the echoed prompt's logprobs as all but the last entry: a reply that
    # ends on the end-of-turn token must still list that token. Made here by stopping on the greedy token.
    ids = tokenizer(PROMPT)["input_ids"]
    first = int(_logprobs(model, ids)[-1].argmax())
    batch = Batch(model, tokenizer, stop_ids={first})
    job = Request(ids, SamplingParams(temperature=0, max_new_tokens=1, logprobs=True, top_logprobs=1))
    batch.admit([job])
    batch.step()

    completion = job.completions[0]
    logprobs = _ChoiceLogprobs(tokenizer, len(PROMPT)).take(completion.logprobs, len(PROMPT), completion)

    assert completion.finish_reason == "stop" and completion.token_ids == [] and completion.text == ""
    assert logprobs["tokens"] == [tokenizer.decode([first])] and logprobs["text_offset"] == [len(PROMPT)]
    assert logprobs["token_logprobs"][0] == pytest.approx(float(_logprobs(model, ids)[-1].max()), abs=1e-4)


BAD_REQUESTS = [
    ("max_tokens 0 without echo", {"prompt": "Hi", "max_tokens": 0}, 400, "`max_tokens` 0 asks for nothing"),
    ("logprobs 6", {"prompt": "Hi", "logprobs": 6}, 400, r"`logprobs` must be in 0..5 \(got 6\)"),
    ("suffix", {"prompt": "Hi", "suffix": "!"}, 400, "`suffix` is not supported by this server"),
    ("unknown field", {"prompt": "Hi", "max_token": 5}, 400, "unrecognized request argument supplied: max_token"),
    ("too long", {"prompt": " ".join(["Hi"] * 2040)}, 400,
     r"`prompt` \(2040 tokens\) plus max_tokens \(16\) make 2056 tokens, 8 more than the model's context of 2048"),
    ("empty prompt", {"prompt": ""}, 400, "`prompt` is empty: give at least one character or token"),
    ("empty prompt in a list", {"prompt": ["Hi", []]}, 400, r"`prompt\[1\]` is empty"),
    ("no prompt", {"model": "tiny"}, 400, "`prompt` is required"),
    ("mixed prompt", {"prompt": [1, "Hi"]}, 400, r"`prompt\[0\]` must be a string or a list of token ids"),
    ("token outside the vocabulary", {"prompt": [1, 10**6]}, 400,
     r"`prompt` has the token id 1000000, outside the model's vocabulary \(0..49151\)"),
    ("best_of", {"prompt": "Hi", "best_of": 3}, 400, r"`best_of` \(3\) must equal `n` \(1\)"),
    ("other model", {"model": "gpt-3.5-turbo-instruct", "prompt": "Hi"}, 404,
     "the model 'gpt-3.5-turbo-instruct' does not exist here: this server serves 'tiny'"),
]


@pytest.mark.parametrize("name, body, status, message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_an_openai_error_object(server, name, body, status, message):
    reply = httpx.post(server + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(reply, status, message)


def test_the_openai_client_sees_the_refusals_and_the_server_goes_on(client):
    with pytest.raises(openai.BadRequestError, match="`suffix` is not supported"):
        client.completions.create(model="tiny", prompt="Hi", suffix="!")
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        client.completions.create(model="davinci-002", prompt="Hi")
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].finish_reason == "length"


def _lm_eval(model: str, model_args: str) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["tunesmith_tiny_mc", "tunesmith_tiny_gen"],
                                   task_manager=TaskManager(include_path=str(TASKS)), log_samples=True)


def _answers(result: dict, task: str) -> list:
    return [sample["filtered_resps"] for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def test_lm_eval_local_completions_scores_and_generates_as_its_hf_model(server, chatty_model_dir, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task's data_files are relative to the repository root
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # lm-eval's API models send it as the bearer token
    local = _lm_eval("hf", f"pretrained={chatty_model_dir},dtype=float32,device=cpu,batch_size=1")
    # batch_size 4: a list of token-id prompts per request. tokenizer_backend auto: lm-eval first asks
    # GET /tokenizer_info for a remote tokenizer; the 404 sends it to the local one, as it should.
    remote = _lm_eval("local-completions", f"model=tiny,base_url={server}/v1/completions,tokenizer={chatty_model_dir},"
                      "tokenizer_backend=auto,tokenized_requests=True,num_concurrent=1,max_retries=1,batch_size=4")

    accuracy = local["results"]["tunesmith_tiny_mc"]["acc,none"]
    assert remote["results"]["tunesmith_tiny_mc"]["acc,none"] == accuracy
    assert 0 < accuracy < 1  # the choices are not all tied, nor all right
    expected, served = _answers(local, "tunesmith_tiny_mc"), _answers(remote, "tunesmith_tiny_mc")
    assert len(expected) == 20 and len({ll for choices in expected for ll, _ in choices}) == 80
    for mine, theirs in zip(served, expected):
        assert [greedy for _, greedy in mine] == [greedy for _, greedy in theirs]
        assert [ll for ll, _ in mine] == pytest.approx([ll for ll, _ in theirs], abs=1e-4)
    replies = _answers(remote, "tunesmith_tiny_gen")
    assert replies == _answers(local, "tunesmith_tiny_gen") and all(r[0].strip() for r in replies)
