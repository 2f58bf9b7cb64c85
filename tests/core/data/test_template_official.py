"""Masking on official chat templates (tests/data/templates, sources in its README), installed as a new
user would with `--chat_template FILE` on the real SmolLM2 tokenizer, in conversations whose earlier
assistant turn carries reasoning. Each reply trains from where the model's generation begins at
inference: the first character after the generation prompt, or after the turn header where the
generation prompt pre-fills a block (Gemma 4's empty thought channel) the reply renders differently.
Each reply ends with its own end marker, never with text the template prints once after the whole
conversation (Phi's end-of-text)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.template import apply_chat_template_override, encode_examples, render_text

TEMPLATES = Path(__file__).parents[2] / "data" / "templates"


def conversation(first: dict, last: dict) -> list[dict]:
    return [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", **first},
            {"role": "user", "content": "And times 3?"}, {"role": "assistant", **last}]


REASONING_CONTENT = conversation({"content": "2+2 is 4.", "reasoning_content": "Add two and two."},
                                 {"content": "That makes 12.", "reasoning_content": "Multiply 4 by 3."})
THINK_IN_CONTENT = conversation({"content": "<think>Add two and two.</think>2+2 is 4."},
                                {"content": "<think>Multiply 4 by 3.</think>That makes 12."})


def with_template(tokenizer, name: str):
    tok = copy.deepcopy(tokenizer)
    apply_chat_template_override(tok, str(TEMPLATES / name))
    return tok


def trained(tok, enc) -> str:
    return tok.decode([t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX])


@pytest.mark.parametrize("messages", [REASONING_CONTENT, THINK_IN_CONTENT], ids=["reasoning_content", "think-in-content"])
def test_glm45_reasoning_turns_train_whole_thinking_blocks(tokenizer, messages):
    tok = with_template(tokenizer, "glm4_5.jinja")
    # GLM-4.5 drops the thinking of replies before the last user turn, so each reply is its own example.
    examples, expanded = encode_examples(tok, messages)
    assert expanded
    assert [trained(tok, ex) for ex in examples] == ["\n<think>Add two and two.</think>\n2+2 is 4.",
                                                     "\n<think>Multiply 4 by 3.</think>\nThat makes 12."]
    # The later reply trains from the first character after the generation prompt.
    prompt = render_text(tok, messages[:3], add_generation_prompt=True)
    assert render_text(tok, messages)[len(prompt):] == trained(tok, examples[1])


@pytest.mark.parametrize("template", ["gemma4.jinja", "gemma4_dense.jinja"])
def test_gemma4_reasoning_turns_train_from_the_reply_header(tokenizer, template):
    """E2B's generation prompt ends `<|turn>model\n`, a prefix of the reply. The dense checkpoints' ends
    `<|turn>model\n<|channel>thought\n<channel|>`: not a prefix of a reply that renders its own thought
    channel or a `<think>` block, so where the renders part (inside `<|channel>thought\n`, or after the `<`
    of `<think>`) is no place to start; the reply trains from its header on in both."""
    tok = with_template(tokenizer, template)
    prompt = render_text(tok, REASONING_CONTENT[:3], add_generation_prompt=True)
    assert prompt.endswith("<|turn>model\n<|channel>thought\n<channel|>" if "dense" in template else "<|turn>model\n")
    examples, expanded = encode_examples(tok, REASONING_CONTENT)
    assert [trained(tok, ex) for ex in examples] == [
        "<|channel>thought\nAdd two and two.\n<channel|>2+2 is 4.<turn|>",
        "<|channel>thought\nMultiply 4 by 3.\n<channel|>That makes 12.<turn|>"]
    (whole,), expanded = encode_examples(tok, THINK_IN_CONTENT)
    assert not expanded
    assert trained(tok, whole) == ("<think>Add two and two.</think>2+2 is 4.<turn|>"
                                   "<think>Multiply 4 by 3.</think>That makes 12.<turn|>")


# Phi-3.5's and Phi-4-mini's tokenizers: the role and end markers are special tokens, eos is <|endoftext|>.
PHI_SPECIAL = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
THREE_TURNS = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "2+2 is 4."},
               {"role": "user", "content": "And times 3?"}, {"role": "assistant", "content": "That makes 12."},
               {"role": "user", "content": "Minus 2?"}, {"role": "assistant", "content": "Ten."}]


def trained_runs(tok, enc) -> list[str]:
    """The trained tokens, one decoded text per run of consecutive trained tokens."""
    runs, run = [], []
    for token, label in [*zip(enc.input_ids, enc.labels), (None, IGNORE_INDEX)]:
        if label != IGNORE_INDEX:
            run.append(token)
        elif run:
            runs.append(tok.decode(run))
            run = []
    return runs


@pytest.mark.parametrize("template, closing", [("phi3_5.jinja", "<|end|>\n<|endoftext|>"),
                                               ("phi4_mini.jinja", "<|end|><|endoftext|>")])
def test_phi_replies_train_to_their_end_marker_not_the_closing_end_of_text(tokenizer, template, closing):
    """Phi prints `{{ eos_token }}` once, after the last turn: every reply, first, middle and last,
    trains its text and `<|end|>`, and the closing `<|endoftext|>` trains in none."""
    tok = with_template(tokenizer, template)
    tok.add_special_tokens({"eos_token": "<|endoftext|>", "additional_special_tokens": PHI_SPECIAL})
    assert render_text(tok, THREE_TURNS).endswith("Ten." + closing)
    (whole,), expanded = encode_examples(tok, THREE_TURNS)
    assert not expanded
    assert trained_runs(tok, whole) == ["2+2 is 4.<|end|>", "That makes 12.<|end|>", "Ten.<|end|>"]
    assert whole.input_ids[-1] == tok.eos_token_id and whole.labels[-1] == IGNORE_INDEX
    assert whole.replies_without_end_marker == 0
    (last,), _ = encode_examples(tok, THREE_TURNS, train_on="last_assistant")
    assert trained_runs(tok, last) == ["Ten.<|end|>"]
