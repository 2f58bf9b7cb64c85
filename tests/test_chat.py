"""Chat: truncation to the token budget (whole turns, system prompt kept), commands, streamed
replies rendered by the training template, /save as training data, and the CLI from a pipe."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tunesmith.chat.engine import ChatSession
from tunesmith.data.formats import load_conversations
from tunesmith.data.template import encode_prompt, render_text
from tunesmith.errors import ConfigError
from tunesmith.hparams import GenerationArguments, check

REPO = Path(__file__).resolve().parents[1]


def _turns(n: int) -> list[dict]:
    messages = []
    for i in range(n):
        messages += [{"role": "user", "content": f"Question number {i}: " + "tell me more " * (i + 1)},
                     {"role": "assistant", "content": f"Answer number {i}: " + "here is more " * (i + 1)}]
    return messages


def test_truncation_drops_oldest_whole_turns_and_keeps_the_system_prompt(tokenizer):
    history, system, new = _turns(6), {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Next?"}
    # Room for the last 3 turns and the reply before them, but not for that reply's question.
    budget = len(encode_prompt(tokenizer, [system] + history[-7:] + [new]))
    session = ChatSession(None, tokenizer, max_prompt_length=budget, system=system["content"])
    session.messages = list(history)

    window = session.context("Next?")

    assert window == [system] + history[-6:] + [new]
    assert len(encode_prompt(tokenizer, [system] + history[-8:] + [new])) > budget  # a 4th turn would not fit
    assert session.conversation() == [system] + history  # /save still has the whole conversation


def test_truncation_keeps_the_templates_default_system_prompt(tokenizer):
    history, new = _turns(4), {"role": "user", "content": "Hello"}
    budget = len(encode_prompt(tokenizer, history[-5:] + [new]))  # the template adds its own system prompt
    session = ChatSession(None, tokenizer, max_prompt_length=budget)
    session.messages = list(history)

    window = session.context("Hello")

    assert window == history[-4:] + [new]
    assert render_text(tokenizer, window).startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_a_message_too_long_for_the_budget_is_refused_and_history_kept(tokenizer):
    history, hi = _turns(1), {"role": "user", "content": "Hi"}
    budget = len(encode_prompt(tokenizer, history + [hi]))
    session = ChatSession(None, tokenizer, max_prompt_length=budget)
    session.messages = list(history)

    outcome = session.handle("word " * 100)

    assert outcome.kind == "error"
    assert f"more than --max_prompt_length {budget}: shorten them or raise --max_prompt_length" in outcome.text
    assert session.context("Hi") == history + [hi]  # the refused message did not push the history out


def test_commands(tokenizer, tmp_path):
    session = ChatSession(None, tokenizer)
    session.messages = _turns(2)
    saved = tmp_path / "chats.jsonl"

    assert session.handle("  ").kind == "nothing"
    assert session.handle("/system Be brief.").kind == "info" and session.system == "Be brief."
    assert session.handle(f"/save {saved}").text == f"saved 5 messages to {saved}"
    session.handle("/system")
    assert session.system is None
    assert session.handle(f"/save {saved}").kind == "info"
    assert session.handle("clear").kind == "info" and session.messages == []
    assert session.handle(f"/save {saved}").text.endswith("nothing to save yet: the conversation is empty")
    assert session.handle("/save").text == "usage: /save FILE"
    assert session.handle("/sytem hi").text.startswith("unknown command /sytem; commands: clear")
    assert [session.handle(w).kind for w in ("quit", "EXIT", "stop")] == ["quit"] * 3

    rows = load_conversations([str(saved)])  # the SFT data loader reads what /save wrote
    assert [c.messages for c in rows] == [[{"role": "system", "content": "Be brief."}] + _turns(2), _turns(2)]


@pytest.mark.parametrize("flags, message", [
    (dict(temperature=0.0), r"--temperature must be above 0 when sampling \(got 0.0\); for deterministic replies "
     "pass --do_sample false instead"),
    (dict(top_p=1.5), r"--top_p must be in \(0, 1\] \(got 1.5\)"),
    (dict(max_new_tokens=0), r"--max_new_tokens must be at least 1 \(got 0\)"),
])
def test_generation_flags_are_checked(flags, message):
    with pytest.raises(ConfigError, match=message):
        check(generation=GenerationArguments(**flags))
    check(generation=GenerationArguments(do_sample=False, temperature=0.0))  # greedy decoding ignores the temperature


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _greedy(model, tokenizer, messages, max_new_tokens) -> str:
    ids = torch.tensor([encode_prompt(tokenizer, messages)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_replies_stream_and_use_the_training_template_with_history(tiny_model, tokenizer):
    session = ChatSession(tiny_model, tokenizer, GenerationArguments(do_sample=False, max_new_tokens=6))
    pieces: list[str] = []

    first = session.handle("Hello there", on_text=pieces.append)
    second = session.handle("And again")

    assert first.kind == "answer" and "".join(pieces) == first.text and len(pieces) >= 1
    assert first.text == _greedy(tiny_model, tokenizer, [{"role": "user", "content": "Hello there"}], 6)
    assert second.text == _greedy(tiny_model, tokenizer, session.messages[:3], 6)  # the history was in the prompt
    assert [m["role"] for m in session.messages] == ["user", "assistant"] * 2


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def _run_cli(argv, stdin, monkeypatch, capsys) -> tuple[str, str]:
    from tunesmith.recipes.chat import run

    monkeypatch.setattr(sys, "stdin", stdin)
    run(argv)
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_cli_from_a_pipe_prints_only_answers_and_stops_at_quit(tiny_model_dir, tmp_path, monkeypatch, capsys):
    saved = tmp_path / "chat.jsonl"
    script = f"Hello\n/system Be brief.\nHow are you?\n/save {saved}\nquit\nNever asked\n"
    out, err = _run_cli(["--model_name_or_path", tiny_model_dir, "--do_sample", "false", "--max_new_tokens", "5"],
                        _Pipe(script), monkeypatch, capsys)

    (line,) = saved.read_text(encoding="utf-8").splitlines()  # a random tiny model's reply may be empty,
    answers = [m["content"] for m in json.loads(line)["messages"] if m["role"] == "assistant"]  # which SFT refuses
    assert len(answers) == 2 and out == "".join(a + "\n" for a in answers)
    assert f"saved 5 messages to {saved}" in err and "User:" not in out + err


def test_cli_ends_cleanly_on_ctrl_c(tiny_model_dir, monkeypatch, capsys):
    class Interrupted(_Pipe):
        def readline(self, *args):
            raise KeyboardInterrupt

    out, _ = _run_cli(["--model_name_or_path", tiny_model_dir], Interrupted(), monkeypatch, capsys)
    assert out == ""


@pytest.mark.slow
def test_chat_pipe_with_the_default_model_remembers_until_clear(tmp_path):
    saved = tmp_path / "chat.jsonl"
    # The 4-bit-sourced 135M model does not recall "My name is Alice and I like tea." when asked
    # "What is my name?" (it answers with a name of its own), but it does carry this greeting over.
    script = f"Hi, I'm Alice!\nWhat's my name?\n/save {saved}\nclear\nWhat's my name?\n/save {saved}\n"
    run = subprocess.run(
        [sys.executable, str(REPO / "chat" / "cli.py"), "--do_sample", "false", "--max_new_tokens", "20"],
        input=script, capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]

    answers = [m["content"] for c in load_conversations([str(saved)]) for m in c.messages if m["role"] == "assistant"]
    assert len(answers) == 3
    assert run.stdout == "".join(a + "\n" for a in answers)  # answers only: no banner, labels or notes
    assert "Alice" in answers[1]
    assert "Alice" not in answers[2]
