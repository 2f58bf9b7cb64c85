"""Chat-template rendering and label masking: the one code path that turns messages into tokens, for
training (SFT, reward, PPO) and for chat.

The tokenizer's own template renders the text; the input ids are exactly the tokenized render.
Which characters are a reply is found by rendering prefixes, as inference would: reply i begins
where the model's generation begins, right after `render(messages[:i], add_generation_prompt=True)`,
and ends with the end-of-turn marker, before the template's trailing whitespace. Where that
generation prompt is not a prefix of `render(messages[:i + 1])`, it pre-fills a block the reply
renders differently (DeepSeek R1's `<think>\n`, the empty thought channel
`<|channel>thought\n<channel|>` of Gemma 4's larger models): the reply then begins where the
template's turn header ends (found by rendering a probe reply), so its own reasoning block trains
whole, never from inside a tag where the two renders happen to part. A template with `{% generation %}`
markers says it itself (transformers' assistant mask). A token is trained when it overlaps a reply's
characters, so a token the tokenizer merged across the header/reply boundary trains too.

Text a template prints only where the conversation ends is no reply's: every reply, first, middle or
last, ends with its own end-of-turn marker. Phi-3.5 and Phi-4-mini print `{{ eos_token }}` once after
the last turn: their replies train `...<|end|>`, never the `<|endoftext|>` that follows the last one.
For an earlier reply that text shows where `render(messages[:i + 1])` parts from the whole render; for
the last, by rendering one more turn: what the conversation's render has after the point where the two
part, and the longer render ends with too, is closing text (see `closing_text_start`).

A template that renders an earlier reply differently once more turns follow (Qwen3 drops the
`<think>` block of earlier replies) is handled: where the reply itself changes, the conversation is
expanded into one example per assistant turn, each rendered exactly as inference renders it."""

from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..constants import ASSISTANT, IGNORE_INDEX, LOSS_FLAG, SYSTEM, USER
from ..errors import ConfigError, TemplateError
from ..families import PROCESSOR_ATTRIBUTE, is_vision_language
from .formats import Message
from .images import as_content_parts, content_text, has_images, image_prompt, message_images

logger = logging.getLogger(__name__)

# Built-in templates, ours (data/templates/*.jinja): `--chat_template chatml` for base models that ship
# none, and `chatml_tools`, ChatML with function calling (the tool list in the system turn, each call
# as <tool_call>{"name": ..., "arguments": {...}}</tool_call>, results in `tool` turns), for models
# whose own template renders no tool calls (SmolLM2's).
TEMPLATE_DIR = Path(__file__).parent / "templates"
BUILTIN_TEMPLATES = {path.stem: path for path in sorted(TEMPLATE_DIR.glob("*.jinja"))}

TRAIN_ON = ("assistant", "last_assistant", "all")
TRUNCATION = ("drop_turns", "drop_example", "cut")
MULTI_TURN = ("auto", "expand", "whole")

# Message keys a chat template may read; tunesmith's own (the `loss` flag) stay out of the render.
TEMPLATE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")


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
        tokenizer.chat_template = BUILTIN_TEMPLATES[chat_template].read_text(encoding="utf-8")
    elif Path(chat_template).is_file():
        tokenizer.chat_template = Path(chat_template).read_text(encoding="utf-8")
    else:
        raise TemplateError(
            f"--chat_template {chat_template!r}: neither a file nor a built-in ({', '.join(BUILTIN_TEMPLATES)})"
        )


def attach_processor(tokenizer: Any, processor: Any) -> None:
    setattr(tokenizer, PROCESSOR_ATTRIBUTE, processor)


def processor_of(tokenizer: Any) -> Any | None:
    """The processor of a vision-language model's tokenizer; None for a text-only model's. Whether a model is one:
    families.is_vision_language."""
    return getattr(tokenizer, PROCESSOR_ATTRIBUTE, None)


