"""Shared fixtures: the real SmolLM2 tokenizer and chat template, tiny random models built from a
config around it (fast tier), and the real 135M default model (slow tier)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

# Keep tests off any hub, and let the two CI cores run one test's maths without oversubscription.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# Preference pairs the reward and DPO tests train on: a short run learns to prefer the polite reply.
POLITE = ["Sure! Here is a clear and friendly answer for you.", "Happy to help: the answer is four.",
          "Of course, thank you for asking. It is Paris."]
RUDE = ["No.", "Figure it out yourself.", "Stop asking me things."]


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(autouse=True)
def no_zero3_loading_left_behind() -> Iterator[None]:
    """transformers' TrainingArguments with a ZeRO-3 config turns ZeRO-3's sharded loading on for the whole process
    (a weak reference that lives as long as the arguments do); a test that parses such a config and fails on purpose
    keeps them alive in its traceback, and every later from_pretrained in the same worker then starts DeepSpeed (no
    launcher here: it looks for MPI and stops). Each test ends with it off."""
    yield
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


@pytest.fixture(scope="session")
def default_model_path() -> str:
    from tunesmith.models.default_model import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import load_tokenizer

    return load_tokenizer(ModelArguments(model_name_or_path=default_model_path))


def build_tiny_model_dir(path, tokenizer, hidden_size: int = 64, layers: int = 2, seed: int = 0, **overrides) -> str:
    """A random LlamaForCausalLM (SmolLM2's architecture) with the real tokenizer, saved like a
    normal HF model directory; `overrides` sets LlamaConfig fields."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def build_spm_tokenizer(add_prefix: bool, vocab_size: int = 1500):
    """A SentencePiece-style tokenizer (BPE with byte fallback, spaces as ▁, as HF converts Llama 2's and
    Gemma's), trained here on the demo SFT data since none can be downloaded: add_prefix puts a ▁ before the
    text and BOS first (Llama 2), without it neither (Gemma); ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from tunesmith.data.template import BUILTIN_TEMPLATES

    space = "\u2581"
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence(([normalizers.Prepend(space)] if add_prefix else [])
                                          + [normalizers.Replace(" ", space)])
    tok.decoder = decoders.Sequence([decoders.Replace(space, " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if add_prefix else []))
    corpus = (ROOT / "data" / "demo" / "sft.jsonl").read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        show_progress=False))
    if add_prefix:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>",
                                   pad_token="</s>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    return fast


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def chatty_model_dir(tmp_path_factory, tokenizer) -> str:
    # Larger random weights than the shared tiny model (whose greedy reply is "\n" over and over): replies
    # with varied words, a byte token that never completes a character (decoded as U+FFFD), and
    # multiple-choice answers whose log-likelihoods differ.
    return build_tiny_model_dir(tmp_path_factory.mktemp("chatty"), tokenizer, initializer_range=0.2)


def save_random_adapter(model_dir: str, tokenizer, out: str, seed: int) -> str:
    """A LoRA adapter (r 4, every linear layer) with random B as well as A, so it changes the model's
    answers, saved with the tokenizer to `out`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunesmith.models.loader import find_lora_targets

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=4, lora_alpha=32, target_modules=find_lora_targets(model), init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def running_server(log: Path, *flags: str, timeout: float = 120) -> Iterator[str]:
    """A `chat/serve.py` process with these flags on a free port (`--port 0`) and one thread; yields its
    address once /health answers, stops it afterwards, and fails if its log holds a traceback."""
    # the repository first, then whatever the caller's path holds (the GPU kit's wheels live there)
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "chat" / "serve.py"), "--port", "0", *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        yield wait_until_healthy(proc, log, timeout)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def assert_openai_error(reply: httpx.Response, status: int, pattern: str) -> dict:
    """The reply is OpenAI's error object with this status, its message matching `pattern`; returns it."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert re.search(pattern, error["message"]), error
    assert error["type"] == "invalid_request_error" and set(error) == {"message", "type", "param", "code"}
    return error


def wait_until_healthy(proc: subprocess.Popen, log: Path, timeout: float = 120) -> str:
    """The address a `chat/serve.py` process logs (it listens on `--port 0`), once its /health answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", log.read_text())
        if found:
            try:
                if httpx.get(found[1] + "/health", timeout=5).status_code == 200:
                    return found[1]
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    raise AssertionError("the server did not come up: " + log.read_text()[-3000:])
