"""A reply's tool call scored against the one it should make: the scores `tunesmith compare` prints and the shipped
tunesmith_tool_calls lm-eval task reports. Below serve/, evaluation/ and rl/ (each a feature, none importing
another), beside the parsing of data/tool_calls.py.

Scoring is more lenient than parsing: the first JSON object with a string "name" anywhere in the reply is its
call, whatever the format around it."""

from __future__ import annotations

import json

CALL_SCORES = ("well_formed", "right_function", "right_arguments")


def first_call(text: str) -> dict | None:
    """The first JSON object with a string `name` in a reply (how every tool-call format writes it)."""
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            return value
    return None


def score_call(reply: str, expected: dict) -> dict[str, int]:
    """1 or 0 for each of CALL_SCORES: the reply holds a well-formed call (a JSON object with a name and
    object arguments), to the expected function, with the expected arguments too."""
    scores = dict.fromkeys(CALL_SCORES, 0)
    call = first_call(reply)
    if call is None or not isinstance(call.get("arguments", {}), dict):
        return scores
    scores["well_formed"] = 1
    if call["name"] == expected["name"]:
        scores["right_function"] = 1
        scores["right_arguments"] = int(same_arguments(call.get("arguments", {}), expected.get("arguments", {})))
    return scores


def score_calls(replies: list[str], expected: list[dict]) -> dict[str, int]:
    """How many replies score on each of CALL_SCORES (see score_call)."""
    scores = [score_call(reply, want) for reply, want in zip(replies, expected)]
    return {key: sum(s[key] for s in scores) for key in CALL_SCORES}


def same_arguments(got: dict, want: dict) -> bool:
    """Equal arguments, numbers compared as numbers (5 == 5.0)."""
    return got.keys() == want.keys() and all(
        float(got[k]) == float(want[k]) if isinstance(want[k], int | float) and isinstance(got[k], int | float)
        else got[k] == want[k] for k in want)
