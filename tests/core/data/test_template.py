"""Masking with the real SmolLM2 tokenizer: the input is exactly the chat-template render, and the
trained tokens are exactly each assistant reply plus its end-of-turn token."""

from __future__ import annotations

import pytest

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.template import (
    TemplateError,
    apply_chat_template_override,
    encode_conversation,
    encode_prompt,
    truncate,
)

MULTI_TURN = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 is 4."},
    {"role": "user", "content": "And times 3?"},
    {"role": "assistant", "content": "That makes 12."},
]
WITH_SYSTEM = [{"role": "system", "content": "You are Tunesmith."}, *MULTI_TURN]
CHINESE = [
    {"role": "user", "content": "你叫什么名字？"},
    {"role": "assistant", "content": "我是 Tunesmith，一个人工智能助手。"},
    {"role": "user", "content": "谢谢！"},
    {"role": "assistant", "content": "不客气！"},
]


def trained_text(tokenizer, enc) -> str:
    return tokenizer.decode([i for i, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX])


def assistant_text(tokenizer, messages) -> str:
    return "".join(m["content"] + tokenizer.eos_token for m in messages if m["role"] == "assistant")


@pytest.mark.parametrize("messages", [MULTI_TURN, WITH_SYSTEM, CHINESE], ids=["multi-turn", "system", "chinese"])
def test_input_is_template_render_and_only_replies_train(tokenizer, messages):
    enc = encode_conversation(tokenizer, messages)
    render = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(enc.input_ids) == render
    assert enc.input_ids == tokenizer(render, add_special_tokens=False)["input_ids"]
    assert trained_text(tokenizer, enc) == assistant_text(tokenizer, messages)
    assert all(lab in (IGNORE_INDEX, tok) for tok, lab in zip(enc.input_ids, enc.labels))


def test_golden_tiny_chat(tokenizer):
    """Exactly which tokens train, token by token, for a one-turn chat."""
    enc = encode_conversation(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}])
    trained = [tokenizer.decode([t]) for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX]
    assert trained == ["Hello", "!", "<|im_end|>"]
    # The role header, the default system prompt and the newline after <|im_end|> are not trained.
    untrained_tail = [tokenizer.decode([t]) for t in enc.input_ids[-5:]]
    assert untrained_tail[-1] == "\n" and enc.labels[-1] == IGNORE_INDEX
    assert "SmolLM" in tokenizer.decode(enc.input_ids)  # the template's own default system prompt


def test_alpaca_row_masks_like_messages(tokenizer, tmp_path):
    from tunesmith.data.formats import load_conversations

    path = tmp_path / "alpaca.jsonl"
    path.write_text('{"instruction": "Translate", "input": "chat", "output": "猫", "system": "Be brief."}\n')
    (conv,) = load_conversations([str(path)])
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant"]
    assert conv.messages[1]["content"] == "Translate\nchat"
    enc = encode_conversation(tokenizer, conv.messages)
    assert trained_text(tokenizer, enc) == "猫" + tokenizer.eos_token


def test_train_on_last_assistant_and_all(tokenizer):
    last = encode_conversation(tokenizer, MULTI_TURN, train_on="last_assistant")
    assert trained_text(tokenizer, last) == "That makes 12." + tokenizer.eos_token
    everything = encode_conversation(tokenizer, MULTI_TURN, train_on="all")
    assert everything.labels == everything.input_ids


def test_loss_false_skips_one_reply(tokenizer):
    messages = [dict(m) for m in MULTI_TURN]
    messages[1]["loss"] = False
    enc = encode_conversation(tokenizer, messages)
    assert trained_text(tokenizer, enc) == "That makes 12." + tokenizer.eos_token
    # The skipped reply stays in the input as context.
    assert "2+2 is 4." in tokenizer.decode(enc.input_ids)


def test_truncation_drops_whole_trailing_turns(tokenizer):
    enc = encode_conversation(tokenizer, MULTI_TURN)
    first_reply_end = enc.cut_points[0]
    assert tokenizer.decode(enc.input_ids[first_reply_end - 1]) == tokenizer.eos_token
    cut = truncate(enc, first_reply_end + 3)  # room for the first exchange and a bit of the second
    assert cut.input_ids == enc.input_ids[:first_reply_end]
    assert trained_text(tokenizer, cut) == "2+2 is 4." + tokenizer.eos_token


