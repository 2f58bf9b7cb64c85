"""The one generation engine (tunesmith/generation/): greedy and seeded sampled replies equal transformers'
generate() on the same prompts; a request's replies do not depend on what shares its batch (prompt lengths,
adapters, seeds); the logit processors do what their docstrings say; log-probabilities are the model's own;
rows of different adapters share one batch and answer as each adapter alone."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, GenerationConfig

from tunesmith.data.template import encode_prompt
from tunesmith.generation import BASE, Engine, Request, SamplingParams
from tunesmith.generation.bans import Bans, squeezed, token_texts
from tunesmith.generation.engine import Batch
from tunesmith.generation.sampling import apply_penalties, choose_tokens, warp
from tunesmith.models.loader import find_lora_targets

QUESTIONS = ["Hi", "Tell me a long story about a cat and a dog, please.", "你好，世界！"]


@pytest.fixture(scope="module")
def model(chatty_model_dir):
    return AutoModelForCausalLM.from_pretrained(chatty_model_dir).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


def hf_generate(model, tokenizer, prompts, **settings) -> list[list[int]]:
    batch = tokenizer.pad({"input_ids": prompts}, padding_side="left", return_tensors="pt")
    config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id, **settings)
    with torch.no_grad():
        out = model.generate(**batch, generation_config=config)
    rows = out[:, batch["input_ids"].shape[1]:].tolist()
    return [row[:row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row for row in rows]


def test_greedy_replies_equal_generate_and_each_prompt_alone(model, tokenizer, prompts):
    engine = Engine(model, tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=10)
    together = [c[0].token_ids for c in engine.generate(prompts, params)]
    alone = [engine.generate([p], params)[0][0].token_ids for p in prompts]
    one_at_a_time = [c[0].token_ids for c in engine.generate(prompts, params, max_batch_size=1)]
    expected = hf_generate(model, tokenizer, prompts, max_new_tokens=10, do_sample=False)
    assert together == alone == one_at_a_time == expected
    assert len(set(map(tuple, together))) == len(prompts)


def test_seeded_sampling_draws_what_generate_draws(model, tokenizer, prompts):
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=8)
    torch.manual_seed(11)
    ours = [c[0].token_ids for c in Engine(model, tokenizer).generate(prompts * 2, params)]
    torch.manual_seed(11)
    theirs = hf_generate(model, tokenizer, prompts * 2, max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20,
                         top_p=0.9)
    assert ours == theirs and ours[0] != ours[len(prompts)]  # the same prompt twice: two different draws


def test_a_seeded_request_repeats_whatever_shares_its_batch(model, tokenizer, prompts):
    engine = Engine(model, tokenizer)
    seeded = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=7, max_new_tokens=8, n=2)
    alone = engine.generate([prompts[0]], seeded)[0]
    crowd = engine.generate(prompts, [seeded, SamplingParams(temperature=1.0, max_new_tokens=12),
                                      SamplingParams(temperature=0, max_new_tokens=3)])[0]
    assert [c.token_ids for c in alone] == [c.token_ids for c in crowd]
    assert alone[0].token_ids != alone[1].token_ids  # n replies are n draws


def test_stop_strings_stop_ids_and_lengths_end_replies(model, tokenizer, prompts):
    engine = Engine(model, tokenizer)
    [[free]] = engine.generate([prompts[1]], SamplingParams(temperature=0, max_new_tokens=10))
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    cut = free.text[3:6]
    [[stopped]] = engine.generate([prompts[1]], SamplingParams(temperature=0, max_new_tokens=10, stop=(cut,)))
    assert stopped.finish_reason == "stop" and stopped.text == free.text[:free.text.index(cut)]
    [[by_id]] = engine.generate([prompts[1]], SamplingParams(temperature=0, max_new_tokens=10,
                                                             stop_token_ids=(free.token_ids[4],)))
    assert by_id.finish_reason == "stop" and by_id.token_ids == free.token_ids[:4]
    assert by_id.stop_token_id == free.token_ids[4] and free.stop_token_id is None


def test_logprobs_are_the_models_own_and_prompt_logprobs_cover_every_prompt_token(model, tokenizer, prompts):
    params = SamplingParams(temperature=0, max_new_tokens=5, logprobs=True, top_logprobs=3, prompt_logprobs=True)
    request_prompt = prompts[1]
    request = Request(request_prompt, params)  # run on a batch directly, to read its prompt log-probabilities
    batch = Batch(model, tokenizer)
    batch.admit([request])
    while len(batch):
        batch.step()
    [completion] = request.completions
    assert completion.token_ids == Engine(model, tokenizer).generate([request_prompt], params)[0][0].token_ids
    ids = torch.tensor([request_prompt + completion.token_ids])
    with torch.no_grad():
        logprobs = model(ids).logits[0].float().log_softmax(-1)
    for t, record in enumerate(completion.logprobs):
        position = len(request_prompt) + t - 1
        assert record.logprob == pytest.approx(logprobs[position, record.token_id].item(), abs=1e-4)
        assert [i for i, _ in record.top] == logprobs[position].topk(3).indices.tolist()
        assert record.top[0][0] == record.token_id  # greedy: the chosen token is the most likely
    assert request.prompt_logprobs[0] is None and len(request.prompt_logprobs) == len(request_prompt)
    for t, record in enumerate(request.prompt_logprobs[1:], 1):
        assert record.token_id == request_prompt[t]
        assert record.logprob == pytest.approx(logprobs[t - 1, request_prompt[t]].item(), abs=1e-4)


def test_processors_penalties_and_truncation():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    warped = warp(logits, SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert torch.isinf(warped[0, 2:]).all() and not torch.isinf(warped[0, :2]).any()
    probs = logits.softmax(-1)[0]
    kept = warp(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))[0]
    assert (~torch.isinf(kept)).sum() == 2 and probs[:2].sum() >= 0.8 > probs[0]
    kept = warp(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))[0]
    assert (~torch.isinf(kept)).tolist() == (probs >= 0.3 * probs.max()).tolist()
    scaled = warp(logits, SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0))
    torch.testing.assert_close(scaled, logits / 0.5)

    row, reply = logits[0], torch.tensor([0, 0, 3])
    penalised = apply_penalties(row, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
                                torch.tensor([1]), reply)
    torch.testing.assert_close(penalised, torch.tensor([2.0 - 0.5 - 0.5, 1.0, 0.5, -1.0 - 0.5 - 0.25, -3.0]))
    repeated = apply_penalties(row, SamplingParams(repetition_penalty=2.0), torch.tensor([1]), torch.tensor([3]))
    torch.testing.assert_close(repeated, torch.tensor([2.0, 0.5, 0.5, -2.0, -3.0]))


def test_a_frequency_penalty_changes_a_repetitive_greedy_reply(tiny_model_dir, tokenizer, prompts):
    engine = Engine(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), tokenizer)  # it repeats "\n"
    plain = engine.generate([prompts[0]], SamplingParams(temperature=0, max_new_tokens=24))[0][0].token_ids
    penalised = engine.generate([prompts[0]], SamplingParams(temperature=0, max_new_tokens=24,
                                                             frequency_penalty=100.0))[0][0].token_ids
    assert len(set(plain)) < len(plain)  # the greedy reply repeats tokens ...
    assert len(set(penalised)) == len(penalised)  # ... and a penalty far above the logits' spread stops that


def test_rows_of_different_adapters_share_a_batch_and_answer_as_each_alone(chatty_model_dir, tokenizer, prompts):
    adapters = {}
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(chatty_model_dir)
        config = LoraConfig(r=4, lora_alpha=32, target_modules=find_lora_targets(base), init_lora_weights=False)
        adapters[name] = get_peft_model(base, config)
    model = PeftModel(AutoModelForCausalLM.from_pretrained(chatty_model_dir), adapters["a"].peft_config["default"], "a")
    model.load_state_dict({k.replace(".default.", ".a."): v for k, v in adapters["a"].state_dict().items()},
                          strict=False)
    model.add_adapter("b", adapters["b"].peft_config["default"])
    model.load_state_dict({k.replace(".default.", ".b."): v for k, v in adapters["b"].state_dict().items()},
                          strict=False)
    model.eval()
    engine = Engine(model, tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    alone = {name: engine.generate([prompts[1]], params, adapter=name)[0][0].token_ids for name in ("a", "b", BASE)}
    assert len({tuple(v) for v in alone.values()}) == 3  # three different models
    # No adapter named: the one active when the engine was made ("a"), though "b"'s batch switched to "b".
    assert engine.generate([prompts[1]], params)[0][0].token_ids == alone["a"]

    requests = [Request(prompts[1], params, adapter=name) for name in ("a", "b", BASE)]
    batch = Batch(model, tokenizer)
    batch.admit(requests)
    while len(batch):
        batch.step()
    assert [r.completions[0].token_ids for r in requests] == [alone["a"], alone["b"], alone[BASE]]
    reference = adapters["b"].eval()
    assert alone["b"] == hf_generate(reference, tokenizer, [prompts[1]], max_new_tokens=8, do_sample=False)[0]


def test_beam_search_is_transformers_own(model, tokenizer, prompts):
    [[beam]] = Engine(model, tokenizer).generate([prompts[0]], SamplingParams(num_beams=3, max_new_tokens=6))
    assert beam.token_ids == hf_generate(model, tokenizer, [prompts[0]], max_new_tokens=6, num_beams=3,
                                         do_sample=False)[0]
    assert beam.text == tokenizer.decode(beam.token_ids, skip_special_tokens=True)


def test_adapters_peft_cannot_mix_are_scheduled_one_adapter_at_a_time(chatty_model_dir, tokenizer, prompts):
    """DoRA adapters cannot share a forward (peft refuses adapter_names with DoRA): the worker runs one
    adapter's rows at a time, first come first served, and each answer is what that adapter gives alone."""
    import threading

    from tunesmith.generation.worker import Scheduler

    torch.manual_seed(4)
    base = AutoModelForCausalLM.from_pretrained(chatty_model_dir)
    config = {"r": 4, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"], "use_dora": True,
              "init_lora_weights": False}
    model = get_peft_model(base, LoraConfig(**config), adapter_name="a")
    model.add_adapter("b", LoraConfig(**config))
    model.eval()
    params = SamplingParams(temperature=0, max_new_tokens=6)
    alone = {name: Engine(model, tokenizer).generate([prompts[1]], params, adapter=name)[0][0].token_ids
             for name in ("a", "b")}
    assert alone["a"] != alone["b"]

    scheduler = Scheduler(model, tokenizer, max_batch_size=4, wait_s=0.5)
    assert not scheduler.batch.mixes_adapters
    finished = threading.Semaphore(0)
    requests = [Request(prompts[1], params, adapter=name, emit=lambda e: e.finish_reason and finished.release())
                for name in ("a", "b", "a")]
    for request in requests:
        scheduler.submit(request)
    scheduler.start()
    try:
        assert all(finished.acquire(timeout=60) for _ in requests)
    finally:
        scheduler.close()
    assert [r.completions[0].token_ids for r in requests] == [alone["a"], alone["b"], alone["a"]]
    assert scheduler.stats["largest_batch"] == 1 and scheduler.stats["prefills"] == 3


