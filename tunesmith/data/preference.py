"""Preference pairs for reward modelling and DPO: read -> render through the chat template -> truncate.

Row formats, detected per row (a file may mix them); each may carry a numeric `margin`:
- ShareGPT: `conversations` (the shared context, ending with a user turn) plus `chosen` and
  `rejected` replies;
- TRL: `prompt` (a string or a message list) or `messages`, plus `chosen` and `rejected`;
- OpenAI's preference fine-tuning: `input` ({messages, tools}) plus `preferred_output` and
  `non_preferred_output`, each a list of assistant messages;
- Anthropic HH transcripts and Dahoas rows (see hh.py).
A reply is a string, one `{from, value}` / `{role, content}` message, or a list of messages.

A pair becomes two token sequences, context + chosen and context + rejected, rendered by
template.render_text exactly as SFT renders a conversation. The reward model reads each sequence
whole, as the template renders it (as trl's RewardTrainer does), in training, `tunesmith score` and
PPO alike; DPO scores each reply's span, which ends with its end-of-turn marker as an SFT reply does
(not with Phi's closing `<|endoftext|>`). Too-long pairs keep both replies whole: the shared context
loses whole early turns first (a leading system message stays), then its oldest tokens; a pair whose
replies cannot fit is dropped and counted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from ..constants import ASSISTANT, LOSS_FLAG, SYSTEM, TOOL, USER
from ..errors import TemplateError
from ..hparams import TrainDataArguments
from .dataset import DataKind, ItemEncoding, build_datasets
from .formats import (
    Message,
    Row,
    check_role_order,
    load_items,
    offered_tools,
    openai_input,
    openai_messages,
    sharegpt_messages,
)
from .hh import DAHOAS, hh_kind, hh_pair
from .image_encoding import expand_reply
from .images import DEFAULT_MAX_IMAGE_PIXELS, message_images
from .row_bound import bound_messages, log_bounded, renders_alike
from .template import closing_text_start, common_prefix_length, processor_of, render_text

CHOSEN, REJECTED, MARGIN = "chosen", "rejected", "margin"
# OpenAI's preference fine-tuning rows: the context in `input`, the two replies in these.
OPENAI_INPUT, OPENAI_CHOSEN, OPENAI_REJECTED = "input", "preferred_output", "non_preferred_output"
CONTEXT_FIELDS = ("conversations", "messages", "prompt")  # first one present is the context
REPLY_KINDS = "a string, a {role, content} or {from, value} message, or a list of such messages"


@dataclass(frozen=True)
class PreferencePair:
    row: Row
    context: list[Message]  # ends with a user turn
    chosen: list[Message]  # assistant (and tool) messages
    rejected: list[Message]
    margin: float | None = None


def is_pair_row(row: Row) -> bool:
    return any(key in row.data for key in (CHOSEN, REJECTED, OPENAI_CHOSEN, OPENAI_REJECTED))


def detect_preference_format(row: Row) -> str:
    """`sharegpt` (a `conversations` context), `trl` (a `prompt` or `messages` context) or `openai`
    (`input`, `preferred_output`, `non_preferred_output`)."""
    if OPENAI_CHOSEN in row.data or OPENAI_REJECTED in row.data:
        for key in (OPENAI_INPUT, OPENAI_CHOSEN, OPENAI_REJECTED):
            if key not in row.data:
                raise row.error("missing (an OpenAI preference row needs `input`, `preferred_output` and "
                                "`non_preferred_output`)", key)
        return "openai"
    for key in (CHOSEN, REJECTED):
        if key not in row.data:
            raise row.error(f"missing (a preference row needs `chosen` and `rejected`: {REPLY_KINDS})", key)
    if "conversations" in row.data:
        return "sharegpt"
    if "prompt" in row.data or "messages" in row.data:
        return "trl"
    raise row.error(
        f"no context (keys: {sorted(row.data)}): give the conversation before the replies as `conversations` "
        "(ShareGPT turns) or `prompt`/`messages` (TRL: a string or {role, content} messages), ending with a user turn"
    )


def _message_list(row: Row, items: list, field: str) -> list[Message]:
    reader = sharegpt_messages if items and isinstance(items[0], dict) and "from" in items[0] else openai_messages
    return reader(row, items, field)


def context_messages(row: Row) -> tuple[list[Message], str]:
    key = next(k for k in CONTEXT_FIELDS if k in row.data)
    value = row.data[key]
    if key == "prompt" and isinstance(value, str):
        return [{"role": USER, "content": value}], key
    if not isinstance(value, list):
        raise row.error(f"expected a list of messages{' or a string' if key == 'prompt' else ''}, "
                        f"got {type(value).__name__}", key)
    return _message_list(row, value, key), key


def reply_messages(row: Row, key: str) -> list[Message]:
    value = row.data[key]
    if isinstance(value, str):
        return [{"role": ASSISTANT, "content": value}]
    items = [value] if isinstance(value, dict) else value
    if not (isinstance(items, list) and items and all(isinstance(m, dict) for m in items)):
        raise row.error(f"expected {REPLY_KINDS}, got {value!r:.80}", key)
    messages = _message_list(row, items, key)
    for i, m in enumerate(messages):
        if m["role"] not in (ASSISTANT, TOOL):
            raise row.error(f"a reply holds assistant (and tool) messages only, got role {m['role']!r}",
                            f"{key}[{i}]")
    if messages[0]["role"] != ASSISTANT or messages[-1]["role"] != ASSISTANT:
        raise row.error("a reply must begin and end with an assistant message", key)
    for i, m in enumerate(messages):
        if m.get(LOSS_FLAG) is False:  # never dropped silently: the pair's replies are what it compares
            raise row.error('a preference reply is what the pair compares and cannot be kept as context: drop its '
                            '`weight`/`loss_weight` 0 (or "loss": false)', f"{key}[{i}]")
    return messages


def _margin(row: Row) -> float | None:
    value = row.data.get(MARGIN)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise row.error(f"expected a finite number (how much more chosen should score than rejected), got {value!r}",
                        MARGIN)
    return float(value)


def pair_from_row(row: Row) -> PreferencePair:
    kind = hh_kind(row.data)
    if kind:
        context, chosen, rejected = hh_pair(row, kind)
        check_role_order(row, context, "prompt" if kind == DAHOAS else "chosen", ends_with=USER)
        return PreferencePair(row, context, [chosen], [rejected], _margin(row))
    if detect_preference_format(row) == "openai":
        context, _ = openai_input(row)
        check_role_order(row, context, f"{OPENAI_INPUT}.messages", ends_with=(USER, TOOL))
        return PreferencePair(row, context, reply_messages(row, OPENAI_CHOSEN), reply_messages(row, OPENAI_REJECTED),
                              _margin(row))
    context, key = context_messages(row)
    check_role_order(row, context, key, ends_with=(USER, TOOL))  # a reply may follow a tool result
    return PreferencePair(row, context, reply_messages(row, CHOSEN), reply_messages(row, REJECTED), _margin(row))


def load_pairs(paths: Sequence[str], max_samples: int | None = None) -> list[PreferencePair]:
    return load_items(paths, pair_from_row, max_samples)[0]


def encode_reply(tokenizer: Any, context: list[Message], reply: list[Message],
                 tools: list[dict] | None = None) -> tuple[list[int], int, int]:
    """Token ids of the template render of context + reply, and [start, end) of the reply's tokens, located
    as SFT locates a conversation's last reply. It starts where the render parts from the generation prompt
    (which may open a block, e.g. `<think>`, that the rendered reply lacks) and ends with its end-of-turn
    marker: not the newline some templates render after it, nor text the template prints once after the
    whole conversation (Phi's `<|endoftext|>`, template.closing_text_start). The ids keep both: the
    reward model reads the template's render whole."""
    prompt = render_text(tokenizer, context, add_generation_prompt=True, tools=tools)
    full = render_text(tokenizer, context + reply, tools=tools)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]

    def token_at(char: int) -> int:  # the first token that ends after `char`: the one holding it, or the next
        return next((k for k, (_, e) in enumerate(offsets) if e > char), len(ids))

    start = token_at(common_prefix_length(prompt, full))
    if start == len(ids):
        raise TemplateError("check `reply located` failed: the reply renders no text after its generation prompt")
    closing = token_at(closing_text_start(tokenizer, context + reply, full, tools))
    return ids, start, reply_end(tokenizer, ids[:closing])


