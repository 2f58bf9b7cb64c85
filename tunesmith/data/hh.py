"""Anthropic HH transcripts, as DeepSpeed-Chat trains on them, read into messages.

Two row shapes, told apart from the other formats per row:
- `hh` (Anthropic/hh-rlhf): `chosen` and `rejected` are whole transcripts,
  "\\n\\nHuman: ...\\n\\nAssistant: ...", several turns; the two share every turn but the last reply.
- `dahoas` (Dahoas/rm-static, Dahoas/full-hh-rlhf): `prompt` is the transcript so far ending with
  "\\n\\nAssistant:", and `chosen`, `rejected` (and `response`) are replies, each " " + text.

A transcript splits at each "\\n\\nHuman:" / "\\n\\nAssistant:" (the first may open the text without the
blank line); Human turns become user messages, Assistant turns assistant messages, each stripped of the
spaces around it. "Human:" inside a line is text. Two turns of one speaker in a row (HH has a few) are
joined by a blank line. What each stage takes, following DeepSpeed-Chat's raw_datasets.py
(get_prompt, get_prompt_and_chosen, get_chosen/get_rejected):
- SFT: the conversation of `chosen` (hh), or the prompt's turns and `chosen` (dahoas; `response` is
  not used, as DeepSpeed-Chat's get_prompt_and_chosen does not); the Assistant turns train.
- reward/DPO: the turns before the last reply as the context, the two last replies as chosen/rejected.
- PPO: the turns before the last reply (hh), or the prompt's turns (dahoas)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..constants import ASSISTANT, USER

if TYPE_CHECKING:
    from .formats import Message, Row

HH, DAHOAS = "hh", "dahoas"
SPEAKERS = {"Human": USER, "Assistant": ASSISTANT}
MARKER = re.compile(r"(?:\A\s*|\n\n)(Human|Assistant):")
OPENS_LIKE_HH = re.compile(r"\s*Human:")


def looks_like_hh(value: Any) -> bool:
    """A string that opens with a Human turn ("\\n\\nHuman: ...")."""
    return isinstance(value, str) and OPENS_LIKE_HH.match(value) is not None


def hh_kind(data: dict) -> str | None:
    """`hh`, `dahoas`, or None when the row is neither."""
    if looks_like_hh(data.get("prompt")):
        return DAHOAS
    if not any(key in data for key in ("prompt", "messages", "conversations")) and looks_like_hh(data.get("chosen")):
        return HH
    return None


def parse_transcript(row: Row, text: Any, field: str, open_end: bool = False) -> list[Message]:
    """The messages of one HH transcript. With open_end (a Dahoas prompt) it must end with an empty
    "Assistant:" turn, which is dropped; otherwise with an Assistant reply."""
    if not isinstance(text, str):
        raise row.error(f"expected an HH transcript string, got {type(text).__name__}", field)
    marks = list(MARKER.finditer(text))
    if not marks or not OPENS_LIKE_HH.match(text):
        raise row.error('not an HH transcript: it must open with "\\n\\nHuman: " and give turns as "\\n\\nHuman: ..." '
                        'and "\\n\\nAssistant: ..."', field)
    messages: list[Message] = []
    for k, mark in enumerate(marks):
        role = SPEAKERS[mark.group(1)]
        content = text[mark.end(): marks[k + 1].start() if k + 1 < len(marks) else len(text)].strip()
        last = k == len(marks) - 1
        if not content and not (open_end and last):
            what = "the last Assistant reply is empty" if last and role == ASSISTANT else f"turn {k + 1} ({mark.group(1)}) is empty"
            raise row.error(f"{what}; remove the row or give the turn its text", field)
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n\n" + content
        else:
            messages.append({"role": role, "content": content})
    if open_end:
        if messages[-1]["role"] != ASSISTANT or messages[-1]["content"]:
            raise row.error('a prompt must end with "\\n\\nAssistant:" (the reply comes in `chosen`/`rejected`)', field)
        messages.pop()
    elif messages[-1]["role"] != ASSISTANT:
        raise row.error("the transcript ends with a Human turn; it must end with the Assistant reply", field)
    return messages


def _reply(row: Row, field: str) -> str:
    value = row.data.get(field)
    if not isinstance(value, str):
        raise row.error(f"expected the reply as a string, got {type(value).__name__}", field)
    if not value.strip():
        raise row.error("empty reply: nothing to train", field)
    return value.strip()


def hh_conversation(row: Row, kind: str) -> list[Message]:
    """The SFT conversation: `chosen` (hh), or the prompt's turns and `chosen` (dahoas)."""
    if kind == HH:
        return parse_transcript(row, row.data["chosen"], "chosen")
    return parse_transcript(row, row.data["prompt"], "prompt", open_end=True) + \
        [{"role": ASSISTANT, "content": _reply(row, "chosen")}]


def hh_prompt(row: Row, kind: str) -> list[Message]:
    """The PPO prompt: the turns before the last reply of `chosen` (hh), or the prompt's turns (dahoas)."""
    if kind == HH:
        return parse_transcript(row, row.data["chosen"], "chosen")[:-1]
    return parse_transcript(row, row.data["prompt"], "prompt", open_end=True)


def hh_pair(row: Row, kind: str) -> tuple[list[Message], Message, Message]:
    """(context, chosen reply, rejected reply) of a preference row."""
    for key in ("chosen", "rejected"):
        if key not in row.data:
            raise row.error("missing (a preference row needs `chosen` and `rejected`)", key)
    if kind == DAHOAS:
        context = parse_transcript(row, row.data["prompt"], "prompt", open_end=True)
        return (context, {"role": ASSISTANT, "content": _reply(row, "chosen")},
                {"role": ASSISTANT, "content": _reply(row, "rejected")})
    chosen = parse_transcript(row, row.data["chosen"], "chosen")
    rejected = parse_transcript(row, row.data["rejected"], "rejected")
    if chosen[:-1] != rejected[:-1]:
        turn = next((k for k, (a, b) in enumerate(zip(chosen[:-1], rejected[:-1], strict=False)) if a != b),
                    min(len(chosen), len(rejected)) - 1)
        raise row.error(f"differs from `chosen` at turn {turn + 1}, before the last Assistant reply: the two "
                        "transcripts of a pair must share every turn but the last reply", "rejected")
    return chosen[:-1], chosen[-1], rejected[-1]