MARKER = "<tool_call>"  # five ordinary tokens of SmolLM2's: "<", "tool", "_", "call", ">"


def test_a_ban_refuses_exactly_the_tokens_that_would_complete_the_string(tokenizer):
    bans, texts = Bans.of(tokenizer), token_texts(tokenizer)
    ids = {text: tokenizer.convert_tokens_to_ids(text) for text in ("<", "tool", "_", "call", ">", "Ġ<")}

    for text in ("", "Sure. ", "a <", "see. <tool", "x<tool_", "<tool_call", "<tool_call <tool_call"):
        banned = bans.tokens(text, anywhere=(MARKER,))
        # the whole vocabulary checked: banned exactly where the reply's text would come to hold the marker
        assert set(banned) == {i for i, t in enumerate(texts) if MARKER in text + t}, text
    assert bans.tokens("", anywhere=(MARKER,)) == []  # its first tokens stay free: "<" is ordinary text
    assert ids[">"] in bans.tokens("see. <tool_call", anywhere=(MARKER,))
    assert not {ids["tool"], ids["_"], ids["call"]} & set(bans.tokens("see. <tool_", anywhere=(MARKER,)))
    opening = '{"name": "'
    for text in ("", "\n", '{"', ' {"name":', '{"name": ', 'no {"name": '):
        banned = bans.tokens(text, openings=(opening,))
        assert set(banned) == {i for i, t in enumerate(texts) if squeezed(text + t).startswith(squeezed(opening))}, text
    assert bans.tokens('{"name": ', openings=(opening,)) and not bans.tokens('no {"name": ', openings=(opening,))

    one_token = copy.deepcopy(tokenizer)  # Qwen's and Hermes' templates: the tag is one token of its own
    one_token.add_special_tokens({"additional_special_tokens": [MARKER]})
    assert Bans.of(one_token).tokens("any text", anywhere=(MARKER,)) == [one_token.convert_tokens_to_ids(MARKER)]


