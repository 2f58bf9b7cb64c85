"""RLHF prompts: conversations that end with a user turn, for the policy to answer.

A row is an OpenAI `messages` list or a ShareGPT `conversations` list ending with a user turn, or
a `prompt` field: a plain string (one user turn) or a list of {role, content} messages. Every
error names the file, the line and the field, like the SFT formats do."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..constants import USER
from .formats import DataError, Message, Row, check_role_order, openai_messages, read_rows, sharegpt_messages
from .template import encode_prompt

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """One prompt, where it came from, and (once encoded) its token ids."""

    row: Row
    messages: list[Message]
    input_ids: tuple[int, ...] = ()


def prompt_from_row(row: Row) -> Prompt:
    d = row.data
    if "messages" in d:
        field, messages = "messages", openai_messages(row, d["messages"])
    elif "conversations" in d:
        field, messages = "conversations", sharegpt_messages(row, d["conversations"])
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
    check_role_order(row, messages, field, ends_with=USER)
    return Prompt(row, messages)


def load_prompts(paths: Sequence[str], max_samples: int | None = None) -> list[Prompt]:
    """Every prompt in the given files, in order (the format is detected per row)."""
    prompts: list[Prompt] = []
    for path in paths:
        for row in read_rows(path):
            prompts.append(prompt_from_row(row))
            if max_samples is not None and len(prompts) >= max_samples:
                return prompts
    if not prompts:
        raise DataError(f"{', '.join(paths)}: no prompts found")
    return prompts


def encode_prompts(tokenizer: Any, prompts: list[Prompt], max_length: int) -> list[Prompt]:
    """The prompts rendered by the chat template (asking for the assistant's reply), without those
    longer than max_length tokens: cutting a prompt would drop the question the reply must answer."""
    kept = []
    for p in prompts:
        ids = encode_prompt(tokenizer, p.messages)
        if len(ids) > max_length:
            logger.debug("%s: dropped, %d prompt tokens > max_prompt_length %d", p.row.where(), len(ids), max_length)
            continue
        kept.append(Prompt(p.row, p.messages, tuple(ids)))
    dropped = len(prompts) - len(kept)
    if dropped:
        logger.warning("%d of %d prompts are longer than max_prompt_length=%d tokens and were dropped",
                       dropped, len(prompts), max_length)
    if not kept:
        raise DataError(f"every prompt is longer than max_prompt_length={max_length} tokens: raise --max_prompt_length")
    return kept


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
