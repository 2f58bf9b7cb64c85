"""Masking by meaning across template families. Each template here is our own, written from the
format a model card documents (Phi's end-of-text only at the end, Qwen3's thinking block on the last
reply only, DeepSeek R1's generation prompt that opens `<think>`, GLM's turns with no end marker,
Nemotron's refusal of a system message alone, `{% generation %}` markers, tool calls), on the real
SmolLM2 tokenizer with the family's markers added as special tokens."""

from __future__ import annotations

import copy

import pytest

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.template import TemplateError, encode_conversation, encode_examples, render_text, truncate

CHATML_TURN = "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
GEN_PROMPT = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

PHI_LIKE = ("{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")
QWEN3_LIKE = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}{% for m in messages %}{% if m.role == 'assistant' and loop.index0 > ns.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' + m.content "
    "+ '<|im_end|>\\n' }}{% else %}" + CHATML_TURN + "{% endif %}{% endfor %}" + GEN_PROMPT
)
DEEPSEEK_LIKE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{ '<|User|>' + m.content }}"
    "{% elif m.role == 'assistant' %}{% set c = m.content %}{% if '</think>' in c %}{% set c = c.split('</think>')[-1] %}"
    "{% endif %}{{ '<|Assistant|>' + c + '<|eos|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}"
)
GLM_LIKE = ("{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
NEMOTRON_LIKE = ("{% if messages[-1].role == 'system' %}{{ raise_exception('a system message cannot come alone') }}"
                 "{% endif %}{% for m in messages %}" + CHATML_TURN + "{% endfor %}" + GEN_PROMPT)
GENERATION_MARKED = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}"
    "{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}" + CHATML_TURN + "{% endif %}{% endfor %}"
    + GEN_PROMPT
)
TOOLS_JSON = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' + (m.content or '') }}{% for c in m.tool_calls or [] %}"
    "{{ '<tool_call>' + {'name': c.function.name, 'arguments': c.function.arguments} | tojson + '</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% elif m.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>' + m.content + '</tool_response><|im_end|>\\n' }}"
    "{% else %}" + CHATML_TURN + "{% endif %}{% endfor %}" + GEN_PROMPT
)
# DeepSeek joins the arguments as text: a mapping there is a TypeError inside the template.
TOOLS_TEXT = TOOLS_JSON.replace(
    "{{ '<tool_call>' + {'name': c.function.name, 'arguments': c.function.arguments} | tojson + '</tool_call>' }}",
    "{{ '<tool_call>' + c.function.name + '\\n' + c.function.arguments + '</tool_call>' }}",
)

TWO_TURNS = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 is 4."},
    {"role": "user", "content": "And times 3?"},
    {"role": "assistant", "content": "That makes 12."},
]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "It is 18C and sunny in Paris."},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def family(tokenizer, template: str, *markers: str):
    tok = copy.deepcopy(tokenizer)
    if markers:
        tok.add_special_tokens({"additional_special_tokens": list(markers)})
    tok.chat_template = template
    return tok


def trained_pieces(tok, enc) -> str:
    return tok.decode([t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX])


def test_a_reply_that_starts_with_whitespace_trains_every_character(tokenizer):
    messages = [{"role": "user", "content": "Indent it"}, {"role": "assistant", "content": "  indented"}]
    enc = encode_conversation(tokenizer, messages)
    # SmolLM2's tokenizer merges the header's newline with the reply's first space into one token.
    assert trained_pieces(tokenizer, enc).endswith("  indented<|im_end|>")


def test_phi_end_of_text_only_when_not_generating_does_not_refuse_multi_turn(tokenizer):
    tok = family(tokenizer, PHI_LIKE, "<|user|>", "<|assistant|>", "<|end|>")
    examples, expanded = encode_examples(tok, TWO_TURNS)
    assert not expanded and len(examples) == 1
    # The end-of-text printed once after the last turn is the conversation's, not the last reply's.
    assert trained_pieces(tok, examples[0]) == "2+2 is 4.<|end|>That makes 12.<|end|>"


def test_qwen3_history_rewrite_expands_into_one_example_per_reply(tokenizer):
    tok = family(tokenizer, QWEN3_LIKE, "<think>", "</think>")
    examples, expanded = encode_examples(tok, TWO_TURNS)
    assert expanded and len(examples) == 2
    assert trained_pieces(tok, examples[0]) == "<think>\n\n</think>\n\n2+2 is 4.<|im_end|>"
    # The second example holds the first reply as the template renders history (no think block), untrained.
    second = examples[1]
    assert tok.decode(second.input_ids) == render_text(tok, TWO_TURNS)
    assert trained_pieces(tok, second) == "<think>\n\n</think>\n\nThat makes 12.<|im_end|>"
    with pytest.raises(TemplateError, match=r"check `reply located` failed: .*reply 1.*--multi_turn expand"):
        encode_examples(tok, TWO_TURNS, multi_turn="whole")
    # Only the last reply trains: it can be located in the whole conversation, nothing is refused.
    (last,), expanded = encode_examples(tok, TWO_TURNS, train_on="last_assistant")
    assert not expanded and trained_pieces(tok, last) == "<think>\n\n</think>\n\nThat makes 12.<|im_end|>"


