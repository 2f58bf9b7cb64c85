"""Chat-template rendering and label masking: the one code path that turns messages into tokens,
for training (SFT, reward, PPO) and for chat.

The tokenizer's own template renders the text. Which tokens are trained is found by rendering
prefixes: the text between `render(messages[:i], add_generation_prompt=True)` and the end of
`render(messages[:i + 1])` is reply i (plus its end-of-turn token). So no template needs special
`{% generation %}` markers, and the input ids are exactly the tokenized template render."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import ASSISTANT, IGNORE_INDEX, LOSS_FLAG, USER
from ..errors import TemplateError
from .formats import Message

# For base models that ship no template (`--chat_template chatml`).
BUILTIN_TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
        "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}"
    ),
}


def apply_chat_template_override(tokenizer: Any, chat_template: str | None) -> None:
    """Install `--chat_template` (a built-in name or a Jinja file) on the tokenizer; it is then saved
    with every output, so chat renders with the template that training used."""
    if chat_template is None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "this tokenizer has no chat template: pass --chat_template chatml or a Jinja file"
            )
        return
    if chat_template in BUILTIN_TEMPLATES:
        tokenizer.chat_template = BUILTIN_TEMPLATES[chat_template]
    elif Path(chat_template).is_file():
        tokenizer.chat_template = Path(chat_template).read_text(encoding="utf-8")
    else:
        raise TemplateError(
            f"--chat_template {chat_template!r}: neither a file nor a built-in ({', '.join(BUILTIN_TEMPLATES)})"
        )


def _for_template(messages: list[Message]) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def render_text(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        _for_template(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def encode_prompt(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids that ask the model for the next assistant reply (what chat and PPO generate from)."""
    text = render_text(tokenizer, messages, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    turn_starts: list[int]  # token index where each user turn begins (where truncation may cut)


def _reply_end(segment: str, content: str, eos: str | None) -> int:
    """Length of the trained part of a rendered reply: the content and the end-of-turn token, not
    the template's trailing scaffolding (e.g. the newline after <|im_end|>)."""
    at = segment.find(content) + len(content) if content else 0
    if eos:
        eos_at = segment.find(eos, at)
        if eos_at >= 0:
            return eos_at + len(eos)
    return len(segment.rstrip())


def encode_conversation(tokenizer: Any, messages: list[Message], train_on: str = "assistant") -> Encoded:
    """Tokens of the full template render, with labels for the trained tokens and IGNORE_INDEX
    everywhere else (system, user and tool turns, and the template's role headers)."""
    full = render_text(tokenizer, messages)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    eos = tokenizer.eos_token
    spans: list[tuple[int, int, bool]] = []  # (char start, char end, trained)
    turn_chars: list[int] = []
    for i, m in enumerate(messages):
        if m["role"] == USER:
            turn_chars.append(len(render_text(tokenizer, messages[:i])) if i else 0)
        if m["role"] != ASSISTANT:
            continue
        prefix = render_text(tokenizer, messages[:i], add_generation_prompt=True)
        upto = render_text(tokenizer, messages[: i + 1])
        if not (upto.startswith(prefix) and full.startswith(upto)):
            raise TemplateError(
                "the chat template does not render a conversation as a prefix of its continuation "
                "(it rewrites earlier turns), so replies cannot be located; pass --chat_template"
            )
        end = len(prefix) + _reply_end(upto[len(prefix):], m["content"], eos)
        spans.append((len(prefix), end, m.get(LOSS_FLAG, True)))
    if train_on == "last_assistant":
        spans = [(s, e, t and k == len(spans) - 1) for k, (s, e, t) in enumerate(spans)]
    labels = [IGNORE_INDEX] * len(ids)
    for k, (tok_start, _) in enumerate(offsets):
        if train_on == "all" or any(t and s <= tok_start < e for s, e, t in spans):
            labels[k] = ids[k]
    turn_starts = [next((k for k, (s, _) in enumerate(offsets) if s >= c), len(ids)) for c in turn_chars]
    return Encoded(ids, labels, turn_starts)


def truncate(encoded: Encoded, max_length: int) -> Encoded:
    """Fit max_length by dropping whole trailing turns; cut inside a turn only when the first turn
    alone is too long."""
    if len(encoded.input_ids) <= max_length:
        return encoded
    fitting = [t for t in encoded.turn_starts if 0 < t <= max_length]
    cut = max(fitting) if fitting and any(lab != IGNORE_INDEX for lab in encoded.labels[: max(fitting)]) else max_length
    return Encoded(encoded.input_ids[:cut], encoded.labels[:cut], [t for t in encoded.turn_starts if t < cut])


def trained_token_count(labels: list[int]) -> int:
    return sum(1 for lab in labels if lab != IGNORE_INDEX)