def reply_end(tokenizer: Any, ids: list[int]) -> int:
    """The index just past the last token of `ids` that is not whitespace: the reply's end-of-turn marker
    (`<|im_end|>`), not the newline some templates render after it, which generation never produces."""
    end = len(ids)
    while end > 1 and not tokenizer.decode(ids[end - 1:end]).strip():
        end -= 1
    return end


@dataclass
class EncodedPair:
    chosen_ids: list[int]
    rejected_ids: list[int]
    truncated: bool
    # [start, end) of each reply's tokens (its end-of-turn included): what DPO trains on.
    chosen_span: tuple[int, int] = (0, 0)
    rejected_span: tuple[int, int] = (0, 0)


def _left_cut(ids: list[int], start: int, budget: int) -> tuple[list[int], int]:
    """ids without their oldest context tokens, and how many were cut."""
    cut = max(0, start - budget)
    return ids[cut:], cut


def encode_replies(
    tokenizer: Any, context: list[Message], replies: list[list[Message]], max_length: int | None,
    tools: list[dict] | None = None,
) -> tuple[list[tuple[list[int], int, int]], bool] | None:
    """Each reply after the shared context, as (ids, start, end) within max_length tokens, every reply kept
    whole and the context cut the same way for all; and whether it was cut. None when a reply cannot fit
    with at least one token of context."""
    system = context[:1] if context[0]["role"] == SYSTEM else []
    starts = [i for i, m in enumerate(context) if m["role"] == USER] if max_length is not None else [len(system)]
    for k, i in enumerate(starts):
        kept = system + context[i:]
        encoded = [encode_reply(tokenizer, kept, reply, tools) for reply in replies]
        if max_length is None or max(len(ids) for ids, _, _ in encoded) <= max_length:
            return encoded, k > 0
    # The last user turn alone is too long: keep its end, the same number of tokens on every side.
    budget = max_length - max(len(ids) - start for ids, start, _ in encoded)
    if budget < 1:
        return None
    cut = [_left_cut(ids, start, budget) for ids, start, _ in encoded]
    return [(kept_ids, start - n, end - n) for (kept_ids, n), (_, start, end) in zip(cut, encoded)], True