def _for_template(messages: list[Message], arguments_as_text: bool = False, empty_content: str | None = None,
                  parts: bool = False) -> list[dict]:
    out = []
    for m in as_content_parts(messages) if parts else messages:
        message = {key: m[key] for key in TEMPLATE_KEYS if key in m}
        if m.get("tool_calls"):
            if message.get("content") is None:
                message["content"] = empty_content
            if arguments_as_text:
                message["tool_calls"] = [
                    {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"],
                                                                                      ensure_ascii=False)}}
                    for call in m["tool_calls"]
                ]
        out.append(message)
    return out


# How a message with tool calls and no text reaches a template: most take the arguments as a mapping
# (transformers' convention) and an empty content; DeepSeek's joins the arguments as text and renders
# the calls only when the content is null. The first that renders every call's name is used.
TOOL_CALL_FORMS = ((False, ""), (False, None), (True, None), (True, ""))


def render_text(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = False,
                tools: list[dict] | None = None) -> str:
    """The template's text for these messages (and the tools offered)."""
    parts = is_vision_language(tokenizer)  # its template reads every message's content as a list of parts
    if not parts and has_images(messages):
        raise ConfigError(f"{template_name(tokenizer)} is a text-only model's: it cannot show these messages' "
                          "images; use a vision-language model (its folder has a processor: Qwen2.5-VL, Gemma 3, "
                          "SmolVLM, ...) or leave the images out")
    names = [call["function"]["name"] for m in messages for call in m.get("tool_calls") or []]
    if not names:
        return _render(tokenizer, _for_template(messages, parts=parts), add_generation_prompt, tools)
    problem = "it renders none of them"
    for arguments_as_text, empty_content in TOOL_CALL_FORMS:
        try:
            text = _render(tokenizer, _for_template(messages, arguments_as_text, empty_content, parts),
                           add_generation_prompt, tools)
        except TemplateError as e:
            problem = str(e)
            continue
        if all(name in text for name in names):
            return text
    raise TemplateError(f"check `tool calls rendered` failed: the chat template does not render the assistant's "
                        f"tool calls ({problem}); use a model whose template supports tools, or a --chat_template "
                        "that renders `tool_calls`")


def _render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None) -> str:
    import jinja2

    try:
        return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        # Templates refuse what their model cannot take with raise_exception (a TemplateError).
        hint = ""
        if [m["role"] for m in messages[:2]] == [SYSTEM, ASSISTANT]:
            hint = ("; it cannot render an assistant turn straight after the system prompt (which OpenAI's format "
                    "allows): use a --chat_template that can (e.g. chatml), or open the conversation with a user turn")
        raise TemplateError(f"{template_name(tokenizer)} refused this conversation: {e}{hint}") from None


def template_name(tokenizer: Any) -> str:
    """`the chat template of MODEL`, for messages about what a template cannot render."""
    name = Path(str(getattr(tokenizer, "name_or_path", "") or "")).name
    return f"the chat template of {name}" if name else "the chat template"


