"""The CLI reference of the documentation site (docs/cli.md), generated: every command of `cli.COMMANDS`, and
for each the flags of the very `Parser` its recipe parses with (the dataclasses of `hparams.RUN_ARGUMENTS`),
grouped as `--help` groups them, each with its type, default and help text. The MkDocs hook
(docs/hooks/cli_reference.py) puts it into the page whenever the site is built, so a new flag or command is
documented by its help text alone and no generated file is committed that could go stale.

    python -m tunesmith.cli_reference > /tmp/cli.md    # the same Markdown, to read without building the site
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.hf_argparser import string_to_bool

from .cli import COMMANDS, HIDDEN_COMMANDS, summary
from .hparams import RUN_ARGUMENTS
from .hparams.parser import DEPRECATED_FLAGS, DEPRECATED_UNTIL, MEANING_MOVED, Parser

# Where docs/cli.md wants the generated reference.
MARKER = "<!-- cli-reference -->"

# The kinds of run a command parses, where it is not the one named like the command: `tunesmith eval` runs
# lm-eval, or the policy evaluation when a policy flag is given (evaluation/command.py, POLICY_FLAGS).
COMMAND_RUNS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "eval": (("eval", ()), ("eval_policy", ("--policy", "POLICY"))),
    "vllm-serve": (("vllm_serve", ()),),  # a kind's name is a Python identifier
}

# A group longer than this (transformers' own ~130 Trainer options) is folded, so a stage's own flags stay in view.
FOLD_GROUPS_LONGER_THAN = 40


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # as documented: `--flag` (and `--no_flag`, `-h`); each `--a_b` also spelled `--a-b`
    type: str
    default: Any
    help: str
    hidden: bool = False  # accepted, but left out of --help


@dataclass(frozen=True)
class FlagGroup:
    title: str
    description: str
    flags: tuple[Flag, ...]


@dataclass(frozen=True)
class Invocation:
    """One way a command parses its flags: `tunesmith eval`, or `tunesmith eval --policy P`."""

    command: str
    kind: str  # the key of hparams.RUN_ARGUMENTS
    selector: tuple[str, ...] = ()  # the arguments that choose this run over the command's other one

    @property
    def anchor(self) -> str:
        return "-".join([self.command, *(a.lstrip("-") for a in self.selector[:1])])

    @property
    def title(self) -> str:
        return " ".join(["tunesmith", self.command, *self.selector[:1]])

    @property
    def module(self) -> str:
        """The recipe module whose docstring opens the run's --help."""
        name = self.kind.replace("_", "-")
        return COMMANDS.get(name) or HIDDEN_COMMANDS[name]


def invocations() -> list[Invocation]:
    """Every command's runs, in the order of `tunesmith --help`."""
    return [Invocation(command, kind, selector) for command in COMMANDS
            for kind, selector in COMMAND_RUNS.get(command, ((command, ()),))]


def parser_of(invocation: Invocation) -> Parser:
    """The parser `hparams.parse_run(kind)` builds (its recipe's description aside, which adds no flag)."""
    return Parser(RUN_ARGUMENTS[invocation.kind], prog=invocation.title)


def flag_groups(parser: argparse.ArgumentParser) -> list[FlagGroup]:
    """The parser's flags, in its --help groups and order; a `--no_flag` joins its flag's row."""
    groups = []
    for group in parser._action_groups:  # argparse keeps no public list of a parser's groups
        rows: dict[str, Flag] = {}
        for action in group._group_actions:
            names = documented_names(action)
            if action.dest in rows:  # HfArgumentParser's `--no_flag` (store_false) after a boolean's own action
                rows[action.dest] = dataclasses.replace(rows[action.dest], names=rows[action.dest].names + names)
                continue
            rows[action.dest] = Flag(names, flag_type(action, parser), action.default,
                                     " ".join((action.help or "").replace("%%", "%").split()),
                                     hidden=action.help == argparse.SUPPRESS)
        if rows:
            groups.append(FlagGroup(group.title or "", group.description or "", tuple(rows.values())))
    return groups


def documented_names(action: argparse.Action) -> tuple[str, ...]:
    """The option strings less HfArgumentParser's hyphen spellings (`--a-b` beside `--a_b`), which the page
    states once."""
    strings = action.option_strings
    return tuple(s for s in strings if not (s.startswith("--") and "-" in s[2:] and hyphen_twin(s) in strings))


def hyphen_twin(option: str) -> str:
    """`--a_b` for `--a-b`."""
    return "--" + option[2:].replace("-", "_")


def all_spellings(names: tuple[str, ...]) -> set[str]:
    """Every option string a documented row stands for: the names and their hyphen spellings."""
    return {spelling for name in names
            for spelling in (name, "--" + name[2:].replace("_", "-") if name.startswith("--") else name)}


