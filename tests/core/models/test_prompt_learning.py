"""PEFT's prompt-based methods (--finetuning_type prompt_tuning, p_tuning, prefix_tuning): a short run learns a
tiny memorisation set while only the virtual-token parameters train and the base stays bit-identical; the saved
adapter answers in the engine (and so in chat, compare and serve) exactly as greedy decoding through PEFT's own
forward, the one training optimised; a resume continues the same trajectory; merge, GGUF export and the settings
that cannot work are refused in one line that says why."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import set_seed

from tests.helpers.server import running_server
from tests.helpers.tiny_models import save_random_adapter
from tunesmith.data.template import encode_prompt
from tunesmith.errors import ConfigError
from tunesmith.generation import BASE, Engine, Request, SamplingParams
from tunesmith.generation.engine import Batch
from tunesmith.hparams import FinetuningArguments, ModelArguments, parse_run
from tunesmith.models.loader import inference_model_args, load_for_inference, load_model
from tunesmith.sft.command import run as sft_main

ROOT = Path(__file__).resolve().parents[3]
METHODS = ["prompt_tuning", "p_tuning", "prefix_tuning"]
MEMORISE = [
    [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    for question, answer in [("Who made you?", "The tunesmith team."), ("What is 2 plus 3?", "2 plus 3 is 5."),
                             ("Name a colour.", "Blue."), ("Say hi.", "Hi!")]
]
QUESTIONS = ["Who made you?", "Name a colour, please, in one word if you can.", "Hi"]  # three lengths: left padding
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def memorise_data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "memorise.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in MEMORISE))
    return str(path)


def flags(model_dir: str, data: str, out: Path, method: str, *extra: str) -> list[str]:
    return ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
            "--finetuning_type", method, "--num_virtual_tokens", "4", "--max_steps", "12",
            "--per_device_train_batch_size", "4", "--learning_rate", "0.3", "--lr_scheduler_type", "constant",
            "--logging_steps", "1", "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", *extra]


def losses(trainer) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


@pytest.fixture(scope="module")
def train_once(tmp_path_factory, chatty_model_dir, memorise_data):
    """method -> (method, trainer, output dir) of its one short run in this module."""
    runs: dict[str, tuple] = {}

    def train(method: str) -> tuple:
        if method not in runs:
            out = tmp_path_factory.mktemp(method)
            runs[method] = method, sft_main(flags(chatty_model_dir, memorise_data, out, method)), str(out)
        return runs[method]

    return train


@pytest.fixture(scope="module", params=METHODS)
def trained(request, train_once):
    return train_once(request.param)


def test_it_learns_only_the_virtual_tokens_and_saves_a_peft_adapter(trained, chatty_model_dir):
    method, trainer, out = trained
    first, last = losses(trainer)[0], losses(trainer)[-1]
    assert all(math.isfinite(x) for x in losses(trainer)) and last < first - 1.0, losses(trainer)
    model = trainer.model
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("prompt_encoder.") for n in trainable), trainable
    set_seed(0)  # as the run did before it made its adapter: the same starting virtual tokens
    start = load_model(ModelArguments(model_name_or_path=chatty_model_dir),
                       FinetuningArguments(finetuning_type=method, num_virtual_tokens=4))
    moved = model.get_prompt_embedding_to_save("default") - start.get_prompt_embedding_to_save("default")
    assert moved.abs().min() > 0  # every virtual value trained
    base = load_file(f"{chatty_model_dir}/model.safetensors")
    state = model.get_base_model().state_dict()
    dtype = torch.bfloat16 if trainer.args.bf16 else torch.float32  # --bf16 auto keeps a frozen base in bf16
    assert all(torch.equal(state[k], v.to(dtype)) for k, v in base.items()), "a base weight moved"

    config = json.loads(Path(out, "adapter_config.json").read_text())
    assert config["peft_type"] == method.upper() and config["num_virtual_tokens"] == 4
    assert list(load_file(f"{out}/adapter_model.safetensors")) == ["prompt_embeddings"]
    # p-tuning's MLP is not in PEFT's file (only its output is): kept beside it, for a resume
    assert os.path.isfile(f"{out}/prompt_encoder.safetensors") == (method == "p_tuning")


def greedy_through_peft_forward(model, prompt: list[int], stop_ids: set[int]) -> list[int]:
    """Greedy decoding by PEFT's own forward over the whole sequence at every step (no cache): the virtual
    tokens exactly as training put them in front."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if token in stop_ids:
                break
            ids.append(token)
    return ids[len(prompt):]