def test_truncation_modes_when_not_even_the_first_reply_fits(tokenizer):
    enc = encode_conversation(tokenizer, MULTI_TURN)
    start_of_reply = next(i for i, lab in enumerate(enc.labels) if lab != IGNORE_INDEX)
    assert truncate(enc, start_of_reply + 2).input_ids == []  # drop_turns: no half-trained reply
    assert truncate(enc, len(enc.input_ids) - 1, "drop_example").input_ids == []
    cut = truncate(enc, start_of_reply + 2, "cut")
    assert len(cut.input_ids) == start_of_reply + 2
    assert sum(lab != IGNORE_INDEX for lab in cut.labels) == 2


def test_prompt_encoding_is_the_training_prefix(tokenizer):
    """Chat generates from exactly the tokens that precede a reply in training."""
    enc = encode_conversation(tokenizer, MULTI_TURN)
    prompt = encode_prompt(tokenizer, MULTI_TURN[:3])
    assert enc.input_ids[: len(prompt)] == prompt
    # The last reply's trained tokens start right where the generation prompt ends.
    assert enc.labels[len(prompt) - 1] == IGNORE_INDEX
    assert enc.labels[len(prompt)] == enc.input_ids[len(prompt)]


def test_template_override_and_missing_template(tokenizer):
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(TemplateError, match="no chat template: pass --chat_template"):
        apply_chat_template_override(bare, None)
    with pytest.raises(TemplateError, match="neither a file nor a built-in"):
        apply_chat_template_override(bare, "no-such-template")
    apply_chat_template_override(bare, "chatml")
    enc = encode_conversation(bare, MULTI_TURN)
    # chatml has no default system prompt, unlike SmolLM2's own template.
    assert "SmolLM" not in bare.decode(enc.input_ids)
    assert trained_text(bare, enc) == assistant_text(bare, MULTI_TURN)


def test_template_that_rewrites_history_is_refused(tokenizer):
    import copy

    odd = copy.deepcopy(tokenizer)
    # Renders only the last message: a continuation is not an extension of its prefix.
    odd.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    with pytest.raises(TemplateError, match="check `reply located` failed: the template renders reply 1 differently"):
        encode_conversation(odd, MULTI_TURN)


ALTERNATING_ONLY = (
    "{% for m in messages %}{% if m.role == 'assistant' and (loop.index0 == 0 or messages[loop.index0 - 1].role != "
    "'user') %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_reply_straight_after_the_system_prompt_trains(tokenizer):
    """OpenAI's fine-tuning format allows an assistant turn right after the system prompt: it trains."""
    messages = [{"role": "system", "content": "You greet first."}, {"role": "assistant", "content": "Hello there!"},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Glad to help."}]
    enc = encode_conversation(tokenizer, messages)
    assert trained_text(tokenizer, enc) == assistant_text(tokenizer, messages)


def test_template_that_cannot_render_a_reply_after_the_system_prompt_is_named(tokenizer):
    import copy

    strict = copy.deepcopy(tokenizer)
    strict.chat_template = ALTERNATING_ONLY
    messages = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(TemplateError, match=r"^the chat template of SmolLM2-135M-Instruct\S* refused this conversation: "
                       r"Conversation roles must alternate.*; it cannot render an assistant turn straight after the "
                       r"system prompt"):
        encode_conversation(strict, messages)


def test_train_on_all_leaves_out_replies_kept_as_context(tokenizer):
    """--train_on all trains every token but those of a reply with "loss": false (weight 0)."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Skip this.", "loss": False},
                {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Train this."}]
    enc = encode_conversation(tokenizer, messages, train_on="all")
    untrained = tokenizer.decode([t for t, lab in zip(enc.input_ids, enc.labels) if lab == IGNORE_INDEX])
    assert untrained == "Skip this.<|im_end|>"
    everything = encode_conversation(tokenizer, [{**m, "loss": True} for m in messages], train_on="all")
    assert everything.labels == everything.input_ids
