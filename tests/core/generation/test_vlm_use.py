"""Using a vision-language model: the one engine's greedy replies to prompts with pictures equal transformers'
`generate()` with the same pictures (Qwen2-VL's M-RoPE positions, Gemma 3's image attention, Idefics3's
connector), also when rows with and without pictures share a batch; the chat session takes /image and paths in a
message; the server answers image requests from the openai client and refuses what it must not read; a merged LoRA
gives the adapter's logits on a picture and keeps the processor."""

from __future__ import annotations

import base64
import json
import os

import pytest
import torch
from transformers import GenerationConfig

from tests.helpers.server import running_server
from tests.helpers.vlm_models import TEXT, TRAIN_AND_GENERATE_FAMILIES, make_picture
from tunesmith.data.images import image_part
from tunesmith.data.template import encode_prompt
from tunesmith.generation import Engine, SamplingParams
from tunesmith.generation.chat_session import ChatSession
from tunesmith.generation.engine import stop_token_ids
from tunesmith.hparams import FinetuningArguments, GenerationArguments, ModelArguments
from tunesmith.merge.args import MergeArguments
from tunesmith.merge.command import merge, probe_logits
from tunesmith.models.loader import load_model, load_tokenizer

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def vlm_dirs(vlm_dir):
    return {family: vlm_dir(family, seed=1) for family in TRAIN_AND_GENERATE_FAMILIES}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pictures")
    return {"red": make_picture(folder / "red.png", (230, 20, 20)),
            "wide": make_picture(folder / "wide.png", (20, 40, 230), size=(112, 56), shape="circle")}


def load(model_dir: str):
    model_args = ModelArguments(model_name_or_path=model_dir, dtype="float32")
    return (load_model(model_args, FinetuningArguments(finetuning_type="full"), is_trainable=False),
            load_tokenizer(model_args))


def asking(picture: str, text: str = "What is in the picture?") -> list[dict]:
    return [{"role": "user", "content": [image_part(picture), {"type": "text", "text": text}]}]


def hf_greedy(model, tokenizer, prompt) -> list[int]:
    """transformers' own greedy decoding of one prompt, with its pictures' inputs, cut at the first stop token."""
    stops = stop_token_ids(model, tokenizer)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=sorted(stops),
                              pad_token_id=tokenizer.pad_token_id)
    inputs = {"input_ids": torch.tensor([list(prompt)]), **getattr(prompt, "vision", {})}
    with torch.no_grad():
        out = model.generate(**inputs, attention_mask=torch.ones_like(inputs["input_ids"]),
                             generation_config=config)[0, len(prompt):].tolist()
    return out[:next((k for k, t in enumerate(out) if t in stops), len(out))]


def first_logprobs(model, prompt) -> torch.Tensor:
    """The model's own log-probabilities for the token after the prompt, its pictures shown."""
    inputs = {"input_ids": torch.tensor([list(prompt)]), **getattr(prompt, "vision", {})}
    with torch.no_grad():
        return torch.log_softmax(model(**inputs).logits[0, -1].float(), -1)


@pytest.mark.parametrize("family", TRAIN_AND_GENERATE_FAMILIES)
def test_engine_replies_with_pictures_equal_generate_also_beside_text_rows(family, vlm_dirs, pictures):
    model, tokenizer = load(vlm_dirs[family])
    prompts = [encode_prompt(tokenizer, asking(pictures["red"])),
               encode_prompt(tokenizer, [{"role": "user", "content": "A question without a picture."}]),
               encode_prompt(tokenizer, asking(pictures["wide"]))]
    assert prompts[0].vision and not hasattr(prompts[1], "vision")
    expected = [hf_greedy(model, tokenizer, p) for p in prompts]
    # the pictures reach the model: the same question about two pictures gets other next-token probabilities
    assert not torch.allclose(first_logprobs(model, prompts[0]), first_logprobs(model, prompts[2]), atol=1e-3)
    params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS, logprobs=True)
    replies = Engine(model, tokenizer).generate(prompts, params)
    assert [reply.token_ids for [reply] in replies] == expected
    for prompt, [reply] in zip(prompts, replies):  # the engine's prefill saw the same pictures as the model alone
        assert reply.logprobs[0].logprob == pytest.approx(first_logprobs(model, prompt)[reply.token_ids[0]].item(),
                                                          abs=1e-4)
    # and each alone, and several replies to one picture (its prefill copied to every row)
    [[alone]] = Engine(model, tokenizer).generate([prompts[2]], params)
    assert alone.token_ids == expected[2]
    [copies] = Engine(model, tokenizer).generate([prompts[0]], SamplingParams(temperature=0, n=3,
                                                                              max_new_tokens=NEW_TOKENS))
    assert [c.token_ids for c in copies] == [expected[0]] * 3


def test_chat_takes_pictures_by_command_and_by_path_and_saves_them(vlm_dirs, pictures, tmp_path):
    model, tokenizer = load(vlm_dirs["qwen2_vl"])
    session = ChatSession(model, tokenizer, GenerationArguments(temperature=0, max_new_tokens=NEW_TOKENS))
    assert session.handle(f"/image {pictures['red']}").kind == "info"
    answer = session.handle("What is in the picture?")
    assert answer.kind == "answer"
    assert session.messages[0]["content"] == [image_part(pictures["red"]),
                                              {"type": "text", "text": "What is in the picture?"}]
    assert session.messages[1]["content"] == answer.text
    expected = tokenizer.decode(hf_greedy(model, tokenizer, encode_prompt(tokenizer, asking(pictures["red"]))))
    assert answer.text == expected
    session.handle(f"Compare it with {pictures['wide']} please")
    assert session.messages[2]["content"] == [image_part(pictures["wide"]),
                                              {"type": "text", "text": "Compare it with please"}]
    assert session.handle("/image /no/such.png").kind == "error"
    saved = tmp_path / "chat.jsonl"
    session.handle(f"/save {saved}")
    [row] = [json.loads(line) for line in saved.read_text().splitlines()]
    assert row["messages"][0]["content"][0] == {"type": "image", "image": pictures["red"]}