def test_the_engine_answers_as_peft_forward_and_the_base_as_the_base(trained, tokenizer):
    method, _, out = trained
    model, tokenizer = load_for_inference(inference_model_args(out, dtype="float32"))
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    engine = Engine(model, tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS)
    together = [c[0].token_ids for c in engine.generate(prompts, params)]  # one left-padded batch
    expected = [greedy_through_peft_forward(model, p, engine.stop_ids) for p in prompts]
    assert together == expected

    with model.disable_adapter():
        plain = [greedy_through_peft_forward(model.get_base_model(), p, engine.stop_ids) for p in prompts]
    assert [c[0].token_ids for c in engine.generate(prompts, params, adapter=BASE)] == plain != expected

    # The prompt's own log-probabilities (the completions API's echo) and the reply's, as PEFT's forward gives them
    request = Request(prompts[1], params.replace(prompt_logprobs=True, logprobs=True, max_new_tokens=2))
    batch = Batch(model, tokenizer)
    batch.admit([request])
    while len(batch):
        batch.step()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompts[1]])).logits[0, -len(prompts[1]):]  # after any virtual ones
    expected = torch.log_softmax(logits.float(), -1)
    got = [record.logprob for record in request.prompt_logprobs[1:]]
    assert got == pytest.approx([float(expected[t - 1, prompts[1][t]]) for t in range(1, len(prompts[1]))], abs=1e-4)
    first = request.completions[0].logprobs[0]
    assert first.logprob == pytest.approx(float(expected[-1, first.token_id]), abs=1e-4)

    if method != "prefix_tuning":
        # peft's generate() agrees with its forward here only without a KV cache (peft 0.21.2 looks for the
        # cache under the name transformers 5.24 no longer uses: see models/prompt_learning.py); prefix tuning's
        # not at all. So the engine is checked against the forward above, and against this
        for prompt, ours in zip(prompts, together):
            ids = torch.tensor([prompt])
            reply = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                   do_sample=False, use_cache=False, eos_token_id=sorted(engine.stop_ids),
                                   pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
            assert reply[:len(ours)] == ours


def test_rows_joining_a_running_batch_answer_as_alone(trained):
    """The server's case: requests join a batch mid-generation, their virtual columns left-padded to the
    running rows' (and a base-model row beside them, its virtual columns masked out)."""
    _, _, out = trained
    model, tokenizer = load_for_inference(inference_model_args(out, dtype="float32"))
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS)
    requests = [Request(prompts[0], params), Request(prompts[1], params), Request(prompts[2], params, adapter=BASE)]
    batch = Batch(model, tokenizer)
    batch.admit(requests[:1])
    batch.step()
    batch.admit(requests[1:])
    while len(batch):
        batch.step()
    engine = Engine(model, tokenizer)
    alone = [engine.generate([p], params, adapter=r.adapter)[0][0].token_ids for p, r in zip(prompts, requests)]
    assert [r.completions[0].token_ids for r in requests] == alone


def test_compare_and_chat_answer_with_the_adapter(train_once, tmp_path, monkeypatch, capsys):
    from tunesmith.chat import command as chat
    from tunesmith.evaluation import compare

    _, _, out = train_once("prompt_tuning")  # one method is enough: they share the engine path checked above
    model, tokenizer = load_for_inference(inference_model_args(out, dtype="float32"))
    stop_ids = Engine(model, tokenizer).stop_ids

    def text(m, question: str) -> str:
        ids = greedy_through_peft_forward(m, encode_prompt(tokenizer, [{"role": "user", "content": question}]),
                                          stop_ids)
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS))
    rows = compare.run(["--adapter_name_or_path", out, "--data_path", str(questions), "--max_new_tokens",
                        str(NEW_TOKENS), "--dtype", "float32"])
    with model.disable_adapter():
        base = [text(model.get_base_model(), q) for q in QUESTIONS]
    assert rows == list(zip(QUESTIONS, base, [text(model, q) for q in QUESTIONS]))

    capsys.readouterr()  # compare's table
    monkeypatch.setattr(sys, "stdin", io.StringIO("Who made you?\n"))
    chat.run(["--model_name_or_path", out, "--do_sample", "false", "--max_new_tokens", str(NEW_TOKENS),
              "--dtype", "float32", "--output", "jsonl"])
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["content"].strip() == text(model, "Who made you?")


