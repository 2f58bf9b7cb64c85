"""RLHF prompts: conversations that end with a user turn, for the policy to answer.

A row is an OpenAI `messages` list or a ShareGPT `conversations` list ending with a user turn, or
a `prompt` field: a plain string (one user turn) or a list of {role, content} messages, or an HH
transcript (hh.py: a Dahoas `prompt`, or the turns of `chosen` before its last reply). Its other fields
are kept (Prompt.row.data) and reach reward functions as keyword arguments; `answer`, the reference
answer of verifiable tasks (`{"messages": [...], "answer": "42"}`), must be a string or a number. Every
error names the file, the line and the field, like the SFT formats do."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..constants import TOOL, USER
from ..hparams import PromptDataArguments
from .dataset import DataKind, ItemEncoding, build_dataset, encode_items, report_encoding
from .formats import (
    Message,
    Row,
    check_role_order,
    is_openai_preference,
    load_items,
    offered_tools,
    openai_input,
    openai_messages,
    sharegpt_messages,
)
from .hh import DAHOAS, hh_kind, hh_prompt
from .mix import RowSelection
from .template import PromptTooLong, fit_prompt

ANSWER_FIELD = "answer"  # the reference answer of a verifiable task, for reward functions such as exact_answer


@dataclass(frozen=True)
class Prompt:
    """One prompt, where it came from, and (once encoded) its token ids."""

    row: Row
    messages: list[Message]
    input_ids: tuple[int, ...] = ()


def prompt_from_row(row: Row) -> Prompt:
    d = row.data
    kind = hh_kind(d)
    if kind:
        field, messages = ("prompt" if kind == DAHOAS else "chosen"), hh_prompt(row, kind)
    elif "messages" in d:
        field, messages = "messages", openai_messages(row, d["messages"])
    elif "conversations" in d:
        field, messages = "conversations", sharegpt_messages(row, d["conversations"])
    elif is_openai_preference(d):  # OpenAI's preference fine-tuning row: the prompt is its `input`
        field, messages = "input.messages", openai_input(row)[0]
    elif "prompt" in d:
        field, value = "prompt", d["prompt"]
        if isinstance(value, str):
            if not value.strip():
                raise row.error("empty prompt", field)
            messages = [{"role": USER, "content": value}]
        elif isinstance(value, list):
            messages = openai_messages(row, value, field)
        else:
            raise row.error(f"expected a string or a list of {{role, content}} messages, got {type(value).__name__}",
                            field)
    else:
        raise row.error(
            f"unknown prompt format (keys: {sorted(d)}); expected `prompt` (a string), or `messages` / "
            "`conversations` ending with a user turn"
        )
    check_role_order(row, messages, field, ends_with=(USER, TOOL))  # a reply may follow a tool result
    answer = d.get(ANSWER_FIELD)
    if ANSWER_FIELD in d and (isinstance(answer, bool) or not isinstance(answer, str | int | float)
                              or not str(answer).strip()):
        raise row.error(f"expected the reference answer as a non-empty string or a number, got {answer!r}", ANSWER_FIELD)
    return Prompt(row, messages)


def load_prompts(paths: Sequence[str], max_samples: int | None = None) -> list[Prompt]:
    """Every prompt in the given files, in order (the format is detected per row)."""
    return load_items(paths, prompt_from_row, max_samples)[0]


def encode_prompt_record(tokenizer: Any, prompt: Prompt, max_length: int) -> ItemEncoding | None:
    """The prompt rendered by the chat template (asking for the assistant's reply), without its oldest whole
    turns while longer than max_length tokens, as chat fits its history (template.fit_prompt); None when the
    system prompt and the last turn alone are too long: cutting into them would drop the question the reply
    must answer."""
    try:
        ids, messages, first = fit_prompt(tokenizer, prompt.messages, max_length, tools=offered_tools(prompt.row))
    except PromptTooLong:
        return None
    # Messages and the row as JSON: their keys vary from row to row, which a table column cannot hold.
    return ItemEncoding([{"input_ids": ids, "messages": json.dumps(messages, ensure_ascii=False),
                          "row": json.dumps(prompt.row.data, ensure_ascii=False)}], truncated=first > 0)


def prompt_from_record(record: dict) -> Prompt:
    return Prompt(Row(record["source"], record["line"], json.loads(record["row"])), json.loads(record["messages"]),
                  tuple(record["input_ids"]))


PROMPTS = DataKind(
    name="prompts",
    # 3: a malformed `answer` field is refused; 4: HH transcripts (hh.py); 5: OpenAI preference rows, and a reply
    # right after the system prompt; 6: long prompts lose their oldest turns
    version="6",
    from_row=prompt_from_row,
    settings=lambda data_args: {"max_length": data_args.max_prompt_length},
    encode_one=encode_prompt_record,
    dropped_because="the system prompt and last turn alone are longer than max_prompt_length",
    report_line="{name}: {rows} prompts -> {kept} kept ({truncated} without their oldest turns, {dropped} dropped: "
                "{dropped_because})",
    nothing_kept="every prompt's system prompt and last turn alone are longer than --max_prompt_length {max_length} "
                 "tokens: raise it",
)


def encode_prompts(tokenizer: Any, prompts: list[Prompt], max_length: int, name: str = "prompts") -> list[Prompt]:
    """The prompts that fit in max_length tokens, with their token ids (for prompts built in code;
    files go through build_prompts, which caches)."""
    records, stats, _ = encode_items(PROMPTS, tokenizer, prompts, max_length=max_length)
    report_encoding(PROMPTS, name, sorted({p.row.path for p in prompts}), stats, {"max_length": max_length})
    return [prompt_from_record(r) for r in records]


def build_prompts(tokenizer: Any, data_args: PromptDataArguments, name: str = "prompts", seed: int = 42) -> list[Prompt]:
    """The prompts of --data_path (the first --max_samples rows, or all; with --data_split the PPO part,
    with --data_weights drawn by weight, both seeded by `seed`), encoded, from the cache when the same
    files, tokenizer, chat template, --max_prompt_length and selection were encoded before."""
    dataset = build_dataset(PROMPTS, tokenizer, data_args.data_path, data_args, name, data_args.max_samples,
                            selection=RowSelection.of(data_args, seed))
    return [prompt_from_record(r) for r in dataset]


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) with the padding on the left, so every prompt ends where
    generation starts."""
    longest = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            input_ids[i, longest - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            attention_mask[i, longest - len(s):] = 1
    return input_ids, attention_mask
