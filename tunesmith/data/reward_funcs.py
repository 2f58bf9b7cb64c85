"""Reward functions tunesmith ships, for verifiable tasks: `--reward_funcs exact_answer answer_format` (or
`tunesmith.data.reward_funcs:exact_answer`). Any function of the same shape works:

    def my_reward(prompts, replies, **fields) -> list[float]

called on a batch: `prompts` are the conversations (lists of {role, content}), `replies` the decoded reply
texts, and every other field of the data rows comes as a keyword argument, one value per reply (None where
a row lacks it), e.g. `answer` in `{"messages": [...], "answer": "42"}`. Accept `**fields` so that fields
a function does not use are ignored. An exception raised for one reply is reported with the function's
name and that reply's data row.

The answer format these functions read: the reply's LAST non-empty line holds `Answer:`, and the answer is
what follows its last `Answer:` there. The strict format (answer_format) is a last line of exactly
`Answer: <number>`; exact_answer takes the last number after `Answer:` as the answer when the reference is a
number, so `Add 3 and 4. Answer: 3 + 4 = 7` answers 7 (right, but not in the strict format). E.g.

    3 + 4 = 7.
    Answer: 7
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# The last "Answer:" of the reply's last non-empty line, then the answer (the rest of the line); `strict`: the
# line holds nothing before it.
ANSWER = re.compile(r"^(?P<before>.*)Answer:[ \t]*(?P<answer>.*?)[ \t]*$")
NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?$")
NUMBERS = re.compile(r"[-+]?\d+(?:\.\d+)?")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")  # the comma of 10,063
LENGTH_BUDGET = 100  # characters a reply may use before length_penalty starts to count


def last_line(reply: str) -> str:
    lines = [line for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def extract_answer(reply: str, strict: bool = False) -> str | None:
    """What follows the last `Answer:` of the reply's last non-empty line, without surrounding spaces or a final
    full stop; None when that line has no `Answer:` (strict: when it does not start with it)."""
    match = ANSWER.match(last_line(reply))
    if not match or (strict and match["before"].strip()):
        return None
    return match["answer"].removesuffix(".").strip()


def same_answer(given: str, reference: Any) -> bool:
    """For a numeric reference: the last number in `given` equals it as a number ("7.0" == "7", and
    "3 + 4 = 7" gives 7). Otherwise: equal ignoring case and spaces at the ends."""
    reference = str(reference).strip()
    if NUMBER.match(reference):
        numbers = NUMBERS.findall(given)
        return bool(numbers) and float(numbers[-1]) == float(reference)
    return given.casefold() == reference.casefold()


def exact_answer(prompts: Sequence[Any], replies: Sequence[str], answer: Sequence[Any] | None = None,
                 **fields: Any) -> list[float]:
    """1.0 when the reply's last line has `Answer:` and what follows gives the row's `answer` (for a number:
    the last number there, compared as a number; else the whole text, ignoring case), else 0.0.
    A row without an `answer` field is an error: there is nothing to check the reply against."""
    if answer is None:
        answer = [None] * len(replies)
    scores = []
    for reply, reference in zip(replies, answer):
        if reference is None:
            raise ValueError("the row has no `answer` field (exact_answer needs the reference answer)")
        given = extract_answer(reply)
        scores.append(float(given is not None and same_answer(given, reference)))
    return scores


def final_number(prompts: Sequence[Any], replies: Sequence[str], answer: Sequence[Any] | None = None,
                 **fields: Any) -> list[float]:
    """1.0 when a number of the reply's last non-empty line (thousands separators allowed: 10,063) equals the row's
    numeric `answer`, else 0.0: no answer format asked for, so `It is 10063.` and `10063 is 347 times 29.` both
    count. Meant for answers that cannot be guessed (a product of large numbers: a line listing numbers will not
    hold it by chance); where an answer is small, prefer exact_answer's format. For an agent trajectory
    (--tool_funcs) the reply is the whole trajectory and its last line the final answer, so a number that appears
    only in a tool's result does not count. A row without a numeric `answer` is an error."""
    if answer is None:
        answer = [None] * len(replies)
    scores = []
    for reply, reference in zip(replies, answer):
        if reference is None or not NUMBER.match(str(reference).strip()):
            raise ValueError(f"the row's `answer` is {reference!r}: final_number needs a number to check against")
        numbers = NUMBERS.findall(THOUSANDS.sub("", last_line(reply)))
        scores.append(float(any(float(n) == float(reference) for n in numbers)))
    return scores


def answer_format(prompts: Sequence[Any], replies: Sequence[str], **fields: Any) -> list[float]:
    """1.0 when the reply's last non-empty line is exactly `Answer: <number>` (an integer or decimal, optional
    sign, an optional final full stop), right or wrong; else 0.0. It checks the format only, so a policy can
    learn it before it learns the answers."""
    return [float(a is not None and bool(NUMBER.match(a))) for a in (extract_answer(r, strict=True) for r in replies)]


def length_penalty(prompts: Sequence[Any], replies: Sequence[str], **fields: Any) -> list[float]:
    """0.0 for a reply of up to LENGTH_BUDGET (100) characters, then -1.0 per further 100 characters
    (-0.5 at 150): a pull towards short replies, for use with a small weight beside the rewards that judge
    correctness."""
    return [-max(0, len(reply) - LENGTH_BUDGET) / LENGTH_BUDGET for reply in replies]