def test_banned_tokens_are_ruled_out_for_greedy_and_sampled_rows_alike():
    logits = torch.tensor([[5.0, 4.0, 0.0]]).repeat(3, 1)
    greedy, sampled = SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    generator = torch.Generator().manual_seed(0)
    # token 7 is past the model's head (a tokenizer may know more tokens than it): nothing to rule out
    draws = [choose_tokens(logits, [greedy, greedy, sampled], [None, None, generator], banned=[[0, 7], [], [0]])
             for _ in range(200)]

    tokens, processed = draws[0]
    assert tokens[:2].tolist() == [1, 0] and processed[0, 0] == float("-inf") and processed[1, 0] == 5.0
    assert {int(t[2]) for t, _ in draws} == {1, 2}  # the most likely token, banned, is never drawn
    assert logits[0, 0] == 5.0  # the model's own logits are left as they were


def test_a_tokens_text_reads_as_inside_a_reply_for_sentencepiece_too():
    from tests.helpers.tiny_models import build_spm_tokenizer

    spm = build_spm_tokenizer(add_prefix=True)
    texts = token_texts(spm)
    piece = next(t for t in spm.get_vocab() if t.startswith("\u2581") and len(t) > 2)
    token = spm.convert_tokens_to_ids(piece)
    assert texts[token] == piece.replace("\u2581", " ") != spm.decode([token])  # alone, it loses its space