def encode_prompt(tokenizer: Any, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
    """Token ids that ask the model for the next assistant reply (what chat and PPO generate from). Messages with
    images give an ImagePrompt (data/images.py): the ids with the images' tokens in place, and the pictures'
    inputs for the engine's prefill."""
    text = render_text(tokenizer, messages, add_generation_prompt=True, tools=tools)
    images = message_images(messages)
    if images:  # render_text refused them unless the model reads images
        return image_prompt(processor_of(tokenizer), text, images)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class PromptTooLong(ValueError):
    """The system prompt and the last turn alone exceed --max_prompt_length."""


def fit_prompt(tokenizer: Any, messages: list[Message], max_length: int, tools: list[dict] | None = None,
               first_turn: int = 0) -> tuple[list[int], list[Message], int]:
    """What --max_prompt_length does everywhere (chat, PPO/GRPO prompts, evaluation prompts): a prompt longer than
    max_length tokens loses its oldest whole turns (a turn: a user message and what follows it up to the next
    one), the system prompt and the last turn always kept, since the reply must answer them. first_turn: turns
    before it are out already. Returns (token ids, the messages kept, the index of the first turn kept); raises
    PromptTooLong when the system prompt and the last turn alone do not fit."""
    head = [m for m in messages[:1] if m["role"] == SYSTEM]
    body = messages[len(head):]
    starts = [i for i, m in enumerate(body) if m["role"] == USER] or [0]
    first = min(first_turn, len(starts) - 1)
    while True:
        kept = head + body[starts[first]:]
        ids = encode_prompt(tokenizer, kept, tools)
        if len(ids) <= max_length:
            return ids, kept, first
        if first == len(starts) - 1:
            raise PromptTooLong(f"the system prompt and the last message alone take {len(ids)} tokens, more than "
                                f"--max_prompt_length {max_length}")
        first += 1


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    # Token index just after each complete assistant reply (its end-of-turn included): where a
    # conversation may be cut without leaving a reply half-trained.
    cut_points: list[int] = field(default_factory=list)
    # Trained replies whose span ends in no special token (nothing teaches the model to stop there).
    replies_without_end_marker: int = 0


class RewrittenHistory(TemplateError):
    """The template renders reply i differently once more turns follow it."""


def common_prefix_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "generation %}" in template and "endgeneration" in template


def _reply_markers(m: Message) -> list[str]:
    """Texts that must lie inside the located reply: its content, its answer after a `</think>` and its
    reasoning (templates such as GLM's move or drop the thinking block), and its tool calls' names."""
    content = content_text(m.get("content"))
    reasoning = m.get("reasoning_content") if isinstance(m.get("reasoning_content"), str) else ""
    texts = [content, content.split("</think>")[-1], reasoning]
    markers = [t.strip() for t in texts if t.strip()]
    markers += [call["function"]["name"] for call in m.get("tool_calls") or []]
    return markers


# Content of the probe reply that shows where a template's assistant header ends.
PROBE_REPLY = "tunesmith probe reply"


def _reply_start(tokenizer: Any, messages: list[Message], i: int, prompt: str, upto: str,
                 tools: list[dict] | None) -> int:
    """Where reply i begins in `upto`: after the generation prompt, or where that prompt pre-fills a
    block the reply renders differently, after the template's turn header (never later than where the
    two renders part, which may be inside a tag: `<|channel>` against `<think>`)."""
    if upto.startswith(prompt):
        return len(prompt)
    parted = common_prefix_length(prompt, upto)
    try:
        probe = render_text(tokenizer, [*messages[:i], {"role": ASSISTANT, "content": PROBE_REPLY}], tools=tools)
    except TemplateError:
        return parted
    header_end = probe.find(PROBE_REPLY)
    if 0 <= header_end <= parted and probe[:header_end] == upto[:header_end]:
        return header_end
    return parted


# Content of the probe turn rendered after a conversation to find its closing text.
PROBE_TURN = "tunesmith probe turn"


def closing_text_start(tokenizer: Any, messages: list[Message], full: str, tools: list[dict] | None) -> int:
    """Where the text the template prints once after the whole conversation (Phi's `{{ eos_token }}`)
    begins in `full`, its render; len(full) where there is none. Found by rendering one more turn: what
    `full` has after the point where the two renders part is closing text when the longer render ends
    with it too (it moved to the new end). Any other difference (a template that rewrites the last
    reply, or moves the system prompt, once a turn follows) is no closing text, and nothing is cut."""
    try:
        longer = render_text(tokenizer, [*messages, {"role": USER, "content": PROBE_TURN}], tools=tools)
    except TemplateError:
        return len(full)
    parted = common_prefix_length(full, longer)
    closing = full[parted:]
    return parted if closing and longer.endswith(closing) else len(full)


def _reply_spans(tokenizer: Any, messages: list[Message], indices: list[int], full: str,
                 token_starts: list[int], tools: list[dict] | None) -> list[tuple[int, int]]:
    """(start, end) characters in `full` of each assistant message in `indices`. Where two renders
    part inside a token of `full` (`<|im_end|>` and `<|user|>` share `<|`), they part at its start."""

    def token_start(char: int) -> int:
        return token_starts[bisect.bisect_right(token_starts, char) - 1] if char < len(full) else char

    spans = []
    for i in indices:
        prompt = render_text(tokenizer, messages[:i], add_generation_prompt=True, tools=tools)
        if i == len(messages) - 1:
            upto, parted = full, closing_text_start(tokenizer, messages, full, tools)
        else:
            # What the render of messages[:i + 1] has where `full` goes on (Phi's end-of-text) is no reply text.
            upto = render_text(tokenizer, messages[: i + 1], tools=tools)
            parted = common_prefix_length(upto, full)
        start = token_start(_reply_start(tokenizer, messages, i, prompt, upto, tools))
        end = min(len(upto.rstrip()), token_start(parted))
        end = start + len(upto[start:end].rstrip())
        if full[:start] != upto[:start]:
            raise RewrittenHistory(f"the template renders the turns before reply {i} differently once it follows")
        reply = upto[start:end]
        rendered_whole = upto[start:len(upto.rstrip())]
        missing = [t for t in _reply_markers(messages[i]) if t in rendered_whole and t not in reply]
        if missing or end <= start:
            raise RewrittenHistory(f"the template renders reply {i} differently once more turns follow it")
        spans.append((start, end))
    return spans


def _generation_marker_spans(tokenizer: Any, messages: list[Message], indices: list[int], offsets: list,
                             tools: list[dict] | None) -> list[tuple[int, int]]:
    """Reply spans from the template's own `{% generation %}` blocks (transformers' assistant mask), one
    run of masked tokens per assistant message, in order."""
    enc = tokenizer.apply_chat_template(_for_template(messages), tools=tools or None, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    mask = enc["assistant_masks"]
    runs, k = [], 0
    while k < len(mask):
        if mask[k]:
            j = k
            while j < len(mask) and mask[j]:
                j += 1
            runs.append((offsets[k][0], offsets[j - 1][1]))
            k = j
        else:
            k += 1
    assistants = [i for i, m in enumerate(messages) if m["role"] == ASSISTANT]
    if len(runs) != len(assistants) or len(mask) != len(offsets):
        raise TemplateError(f"the template's {{% generation %}} blocks mark {len(runs)} replies, the conversation "
                            f"has {len(assistants)}: each assistant message needs exactly one block")
    by_message = dict(zip(assistants, runs))
    return [by_message[i] for i in indices]


def _trained_indices(messages: list[Message], train_on: str) -> list[int]:
    assistants = [i for i, m in enumerate(messages) if m["role"] == ASSISTANT]
    if train_on == "last_assistant":
        assistants = assistants[-1:]
    return [i for i in assistants if messages[i].get(LOSS_FLAG, True)]


def _labels(ids: list[int], offsets: list, spans: list[tuple[int, int]], train_on: str,
            context_only: list[tuple[int, int]] = ()) -> list[int]:
    """The trained replies' tokens (the spans), or with train_on all every token but those of the replies
    kept as context (`"loss": false`, weight 0)."""
    def overlaps(k: int, ranges: Any) -> bool:
        # Overlap, not start: a token merged across the header/reply boundary carries reply text too.
        tok_start, tok_end = offsets[k]
        return any(tok_start < e and tok_end > s and tok_end > tok_start for s, e in ranges)

    if train_on == "all":
        return [IGNORE_INDEX if overlaps(k, context_only) else ids[k] for k in range(len(ids))]
    return [ids[k] if overlaps(k, spans) else IGNORE_INDEX for k in range(len(ids))]


def _token_after(offsets: list, char: int) -> int:
    return next((k for k, (s, _) in enumerate(offsets) if s >= char), len(offsets))


def _encode_whole(tokenizer: Any, messages: list[Message], train_on: str, tools: list[dict] | None) -> Encoded:
    full = render_text(tokenizer, messages, tools=tools)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    assistants = [i for i, m in enumerate(messages) if m["role"] == ASSISTANT]
    trained = _trained_indices(messages, train_on)
    if _has_generation_markers(tokenizer):
        all_spans = _generation_marker_spans(tokenizer, messages, assistants, offsets, tools)
    else:
        # Untrained earlier replies are located too (they are where a conversation may be cut), but a
        # template that rewrites them only matters where they train.
        all_spans = []
        for i in assistants:
            try:
                all_spans += _reply_spans(tokenizer, messages, [i], full, [s for s, _ in offsets], tools)
            except RewrittenHistory:
                if i in trained:
                    raise
                all_spans.append(None)
    spans = [span for i, span in zip(assistants, all_spans) if i in trained]
    context_only = [span for i, span in zip(assistants, all_spans) if i not in trained] if train_on == "all" else []
    if None in context_only:
        raise TemplateError("check `reply located` failed: a reply kept as context (\"loss\": false or weight 0) "
                            "cannot be located to leave it out of --train_on all, the template renders it differently "
                            "once more turns follow; use --train_on assistant")
    labels = _labels(ids, offsets, spans, train_on, context_only)
    cut_points = [_token_after(offsets, span[1]) for span in all_spans if span]
    special = set(tokenizer.all_special_ids)
    no_marker = sum(1 for s, e in spans if ids[_token_after(offsets, e) - 1] not in special)
    return Encoded(ids, labels, cut_points, no_marker)


def encode_examples(tokenizer: Any, messages: list[Message], train_on: str = "assistant",
                    tools: list[dict] | None = None, multi_turn: str = "auto") -> tuple[list[Encoded], bool]:
    """The training examples of one conversation, and whether it was expanded: one example whose
    labels mark every trained reply, or (multi_turn expand, or auto when the template rewrites earlier
    replies) one example per trained reply, each the conversation up to that reply as inference
    renders it."""
    if multi_turn not in MULTI_TURN:
        raise TemplateError(f"--multi_turn must be one of {', '.join(MULTI_TURN)} (got {multi_turn!r})")
    trained = _trained_indices(messages, train_on)
    if multi_turn != "expand" or train_on == "all" or len(trained) <= 1:
        try:
            return [_encode_whole(tokenizer, messages, train_on, tools)], False
        except RewrittenHistory as e:
            if multi_turn == "whole" or train_on == "all":
                raise TemplateError(
                    f"check `reply located` failed: {e}, so its tokens cannot be marked in one example; "
                    "use --multi_turn expand (or auto), or a --chat_template that renders history as it renders replies"
                ) from None
    examples = [_encode_whole(tokenizer, messages[: i + 1], "last_assistant", tools) for i in trained]
    return examples, True


def encode_conversation(tokenizer: Any, messages: list[Message], train_on: str = "assistant",
                        tools: list[dict] | None = None) -> Encoded:
    """One example for the whole conversation (see encode_examples): tokens of the full template
    render, labels on the trained replies and IGNORE_INDEX elsewhere."""
    return encode_examples(tokenizer, messages, train_on, tools, multi_turn="whole")[0][0]


def truncate(encoded: Encoded, max_length: int, mode: str = "drop_turns") -> Encoded:
    """Fit max_length. drop_turns: keep the longest run of whole exchanges (ending just after a reply's
    end-of-turn) that fits and still trains something, else drop the example; drop_example: drop any
    example that does not fit; cut: the first max_length tokens, even inside a reply. A dropped
    example comes back with no tokens."""
    if mode not in TRUNCATION:
        raise TemplateError(f"--truncation must be one of {', '.join(TRUNCATION)} (got {mode!r})")
    if len(encoded.input_ids) <= max_length:
        return encoded
    if mode == "cut":
        cut = max_length
    else:
        fitting = [c for c in encoded.cut_points if c <= max_length
                   and any(lab != IGNORE_INDEX for lab in encoded.labels[:c])] if mode == "drop_turns" else []
        if not fitting:
            return Encoded([], [], [], 0)
        cut = max(fitting)
    return Encoded(encoded.input_ids[:cut], encoded.labels[:cut], [c for c in encoded.cut_points if c <= cut],
                   encoded.replies_without_end_marker)


def trained_token_count(labels: list[int]) -> int:
    return sum(1 for lab in labels if lab != IGNORE_INDEX)