def test_serve_answers_with_the_adapter(train_once, tmp_path):
    _, _, out = train_once("prefix_tuning")  # one server process: the method whose virtual tokens live in the cache
    model, tokenizer = load_for_inference(inference_model_args(out, dtype="float32"))
    stop_ids = Engine(model, tokenizer).stop_ids
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    expected = tokenizer.decode(greedy_through_peft_forward(model, encode_prompt(tokenizer, messages), stop_ids),
                                skip_special_tokens=True)
    with running_server(tmp_path / "server.log", "--model_name_or_path", out, "--dtype", "float32",
                        "--do_sample", "false", "--max_new_tokens", str(NEW_TOKENS)) as url:
        reply = httpx.post(f"{url}/v1/chat/completions", json={"model": Path(out).name, "messages": messages},
                           timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == expected


@pytest.mark.parametrize("method", METHODS)
def test_resume_continues_the_same_trajectory(method, chatty_model_dir, memorise_data, tmp_path):
    common = ("--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--per_device_train_batch_size",
              "2", "--learning_rate", "0.05")
    straight = sft_main(flags(chatty_model_dir, memorise_data, tmp_path / "straight", method, *common))
    checkpoint = tmp_path / "straight" / "checkpoint-2"
    resumed = sft_main(flags(chatty_model_dir, memorise_data, tmp_path / "resumed", method, *common,
                             "--resume_from_checkpoint", str(checkpoint)))
    assert [r["step"] for r in resumed.state.log_history if "loss" in r] == [1, 2, 3, 4]
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-4)  # steps 3 and 4 computed again
    saved = {name: load_file(f"{tmp_path}/{name}/adapter_model.safetensors")["prompt_embeddings"]
             for name in ("straight", "resumed")}
    assert torch.allclose(saved["straight"], saved["resumed"], rtol=1e-4, atol=1e-6)