def flag_type(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    """What the flag takes, as the parser reads it."""
    if action.nargs == 0:
        return "flag (no value)"
    if action.choices:
        return " | ".join(str(c.value if isinstance(c, enum.Enum) else c) for c in action.choices)
    words = also_accepted_words(parser, action.dest)
    if words:
        return " | ".join(("bool", *words))
    if action.type is string_to_bool:
        return "bool"
    name = getattr(action.type, "__name__", None) or "str"
    return f"list of {name}" if action.nargs in ("+", "*") else name


def also_accepted_words(parser: argparse.ArgumentParser, dest: str) -> tuple[str, ...]:
    """The words a boolean flag takes besides true and false (a dataclass's `also_accepts`: the parser's
    boolean_or), which its argparse type, a closure, does not show."""
    for dtype in getattr(parser, "dataclass_types", ()):
        words = getattr(dtype, "also_accepts", {}).get(dest)
        if words:
            return tuple(words)
    return ()


def default_text(value: Any) -> str:
    if value in (None, argparse.SUPPRESS, "") or value == []:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


# ---------------------------------------------------------------------------- Markdown

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# Characters Markdown (or a table) would read as syntax: emphasis, links, attribute lists, cell borders.
_ESCAPED = str.maketrans({c: "\\" + c for c in "\\`*_[]{}|"} | {"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def inline_markdown(text: str) -> str:
    """A help text as one table cell of Markdown that shows exactly that text: its `code spans` kept (a pipe in
    one is no cell border to Python-Markdown's tables), everything else escaped."""
    parts, end = [], 0
    for match in _CODE_SPAN.finditer(text):
        parts += [text[end:match.start()].translate(_ESCAPED), match.group(0)]
        end = match.end()
    return "".join(parts + [text[end:].translate(_ESCAPED)])


def code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if text else "—"


def flag_row(flag: Flag) -> str:
    names = ", ".join(code(n) for n in flag.names)
    help_text = inline_markdown(flag.help) if not flag.hidden else "(accepted; not listed by `--help`)"
    return f"| {names} | {inline_markdown(flag.type)} | {code(default_text(flag.default))} | {help_text} |"


def group_markdown(group: FlagGroup) -> list[str]:
    table = ["| flag | type | default | what it does |", "|---|---|---|---|", *map(flag_row, group.flags)]
    about = [inline_markdown(group.description), ""] if group.description else []
    if len(group.flags) <= FOLD_GROUPS_LONGER_THAN:
        return [f"**{inline_markdown(group.title)}**", "", *about, *table, ""]
    title = f"{group.title}: {len(group.flags)} flags"
    return [f'??? note "{title}"', "", *("    " + line if line else "" for line in (*about, *table)), ""]


def fenced(text: str, language: str = "text") -> list[str]:
    """A fenced code block that no run of backticks inside the text can close."""
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`+", text))])
    return [fence + language, text, fence]


def recipe_docstring(module: str) -> str:
    origin = importlib.util.find_spec(module).origin  # read, not imported: the recipes import torch and models
    return ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8"))) or ""


def invocation_markdown(invocation: Invocation) -> list[str]:
    lines = [f"## {invocation.title} {{#{invocation.anchor}}}", "", inline_markdown(summary(invocation.module)), "",
             f"`{invocation.title} --help` opens with:", "", *fenced(recipe_docstring(invocation.module)), ""]
    for group in flag_groups(parser_of(invocation)):
        lines += group_markdown(group)
    return lines


def renamed_flags_markdown() -> list[str]:
    lines = ["## Old spellings {#old-spellings}", "",
             f"Accepted until tunesmith {DEPRECATED_UNTIL}, with a deprecation line, wherever the new flag exists:", "",
             "| old | new |", "|---|---|"]
    lines += [f"| `--{old}` | `--{new}` |" for old, new in DEPRECATED_FLAGS.items()]
    lines += ["", "Refused in one line that names the new flag, because the old name kept another meaning:", "",
              "| old | new | why |", "|---|---|---|"]
    lines += [f"| `--{old}` | `--{new}` | {inline_markdown(why)} |" for old, (new, why) in MEANING_MOVED.items()]
    return lines + [""]


def reference_markdown() -> str:
    """The generated part of docs/cli.md."""
    lines = ["Commands: " + ", ".join(f"[`{i.title}`](#{i.anchor})" for i in invocations()) + ".", ""]
    for invocation in invocations():
        lines += invocation_markdown(invocation)
    return "\n".join(lines + renamed_flags_markdown())


def reference_flags(invocation: Invocation) -> Iterator[Flag]:
    for group in flag_groups(parser_of(invocation)):
        yield from group.flags


if __name__ == "__main__":
    print(reference_markdown())