def encode_pair(
    tokenizer: Any, context: list[Message], chosen: list[Message], rejected: list[Message], max_length: int | None,
    tools: list[dict] | None = None,
) -> EncodedPair | None:
    """Both sequences of a pair within max_length tokens, each reply kept whole (encode_replies)."""
    found = encode_replies(tokenizer, context, [chosen, rejected], max_length, tools)
    if found is None:
        return None
    ((c_ids, c_start, c_end), (r_ids, r_start, r_end)), truncated = found
    return EncodedPair(c_ids, r_ids, truncated, (c_start, c_end), (r_start, r_end))


def encode_image_pair(processor: Any, tokenizer: Any, pair: PreferencePair, max_length: int | None,
                      max_image_pixels: int) -> tuple[EncodedPair, dict[str, Any]] | None:
    """A vision-language model's pair: each side with its images' tokens in place (image_encoding.expand_reply),
    both within max_length tokens once expanded, and the texts and pictures its collator gives the processor.
    The context loses whole early turns (their pictures with them) as for text, with a budget lowered by what
    the kept pictures add, until the longer side fits."""
    images = message_images(pair.context)
    budget = max_length
    while True:
        enc = encode_pair(tokenizer, pair.context, pair.chosen, pair.rejected, budget, offered_tools(pair.row))
        if enc is None:
            return None
        (chosen, chosen_span), (rejected, rejected_span) = (
            expand_reply(processor, ids, span, images, max_image_pixels)
            for ids, span in ((enc.chosen_ids, enc.chosen_span), (enc.rejected_ids, enc.rejected_span)))
        over = 0 if max_length is None else max(len(chosen.input_ids), len(rejected.input_ids)) - max_length
        if over <= 0:
            expanded = EncodedPair(chosen.input_ids, rejected.input_ids, enc.truncated, chosen_span, rejected_span)
            return expanded, {"chosen_text": chosen.text, "rejected_text": rejected.text, "images": chosen.images}
        budget -= over


