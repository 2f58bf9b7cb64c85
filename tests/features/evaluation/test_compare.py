"""The quickstart's base-vs-fine-tuned table: batched greedy answers are the answers each question
gets alone, from the base model (adapter disabled) and from base + adapter."""

from __future__ import annotations

import json
import os

import pytest
import torch
import wcwidth
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tests.helpers.tiny_models import save_random_adapter
from tunesmith.data.template import encode_prompt
from tunesmith.errors import DataError
from tunesmith.evaluation import compare

QUESTIONS = ["Who are you?", "What is the capital of France, and why is it famous?", "你是谁？"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tiny_model_dir, tokenizer) -> str:
    return save_random_adapter(tiny_model_dir, tokenizer, str(tmp_path_factory.mktemp("adapter")), seed=3)


def alone(model, tokenizer, question: str, max_new_tokens: int) -> str:
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": question}])])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def test_batched_answers_equal_answers_alone(adapter, tiny_model_dir, tokenizer, tmp_path, capsys):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS), encoding="utf-8")
    rows = compare.run(["--adapter_name_or_path", adapter, "--data_path", str(prompts), "--max_new_tokens", "12",
                        "--count_word", "Tunesmith"])

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    expected_base = [alone(base, tokenizer, q, 12) for q in QUESTIONS]
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter).eval()
    expected_tuned = [alone(tuned, tokenizer, q, 12) for q in QUESTIONS]
    assert expected_base != expected_tuned  # the adapter changes the answers, so the columns can be told apart
    assert rows == list(zip(QUESTIONS, expected_base, expected_tuned))
    assert f"answers containing 'Tunesmith': base 0/{len(QUESTIONS)}" in capsys.readouterr().out


def test_a_row_without_a_prompt_names_file_and_line(adapter, tmp_path):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi"}) + "\n" + json.dumps({"question": "Hi"}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"q\.jsonl:line 2: unknown prompt format \(keys: \['question'\]\)"):
        compare.run(["--adapter_name_or_path", adapter, "--data_path", str(prompts)])


def test_tool_calls_are_found_and_scored():
    from tunesmith.data.call_scores import first_call, score_calls

    answers = ['<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
               'Sure {not json} then {"name": "convert_currency", "arguments": {"amount": 5.0, "from": "USD", "to": "EUR"}}',
               '{"name": "get_time", "arguments": {"city": "Rome"}}',
               "It is sunny."]
    expected = [{"name": "get_weather", "arguments": {"city": "Oslo"}},
                {"name": "convert_currency", "arguments": {"amount": 5, "from": "USD", "to": "EUR"}},
                {"name": "get_weather", "arguments": {"city": "Rome"}},
                {"name": "get_weather", "arguments": {"city": "Lima"}}]
    assert first_call(answers[3]) is None and first_call(answers[1])["name"] == "convert_currency"
    assert score_calls(answers, expected) == {"well_formed": 3, "right_function": 2, "right_arguments": 2}


def test_any_two_models_compare_and_wide_characters_line_up(adapter, tiny_model_dir, tokenizer, tmp_path, capsys):
    """--baseline puts any model or adapter in the left column; the divider stands in the same terminal
    column on every line, whatever mix of CJK, emoji and ASCII the answers hold."""
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS), encoding="utf-8")
    rows = compare.run(["--baseline", adapter, "--model_name_or_path", tiny_model_dir, "--data_path", str(prompts),
                        "--max_new_tokens", "12"])
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert rows == [(q, alone(tuned, tokenizer, q, 12), alone(base, tokenizer, q, 12)) for q in QUESTIONS]
    out = capsys.readouterr().out
    assert f"  {os.path.basename(adapter)}" in out and "| " + os.path.basename(tiny_model_dir) in out

    capsys.readouterr()
    compare.print_side_by_side([("q", "你好，世界！🎉 这是一个很长的回答，用来换行。", "plain ascii words here"),
                                ("q2", "naïve café", "表情 😀😀 emoji")], 10, ("左边", "right"))
    table = [line for line in capsys.readouterr().out.splitlines() if " | " in line]
    assert len(table) > 4 and {wcwidth.width(line.split(" | ")[0]) for line in table} == {12}
    assert any("你" in line for line in table) and any("😀" in line for line in table)
