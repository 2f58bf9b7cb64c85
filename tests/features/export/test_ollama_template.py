"""The Ollama Modelfile, read and rendered by Go as Ollama reads and renders it (tests/go/
render_ollama_template.go: Go's text/template with Ollama's data and rules), gives the prompt the Jinja
chat template gives with add_generation_prompt, on conversations with and without a system prompt,
several turns, CJK and emoji; and it carries the stop tokens, `tunesmith chat`'s sampling settings and
the --max_seq_length the model was trained with. Needs Go (`apt-get install golang-go`); skipped
without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tunesmith.data.template import BUILTIN_TEMPLATES, render_text
from tunesmith.export.checks import CHECK_CONVERSATIONS
from tunesmith.export.ollama import modelfile_text, ollama_chat, ollama_parameters, training_record
from tunesmith.hparams import ModelArguments
from tunesmith.models.loader import load_tokenizer

GO_PROGRAM = Path(__file__).parents[2] / "go" / "render_ollama_template.go"

Renderer = Callable[[str, list], tuple[list[list[str]], list[str]]]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],  # the template's default system prompt, if it has one
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who are you?"}],
    [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "你是一个乐于助人的助手。Reply in the user's language."},
     {"role": "user", "content": "用一句话介绍你自己。"}, {"role": "assistant", "content": "我是一个助手 🤖。"},
     {"role": "user", "content": "Emoji: 👨‍👩‍👧 🇫🇷 👍🏽 ❤️, 日本語とカタカナ, 한국어."}],
    # Text that is template syntax in Go or Jinja, quotes, markup and edge whitespace: data, rendered as is.
    [{"role": "user", "content": '  {{ .Content }} {% if x %}{{ end }} """quoted""" <b>&amp;</b>\n\n\tTabbed.\n'},
     {"role": "assistant", "content": ""}, {"role": "user", "content": "\n"}],
    [{"role": "system", "content": "Only a system prompt."}],
    *[c for c in CHECK_CONVERSATIONS if c[-1]["role"] == "user"],
]


@pytest.fixture(scope="session")
def go_render(tmp_path_factory) -> Renderer:
    """render(modelfile, conversations) -> (the Modelfile's commands as Ollama reads them, the prompts), by
    the Go program, built once per session."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed (`apt-get install golang-go`): the Modelfile's TEMPLATE is not "
                    "rendered with Go's text/template")
    folder = tmp_path_factory.mktemp("go")
    env = dict(os.environ)
    if not any(env.get(k) for k in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(folder / "cache")
    binary = folder / "render_ollama_template"
    subprocess.run([go, "build", "-o", str(binary), str(GO_PROGRAM)], check=True, env=env, cwd=folder,
                   capture_output=True, timeout=300)

    def render(modelfile: str, conversations: list) -> tuple[list[list[str]], list[str]]:
        request = json.dumps({"modelfile": modelfile, "conversations": conversations})
        proc = subprocess.run([str(binary)], input=request, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        reply = json.loads(proc.stdout)
        return reply["commands"], reply["renders"]

    return render


@pytest.fixture(scope="module")
def own_tokenizer(default_model_path):
    """A tokenizer of the module's own, whose chat template the tests replace."""
    return load_tokenizer(ModelArguments(model_name_or_path=default_model_path))


def _with_template(tokenizer, name: str):
    tokenizer.chat_template = BUILTIN_TEMPLATES[name].read_text(encoding="utf-8")
    return tokenizer


def _modelfile(tokenizer) -> str:
    chat, why = ollama_chat(tokenizer)
    assert chat is not None, why
    return modelfile_text("model.gguf", chat, "source", ollama_parameters(None, None))


# Every template the export writes a Modelfile for: SmolLM2's own (ChatML with a default system prompt) and
# the built-in ones a run may train with (--chat_template chatml / chatml_tools).
@pytest.mark.parametrize("template", ["smollm2", "chatml", "chatml_tools"])
def test_modelfile_template_renders_in_go_as_the_jinja_template(template, tokenizer, own_tokenizer, go_render):
    if template != "smollm2":
        tokenizer = _with_template(own_tokenizer, template)
    _, renders = go_render(_modelfile(tokenizer), CONVERSATIONS)
    for conversation, got in zip(CONVERSATIONS, renders, strict=True):
        assert got == render_text(tokenizer, conversation, add_generation_prompt=True), conversation

    # A request that ends with an assistant message: Ollama continues that reply, as Jinja's
    # continue_final_message renders it.
    prefill = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, or"}]
    _, [got] = go_render(_modelfile(tokenizer), [prefill])
    assert got == tokenizer.apply_chat_template(prefill, tokenize=False, continue_final_message=True)


def test_consecutive_messages_of_one_role_are_joined_by_ollama(tokenizer, go_render):
    # Ollama joins them before the template runs ("\n\n" between); no TEMPLATE can undo that, so there the
    # prompt differs from the Jinja template's, which renders two turns.
    two = [{"role": "user", "content": "First part."}, {"role": "user", "content": "Second part."}]
    _, [got] = go_render(_modelfile(tokenizer), [two])
    joined = [{"role": "user", "content": "First part.\n\nSecond part."}]
    assert got == render_text(tokenizer, joined, True) != render_text(tokenizer, two, True)


def test_tools_are_refused_by_ollama_rather_than_dropped(own_tokenizer):
    # chatml_tools renders offered tools and tool calls with Jinja's tojson, which Ollama's json function
    # (compact, keys sorted) cannot reproduce: the TEMPLATE reads no .Tools, so Ollama answers a request
    # with tools "does not support tools" instead of dropping them.
    chat, _ = ollama_chat(_with_template(own_tokenizer, "chatml_tools"))
    assert ".Tools" not in chat.template and "ToolCalls" not in chat.template


def test_exported_modelfile_carries_the_stops_sampling_and_trained_length(tiny_model_dir, tokenizer, tmp_path,
                                                                          go_render):
    from tunesmith.export.command import run as export
    from tunesmith.sft.command import run as sft

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"},
                                                     {"role": "assistant", "content": f"Answer {i}."}]}) + "\n"
                            for i in range(4)))
    adapter = tmp_path / "adapter"
    sft(["--model_name_or_path", tiny_model_dir, "--data_path", str(data), "--output_dir", str(adapter),
         "--max_steps", "1", "--per_device_train_batch_size", "2", "--lora_r", "4", "--max_seq_length", "384",
         "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none"])
    out = tmp_path / "gguf" / "tiny.gguf"
    export(["--model_name_or_path", str(adapter), "--output_file", str(out), "--dtype", "f32"])

    commands, renders = go_render((tmp_path / "gguf" / "tiny.Modelfile").read_text(encoding="utf-8"), CONVERSATIONS)
    read = {}
    for name, value in commands:
        read.setdefault(name, []).append(value)
    assert read["model"] == ["./tiny.gguf"] and read["stop"] == ["<|im_end|>"]
    assert read["system"] == ["You are a helpful AI assistant named SmolLM, trained by Hugging Face"]
    # `tunesmith chat`'s defaults (Ollama's own: temperature 0.8, top_k 40, repeat_penalty 1.1, no limit) and
    # the training run's --max_seq_length as the context length.
    assert {k: v[0] for k, v in read.items() if k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                                                       "num_predict", "num_ctx")} == {
        "temperature": "0.7", "top_p": "0.9", "top_k": "50", "min_p": "0", "repeat_penalty": "1",
        "num_predict": "512", "num_ctx": "384"}
    for conversation, got in zip(CONVERSATIONS, renders, strict=True):
        assert got == render_text(tokenizer, conversation, add_generation_prompt=True)


def test_the_training_record_is_found_through_a_merge(tmp_path):
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    adapter.mkdir()
    merged.mkdir()
    (adapter / "tunesmith_config.json").write_text(json.dumps({"SFTDataArguments": {"max_seq_length": 256}}))
    (merged / "tunesmith_config.json").write_text(json.dumps({
        "ModelArguments": {"model_name_or_path": "base", "adapter_name_or_path": str(adapter)},
        "MergeArguments": {"output_dir": str(merged)}}))
    assert training_record(str(merged), None) == {"SFTDataArguments": {"max_seq_length": 256}}
    assert ollama_parameters(str(merged), None)["num_ctx"] == 256
    assert "num_ctx" not in ollama_parameters(str(tmp_path), None)  # nothing recorded: Ollama's default


def test_a_default_system_prompt_a_modelfile_cannot_carry_is_named(tokenizer, own_tokenizer):
    # Ollama's Modelfile reader drops format and control characters (here a zero-width joiner).
    own_tokenizer.chat_template = tokenizer.chat_template.replace("named SmolLM", "named Smol\u200dLM")
    chat, why = ollama_chat(own_tokenizer)
    assert chat is None and why == "its default system prompt has characters a Modelfile drops (control or format " \
                                   "characters)"