def test_prompt_tuning_starts_from_the_init_text(tiny_model_dir, tokenizer):
    text = "Answer as the tunesmith assistant."
    model = load_model(ModelArguments(model_name_or_path=tiny_model_dir, dtype="float32"),
                       FinetuningArguments(finetuning_type="prompt_tuning", num_virtual_tokens=12,
                                           prompt_tuning_init_text=text))
    ids = tokenizer(text)["input_ids"]
    ids = (ids * 12)[:12]
    expected = model.get_input_embeddings().weight[ids]
    assert torch.equal(model.prompt_encoder["default"].embedding.weight.detach(), expected.detach())


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model_dir, tokenizer) -> dict[str, str]:
    """A prompt-tuning and a p-tuning adapter as PEFT alone saves them (no prompt_encoder.safetensors), and LoRA."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from tunesmith.models.prompt_learning import prompt_learning_config

    found = {"lora": save_random_adapter(tiny_model_dir, tokenizer, str(tmp_path_factory.mktemp("lora")), seed=1)}
    for method in ("prompt_tuning", "p_tuning"):
        out = str(tmp_path_factory.mktemp(method))
        config = prompt_learning_config(FinetuningArguments(finetuning_type=method, num_virtual_tokens=2), tiny_model_dir)
        get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config).save_pretrained(out)
        found[method] = out
    return found


ZERO3 = str(ROOT / "configs/ds_zero3.json")
REFUSED = [
    ("sft", ["--finetuning_type", "prompt_tuning", "--packing", "true"],
     r"--packing cannot be used with --finetuning_type prompt_tuning: PEFT puts the virtual tokens once"),
    ("sft", ["--finetuning_type", "p_tuning", "--prompt_tuning_init_text", "Hi"],
     r"--prompt_tuning_init_text .*use --finetuning_type prompt_tuning \(got p_tuning\)"),
    ("sft", ["--finetuning_type", "prefix_tuning", "--num_virtual_tokens", "0"],
     r"--num_virtual_tokens must be at least 1 \(got 0\)"),
    ("sft", ["--num_virtual_tokens", "8"],
     r"--num_virtual_tokens 8 sizes a prompt-based adapter: use --finetuning_type prompt_tuning, p_tuning or "
     r"prefix_tuning \(got lora\)"),
    ("sft", ["--finetuning_type", "prefix_tuning", "--gradient_checkpointing", "true"],
     r"--gradient_checkpointing cannot be used with --finetuning_type prefix_tuning"),
    ("sft", ["--finetuning_type", "prompt_tuning", "--label_smoothing_factor", "0.1"],
     r"--label_smoothing_factor cannot be used with --finetuning_type prompt_tuning"),
    ("sft", ["--finetuning_type", "p_tuning", "--deepspeed", ZERO3],
     r"--finetuning_type p_tuning cannot be used with ZeRO-3.*configs/ds_zero2.json"),
    ("sft", ["--finetuning_type", "prompt_tuning", "--quantization_bit", "4"],
     r"--quantization_bit with --finetuning_type prompt_tuning: not supported.*--finetuning_type lora for QLoRA"),
    ("sft", ["--adapter_name_or_path", "{prompt_tuning}"],
     r"is a prompt_tuning adapter: continue it with --finetuning_type prompt_tuning \(got lora\)"),
    ("sft", ["--finetuning_type", "prompt_tuning", "--adapter_name_or_path", "{lora}"],
     r"is a lora adapter: continue it with --finetuning_type lora \(got prompt_tuning\)"),
    ("sft", ["--finetuning_type", "p_tuning", "--adapter_name_or_path", "{p_tuning}"],
     r"a p_tuning adapter without prompt_encoder.safetensors"),
    ("reward", ["--finetuning_type", "prompt_tuning"], r"--finetuning_type prompt_tuning cannot train a reward model"),
    ("dpo", ["--adapter_name_or_path", "{prompt_tuning}"], r"--finetuning_type prompt_tuning cannot be used with DPO"),
    ("ppo", ["--finetuning_type", "prefix_tuning", "--reward_funcs", "exact_answer"],
     r"--finetuning_type prefix_tuning cannot be used with PPO/GRPO/RLOO"),
    ("merge", ["--adapter_name_or_path", "{prompt_tuning}", "--output_dir", "{tmp}/merged"],
     r"merge: .* is a prompt_tuning adapter: .*nothing to merge into the weights"),
    ("export", ["--model_name_or_path", "{p_tuning}", "--output_file", "{tmp}/m.gguf"],
     r"export: .* is a p_tuning adapter: .*nothing to merge into the weights.*llama.cpp has no virtual tokens"),
    ("serve", ["--model_name_or_path", "{lora}", "--adapter", "pt={prompt_tuning}"],
     r"--adapter: .* is a prompt_tuning adapter, which PEFT does not load beside other adapters"),
    ("chat", ["--model_name_or_path", "{prompt_tuning}", "--num_beams", "2"],
     r"--num_beams with the prompt_tuning adapter .*use --num_beams 1"),
    ("compare", ["--baseline", "{prompt_tuning}", "--adapter_name_or_path", "{lora}", "--num_beams", "2"],
     r"--num_beams with the prompt_tuning adapter"),
    ("eval", ["--model_name_or_path", "{prompt_tuning}", "--tasks", "tunesmith_identity"],
     r"--tasks: .* is a prompt_tuning adapter, and lm-eval .* tunesmith compare"),
]


@pytest.mark.parametrize("kind, argv, message", REFUSED, ids=[f"{k}-{'-'.join(a)[:40]}" for k, a, _ in REFUSED])
def test_what_cannot_work_is_refused_in_one_line(kind, argv, message, adapters, tmp_path):
    argv = [a.format(tmp=tmp_path, **adapters) for a in argv]
    if kind in ("sft", "reward", "dpo", "ppo", "compare"):
        argv += ["--data_path", "x.jsonl"]
    with pytest.raises(ConfigError, match=message) as refused:
        parse_run(kind, argv, check_paths=False)
    assert "\n" not in str(refused.value)


def test_merge_refuses_through_the_command_line(adapters, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "merge" / "merge_lora.py"), "--adapter_name_or_path",
                           adapters["prompt_tuning"], "--output_dir", str(tmp_path / "merged")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("tunesmith:")]
    assert "nothing to merge into the weights" in line and not (tmp_path / "merged").exists()
