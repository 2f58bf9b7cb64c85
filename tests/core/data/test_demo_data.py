"""The shipped demo data (data/demo/) is its own source: edited as files, checked here. Every file reads with
tunesmith's own loaders; held-out sets share nothing with what is trained on; no reply trains a wrong identity."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tunesmith.constants import USER
from tunesmith.data.formats import load_conversations
from tunesmith.data.preference import load_pairs
from tunesmith.data.prompts import load_prompts

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
WRONG_IDENTITY = re.compile(r"\b(I'm|I am) (ChatGPT|SmolLM|Claude|Gemini)\b|我是\s?(ChatGPT|SmolLM)")


def norm(text: str) -> str:
    return " ".join(text.lower().split())


def user_texts(messages: list[dict]) -> set[str]:
    return {norm(m["content"]) for m in messages if m["role"] == USER}


def context(messages: list[dict]) -> tuple:
    return tuple((m["role"], norm(m["content"])) for m in messages if m["role"] != "system")


@pytest.fixture(scope="module")
def demo():
    return {
        "sft": load_conversations([str(DEMO / "sft.jsonl")]),
        "preference": load_pairs([str(DEMO / "preference.jsonl")]),
        "preference_eval": load_pairs([str(DEMO / "preference_eval.jsonl")]),
        "prompts": load_prompts([str(DEMO / "prompts.jsonl")]),
        "prompts_eval": load_prompts([str(DEMO / "prompts_eval.jsonl")]),
        "identity_heldout": load_prompts([str(DEMO / "identity_heldout.jsonl")]),
    }


def test_every_file_reads_with_the_loaders_in_the_sizes_the_readme_gives(demo):
    sizes = {name: len(items) for name, items in demo.items()}
    assert sizes == {"sft": 300, "preference": 300, "preference_eval": 60, "prompts": 250, "prompts_eval": 50,
                     "identity_heldout": 14}
    readme = (DEMO / "README.md").read_text(encoding="utf-8")
    for name, size in sizes.items():
        assert re.search(rf"`{name}\.jsonl`[^\n]*\b{size}\b", readme), f"README's row count for {name}.jsonl"


def test_held_out_sets_share_nothing_with_training(demo):
    held = {norm(p.messages[-1]["content"]) for p in demo["identity_heldout"]}
    assert len(held) == len(demo["identity_heldout"])
    trained_users = set().union(*(user_texts(c.messages) for c in demo["sft"]),
                                *(user_texts(p.context) for p in demo["preference"]),
                                *(user_texts(p.messages) for p in demo["prompts"]))
    assert not held & trained_users
    for train, held_out, messages in (("preference", "preference_eval", lambda p: p.context),
                                      ("prompts", "prompts_eval", lambda p: p.messages)):
        contexts = {context(messages(p)) for p in demo[train]}
        finals = {norm(messages(p)[-1]["content"]) for p in demo[train]}
        assert not contexts & {context(messages(p)) for p in demo[held_out]}, held_out
        assert not finals & {norm(messages(p)[-1]["content"]) for p in demo[held_out]}, held_out
    assert len({context(c.messages) for c in demo["sft"]}) == len(demo["sft"])


def test_no_trained_reply_claims_another_identity(demo):
    replies = [m["content"] for c in demo["sft"] for m in c.messages if m["role"] == "assistant"]
    replies += [m["content"] for p in demo["preference"] + demo["preference_eval"] for m in p.chosen]
    assert not [r for r in replies if WRONG_IDENTITY.search(r)]
    rejected = [m["content"] for p in demo["preference"] for m in p.rejected]
    assert any(WRONG_IDENTITY.search(r) for r in rejected)  # the reward model learns to prefer the right one


def test_margins_are_in_range(demo):
    rows = [json.loads(line) for line in (DEMO / "preference.jsonl").read_text(encoding="utf-8").splitlines()]
    margins = [r["margin"] for r in rows if "margin" in r]
    assert margins and all(0.5 <= m <= 2.0 for m in margins)