def test_deepseek_generation_prompt_that_opens_a_thinking_block_is_located(tokenizer):
    tok = family(tokenizer, DEEPSEEK_LIKE, "<|User|>", "<|Assistant|>", "<|eos|>")
    enc = encode_conversation(tok, TWO_TURNS[:2])
    assert trained_pieces(tok, enc) == "2+2 is 4.<|eos|>"
    assert enc.replies_without_end_marker == 0


def test_glm_replies_with_no_end_marker_are_counted(tokenizer):
    tok = family(tokenizer, GLM_LIKE, "<|user|>", "<|assistant|>")
    enc = encode_conversation(tok, TWO_TURNS)
    assert trained_pieces(tok, enc) == "2+2 is 4.That makes 12."
    assert enc.replies_without_end_marker == 2


def test_a_system_message_is_never_rendered_alone(tokenizer):
    tok = family(tokenizer, NEMOTRON_LIKE)
    enc = encode_conversation(tok, [{"role": "system", "content": "Be brief."}, *TWO_TURNS])
    assert trained_pieces(tok, enc) == "2+2 is 4.<|im_end|>That makes 12.<|im_end|>"


def test_generation_markers_decide_and_loss_false_still_applies(tokenizer):
    tok = family(tokenizer, GENERATION_MARKED)
    enc = encode_conversation(tok, TWO_TURNS)
    assert trained_pieces(tok, enc) == "2+2 is 4.<|im_end|>That makes 12.<|im_end|>"
    quiet_first = [dict(m) for m in TWO_TURNS]
    quiet_first[1]["loss"] = False
    assert trained_pieces(tok, encode_conversation(tok, quiet_first)) == "That makes 12.<|im_end|>"


@pytest.mark.parametrize("template", [TOOLS_JSON, TOOLS_TEXT], ids=["arguments-as-mapping", "arguments-as-text"])
def test_tool_calls_train_and_tool_results_do_not(tokenizer, template):
    tok = family(tokenizer, template, "<tool_call>", "</tool_call>")
    enc = encode_conversation(tok, TOOL_CHAT, tools=TOOLS)
    text = tok.decode(enc.input_ids)
    assert "get_weather" in text.split("<|im_start|>user")[0]  # the tool list reached the template
    pieces = trained_pieces(tok, enc)
    assert "<tool_call>" in pieces and "Paris" in pieces and "It is 18C and sunny in Paris.<|im_end|>" in pieces
    assert "18C, sunny" not in pieces  # the tool result is context


def test_last_assistant_truncation_never_half_trains(tokenizer):
    long_history = [{"role": "user", "content": "Tell me a long story. " * 20},
                    {"role": "assistant", "content": "Once upon a time " * 20}, *TWO_TURNS[2:]]
    enc = encode_conversation(tokenizer, long_history, train_on="last_assistant")
    cut = truncate(enc, len(enc.input_ids) - 3)
    assert cut.input_ids == [] and trained_pieces(tokenizer, enc) == "That makes 12.<|im_end|>"


def test_one_token_over_because_of_the_trailing_newline_keeps_the_last_reply(tokenizer):
    enc = encode_conversation(tokenizer, TWO_TURNS)
    assert tokenizer.decode(enc.input_ids[-1]) == "\n"
    cut = truncate(enc, len(enc.input_ids) - 1)
    assert cut.input_ids == enc.input_ids[:-1] and trained_pieces(tokenizer, cut) == trained_pieces(tokenizer, enc)


def test_a_tool_answer_that_does_not_fit_leaves_the_call_whole_and_the_answer_out(tokenizer):
    tok = family(tokenizer, TOOLS_JSON, "<tool_call>", "</tool_call>")
    long_answer = [*TOOL_CHAT[:3], {"role": "assistant", "content": "It is sunny. " * 30}]
    enc = encode_conversation(tok, long_answer, tools=TOOLS)
    cut = truncate(enc, len(enc.input_ids) - 10)
    assert trained_pieces(tok, cut).endswith("</tool_call><|im_end|>") and "sunny" not in trained_pieces(tok, cut)
