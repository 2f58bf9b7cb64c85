"""Probe chat templates with tunesmith's masking: for every Jinja file given (e.g. the official
templates of the model families you train), render a set of probe conversations (one turn, several
turns, a system prompt, a tool call, reasoning) on the default tokenizer with the template's own
marker strings added as special tokens, and report per probe whether each reply was located in the
whole conversation, expanded into one example per reply, or refused, and why.

    python scripts/check_templates.py path/to/templates/*.jinja
    python scripts/check_templates.py qwen3.jinja --show

A reply counts as trained right when the trained text holds its content (and its tool call's name).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.formats import Row, conversation_from_row
from tunesmith.data.template import encode_examples
from tunesmith.errors import UserError
from tunesmith.hparams import ModelArguments
from tunesmith.models.loader import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TURN = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "2+2 is 4."}]
PROBES = {
    "one turn": (TURN, None),
    "multi-turn": ([*TURN, {"role": "user", "content": "And times 3?"},
                    {"role": "assistant", "content": "That makes 12."}], None),
    "system": ([{"role": "system", "content": "You are terse."}, *TURN], None),
    "tool call": ([{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "18C and sunny"},
                   {"role": "assistant", "content": "It is 18C and sunny in Paris."}], TOOLS),
    "reasoning": ([TURN[0], {**TURN[1], "reasoning_content": "Add two and two."}], None),
}
# Literal marker strings in a template: <|...|>, <｜...｜>, <start_of_turn>, [INST], <think> and the like.
MARKERS = re.compile(r"<\|[^<>|\s]{1,40}\|>|<｜[^<>\s]{1,40}｜>|<[/A-Za-z_0-9]{2,30}>|\[/?[A-Z_]{3,30}\]|<\|?[a-z_]{2,20}\|?>")


def family_tokenizer(base, template: str):
    tok = copy.deepcopy(base)
    markers = set(MARKERS.findall(template))
    if "'<|' + message['role'] + '|>'" in template or "'<|' + message.role + '|>'" in template:
        markers |= {f"<|{role}|>" for role in ("system", "user", "assistant", "tool")}  # Phi builds its headers
    markers = sorted(markers - set(tok.get_vocab()))
    if markers:
        tok.add_special_tokens({"additional_special_tokens": markers})
    tok.chat_template = template
    return tok


def probe(tok, messages: list[dict], tools: list[dict] | None, show: bool = False) -> str:
    # Through the data reader, as a training row would go (it links tool results to their calls).
    conv = conversation_from_row(Row("probe", 1, {"messages": messages, **({"tools": tools} if tools else {})}))
    try:
        examples, expanded = encode_examples(tok, conv.messages, tools=conv.tools)
    except UserError as e:
        return f"refused: {str(e).splitlines()[0]}"
    trained = " | ".join(tok.decode([t for t, lab in zip(ex.input_ids, ex.labels) if lab != IGNORE_INDEX])
                         for ex in examples)
    if show:
        print(f"      trained: {trained!r}")
    wanted = [m["content"] for m in messages if m["role"] == "assistant" and m.get("content")]
    wanted += [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    missing = [w for w in wanted if w not in trained]
    no_marker = sum(ex.replies_without_end_marker for ex in examples)
    verdict = "expanded" if expanded else "whole"
    if missing:
        verdict += f", NOT TRAINED: {missing}"
    if no_marker:
        verdict += f", {no_marker} replies end in no special token"
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("templates", nargs="+", help="Jinja chat-template files")
    parser.add_argument("--show", action="store_true", help="print each probe's trained text too")
    args = parser.parse_args()
    base = load_tokenizer(ModelArguments())
    counts = {"whole": 0, "expanded": 0, "refused": 0, "not trained": 0}
    for path in args.templates:
        tok = family_tokenizer(base, Path(path).read_text(encoding="utf-8"))
        print(f"== {Path(path).name}")
        for name, (messages, tools) in PROBES.items():
            verdict = probe(tok, messages, tools, args.show)
            counts["refused" if verdict.startswith("refused") else "expanded" if verdict.startswith("expanded")
                   else "whole"] += 1
            counts["not trained"] += "NOT TRAINED" in verdict
            print(f"   {name:<11} {verdict}")
    print(f"{len(args.templates)} templates x {len(PROBES)} probes: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