@contextlib.contextmanager
def writing(model, tokenizer, text: str, bonus: float = 50.0):
    """The model made to write `text` over and over: a forward hook adds `bonus` to the logit of the token
    (of text's tokenization) that follows the input's last token, and of text's first token after any other."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    following = dict(zip(ids, ids[1:]))

    def hook(module, args, kwargs, output):
        last = kwargs["input_ids"][:, -1].tolist()
        rows = torch.arange(len(last))
        output.logits[rows, -1, torch.tensor([following.get(t, ids[0]) for t in last])] += bonus
        return output

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def test_banned_strings_keep_a_call_tag_out_of_greedy_and_sampled_rows_of_one_batch(model, tokenizer, prompts):
    engine = Engine(model, tokenizer)
    free = SamplingParams(temperature=0, max_new_tokens=24)
    banned = free.replace(banned_strings=(MARKER,))
    rows = [free, banned, banned.replace(temperature=1.0, seed=3, n=2), free.replace(banned_openings=(MARKER,))]
    streamed: dict[int, str] = {}
    with writing(model, tokenizer, " " + MARKER):
        together = engine.generate([prompts[k % 3] for k in range(len(rows))], rows,
                                   on_event=lambda i, e: streamed.__setitem__(i, streamed.get(i, "") + e.text))
        alone = engine.generate([prompts[1]], banned)[0][0]
    [unbanned], [greedy], sampled, [opening] = together

    assert unbanned.text.startswith(" <tool_call> <tool_call>")  # the model as made: the tag over and over
    for reply in (greedy, *sampled):
        # the tag's first four tokens come, again and again, but never the ">" that would finish it
        assert MARKER not in reply.text and reply.text.count("<tool_call") > 2, reply.text
    assert sampled[0].text != sampled[1].text  # drawn, not greedy
    assert alone.token_ids == greedy.token_ids  # what shares its batch changes nothing
    assert not opening.text.lstrip().startswith(MARKER) and MARKER in opening.text  # only the opening is banned
    assert streamed[1] == greedy.text and streamed[3] == opening.text  # streamed, the same text
    with pytest.raises(ValueError, match="not with beam search"):
        engine.generate([prompts[0]], banned.replace(num_beams=2))