def test_chat_with_a_text_model_refuses_image_command(tiny_model_dir):
    model, tokenizer = load(tiny_model_dir)
    outcome = ChatSession(model, tokenizer).handle("/image x.png")
    assert outcome.kind == "error" and "reads text only" in outcome.text


def test_server_answers_image_requests_through_the_openai_client(vlm_dirs, pictures, tmp_path):
    from openai import BadRequestError, OpenAI

    model, tokenizer = load(vlm_dirs["qwen2_vl"])
    expected = tokenizer.decode(hf_greedy(model, tokenizer, encode_prompt(tokenizer, asking(pictures["red"]))))
    del model
    url = "data:image/png;base64," + base64.b64encode(open(pictures["red"], "rb").read()).decode()
    root = os.path.dirname(pictures["red"])
    with running_server(tmp_path / "serve.log", "--model_name_or_path", vlm_dirs["qwen2_vl"], "--dtype", "float32",
                        "--image_root", root) as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="none")
        [listed] = client.models.list().data
        served = listed.id
        # the context is the language model's (Qwen2-VL keeps max_position_embeddings in text_config only)
        assert listed.model_extra["context_length"] == TEXT["max_position_embeddings"]

        def ask(image_url: str):
            return client.chat.completions.create(
                model=served, temperature=0, max_tokens=NEW_TOKENS,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                       {"type": "text", "text": "What is in the picture?"}]}])

        assert ask(url).choices[0].message.content == expected
        assert ask("red.png").choices[0].message.content == expected  # a path under --image_root
        for refused, why in (("https://example.com/a.png", "remote images are not fetched"),
                             ("../outside.png", "outside the folder pictures are read from")):
            with pytest.raises(BadRequestError, match=why):
                ask(refused)


def test_merged_lora_gives_the_adapters_logits_on_a_picture_and_keeps_the_processor(vlm_dirs, tmp_path):
    from tunesmith.sft.command import run as sft_main

    folder = tmp_path / "data"
    folder.mkdir()
    picture = make_picture(folder / "p.png", (20, 200, 40))
    (folder / "train.jsonl").write_text(json.dumps({"messages": [*asking("p.png"),
                                                                 {"role": "assistant", "content": "Green."}]}) + "\n")
    adapter = tmp_path / "adapter"
    sft_main(["--model_name_or_path", vlm_dirs["gemma3"], "--data_path", str(folder / "train.jsonl"),
              "--output_dir", str(adapter), "--max_steps", "3", "--learning_rate", "1e-2", "--save_strategy", "no",
              "--plot_loss", "false", "--train_projector", "true", "--report_to", "none"])
    result = merge(ModelArguments(model_name_or_path=vlm_dirs["gemma3"], adapter_name_or_path=str(adapter)),
                   MergeArguments(output_dir=str(tmp_path / "merged")))
    assert result.max_abs_diff < 1e-3
    merged, tokenizer = load(str(tmp_path / "merged"))
    base, _ = load(vlm_dirs["gemma3"])
    assert tokenizer.tunesmith_processor is not None
    assert not torch.allclose(probe_logits(merged, tokenizer), probe_logits(base, tokenizer))  # it learned
    assert picture


def test_the_web_pages_chat_shows_a_picture_and_keeps_it_in_the_conversation(vlm_dirs, pictures, tmp_path):
    from tunesmith.ui.actions import Workbench

    model_dir = vlm_dirs["qwen2_vl"]
    model, tokenizer = load(model_dir)
    bench = Workbench(str(tmp_path / "runs"), [os.path.dirname(model_dir)])
    tuned, _ = list(bench.chat("What is in the picture?", [], model_dir, temperature=0.0,
                               max_new_tokens=NEW_TOKENS, picture=pictures["red"]))[-1]
    assert tuned[0] == {"role": "user", "content": {"path": pictures["red"]}}
    assert tuned[1]["content"] == "What is in the picture?"
    prompt = encode_prompt(tokenizer, asking(pictures["red"]))
    assert tuned[2]["content"] == tokenizer.decode(hf_greedy(model, tokenizer, prompt))
    # the next message's prompt holds the picture still (as Gradio hands the history back)
    returned = [{"role": "user", "content": {"file": {"path": pictures["red"]}}}, *tuned[1:]]
    again, _ = list(bench.chat("And its colour?", returned, model_dir, temperature=0.0, max_new_tokens=2))[-1]
    expected = encode_prompt(tokenizer, [*asking(pictures["red"]), {"role": "assistant", "content": tuned[2]["content"]},
                                         {"role": "user", "content": "And its colour?"}])
    assert again[-1]["content"] == tokenizer.decode(hf_greedy(model, tokenizer, expected)[:2])


def test_serve_refuses_a_missing_image_root_before_loading(vlm_dirs, tmp_path):
    from tunesmith.errors import PathError
    from tunesmith.serve.command import run as serve_main

    with pytest.raises(PathError, match=r"^--image_root \S+nowhere: no such directory; give the folder whose pictures"):
        serve_main(["--model_name_or_path", vlm_dirs["qwen2_vl"], "--image_root", str(tmp_path / "nowhere")])