def bound_replies(tokenizer: Any, row: Row, context: list[Message], replies: list[list[Message]],
                  max_length: int | None, tools: list[dict] | None = None) -> tuple[list[Message], list[list[Message]]]:
    """The context and replies of a row with every text too long to train shortened (data/row_bound.py): the
    context keeps its texts' tails (a pair keeps the context's last tokens), a reply its head (a reply longer than
    max_length drops the row either way); one log line naming the row when anything was."""
    whole = "kept whole: the chat template renders it cut otherwise"
    bounded_context, notes = bound_messages(tokenizer, context, max_length, keep="tail")
    if notes and not renders_alike(tokenizer, context, bounded_context, "tail", after=replies[0], tools=tools):
        bounded_context, notes = context, [*notes, whole]
    bounded = []
    for k, reply in enumerate(replies):
        bounded_reply, reply_notes = bound_messages(tokenizer, reply, max_length)
        if reply_notes and not renders_alike(tokenizer, reply, bounded_reply, "head", before=bounded_context,
                                             tools=tools):
            bounded_reply, reply_notes = reply, [*reply_notes, whole]
        bounded.append(bounded_reply)
        notes += [f"reply {k}: {note}" for note in reply_notes]
    if notes:
        log_bounded(row.where(), notes, tokenizer, max_length, "cut or dropped as a pair's rule says (the context "
                    "keeps its last tokens, a reply that cannot fit whole drops the row)")
    return bounded_context, bounded


def encode_pair_record(tokenizer: Any, pair: PreferencePair, max_length: int | None,
                       max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> ItemEncoding | None:
    """chosen_ids, rejected_ids, margin (0 when the row has none), the longer side's length, and where
    each reply starts and ends (chosen_start/chosen_end, rejected_start/rejected_end); None when a
    reply does not fit. A vision-language model's records also hold the texts and pictures its collator
    gives the processor (chosen_text, rejected_text, images), its ids the processor's expansion."""
    context, (chosen, rejected) = bound_replies(tokenizer, pair.row, pair.context, [pair.chosen, pair.rejected],
                                                max_length, offered_tools(pair.row))
    pair = PreferencePair(pair.row, context, chosen, rejected, pair.margin)
    processor, pictures = processor_of(tokenizer), {}
    if processor is None:
        enc = encode_pair(tokenizer, pair.context, pair.chosen, pair.rejected, max_length, offered_tools(pair.row))
    else:
        enc, pictures = encode_image_pair(processor, tokenizer, pair, max_length, max_image_pixels) or (None, {})
    if enc is None:
        return None
    return ItemEncoding([{"chosen_ids": enc.chosen_ids, "rejected_ids": enc.rejected_ids, MARGIN: pair.margin or 0.0,
                          # For --train_sampling_strategy group_by_length (the Trainer's default length column).
                          "length": max(len(enc.chosen_ids), len(enc.rejected_ids)),
                          "chosen_start": enc.chosen_span[0], "chosen_end": enc.chosen_span[1],
                          "rejected_start": enc.rejected_span[0], "rejected_end": enc.rejected_span[1],
                          **pictures}],
                        enc.truncated)


PREFERENCE_PAIRS = DataKind(
    name="preference",
    version="7",  # 7: images (chosen_text, rejected_text, images for a vision-language model); 3: the reply spans; 4: a `prompt` in HH form is read as its turns (hh.py); 5: OpenAI's
    # preference rows, and a reply right after the system prompt in a context; 6: a reply's span ends before
    # text the template prints once after the whole conversation (Phi's end-of-text)
    from_row=pair_from_row,
    settings=lambda data_args: {"max_length": data_args.max_seq_length,
                                "max_image_pixels": getattr(data_args, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS)},
    encode_one=encode_pair_record,
    dropped_because="a reply does not fit in max_seq_length",
    report_line="{name}: {rows} pairs -> {kept} kept ({truncated} with their context truncated to max_seq_length, "
                "{dropped} dropped: {dropped_because})",
    nothing_kept="no pair fits in --max_seq_length {max_length}; raise it",
)


def build_preference_datasets(
    tokenizer: Any, data_args: TrainDataArguments, seed: int = 42, report_dir: str | None = None
) -> tuple[Dataset, Dataset | None]:
    return build_datasets(PREFERENCE_PAIRS, tokenizer, data_args, seed, report_dir)
