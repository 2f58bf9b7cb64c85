"""The manual cannot teach what the code does not do. Every `tunesmith ...` command line that README.md and
docs/*.md show (in a shell block, or as an inline code span in prose and tables), and every stage script a launcher
starts there (`torchrun ... sft/train.py ...`), goes through the real parser of that command: each flag exists for
it, no old spelling is taught (parser.DEPRECATED_FLAGS) and, in shell blocks, the values parse. Every repository
path those lines and the prose's code spans name exists. Every `--help` a page quotes (a block opening with
`$ tunesmith CMD --help`) says what the command's `--help` says now.

Shell blocks are ```bash, ```sh, ```shell and ```console; a ```text block is output, where a page may show a mistake
on purpose (getting-started.md's misspelt flag). Uppercase words stand for a value the reader fills in (`M`, `DIR`).
The development record under docs/dev/ quotes history and is not checked. Prose lines keep to 120 characters (a
table row, a command or a quoted output cannot be wrapped without changing what it shows); the benchmark appendix
is a record of runs, its width left as it was."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tunesmith import cli
from tunesmith.cli_reference import COMMAND_RUNS, Invocation, parser_of
from tunesmith.errors import ConfigError
from tunesmith.hparams import RUN_ARGUMENTS
from tunesmith.hparams.parser import DEPRECATED_FLAGS, MEANING_MOVED, parse_namespace

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w-]*)")
SPAN_OVER_LINES = re.compile(r"(`+)((?:(?!\n\s*\n).)+?)\1", flags=re.S)  # not across a paragraph break
# M, DIR, RUN_CONFIG.yaml, F.gguf, <stage>, a shell variable
PLACEHOLDER = re.compile(r"^([A-Z][A-Z0-9_]*(\.[a-z]+)?|<[\w-]+>|.*\$.*)$")
# The stage scripts: each a shim that runs one command's main (sft/train.py runs tunesmith.sft.command's).
SCRIPT_COMMANDS = {
    str(path.relative_to(ROOT)): command
    for path in sorted(ROOT.glob("*/*.py")) if path.parent.name not in ("tests", "scripts", "tunesmith", "docs")
    for command, module in cli.COMMANDS.items()
    if f"from {module} import main" in path.read_text(encoding="utf-8")
}
TRACKED = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split())
TOP_LEVEL = {name.split("/")[0] for name in TRACKED if "/" in name}


@dataclass(frozen=True)
class Shown:
    """A command line as a page shows it."""

    page: str
    line: int
    text: str
    in_shell_block: bool  # a block of commands to run: the values parse too, not only the flags

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        body, start = [], i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        yield language.lower(), start, body
        i += 1


def prose(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced blocks, with their numbers."""
    inside = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and inside is None:
            inside = match.group(2)
        elif inside is not None and line.strip().startswith(inside):
            inside = None
        elif inside is None:
            yield number, line


def prose_spans(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each inline code span outside fenced blocks, one wrapped over lines included."""
    kept = dict(prose(text))
    lines = [kept.get(number, "") for number in range(1, len(text.splitlines()) + 1)]
    joined_text = "\n".join(lines)
    for match in SPAN_OVER_LINES.finditer(joined_text):
        yield joined_text.count("\n", 0, match.start()) + 1, " ".join(match.group(2).split())


def joined(lines: list[str], first: int) -> Iterator[tuple[int, str]]:
    """Shell lines with their `\\` continuations joined, and a `$ ` prompt dropped."""
    pending, start = "", first
    for offset, line in enumerate(lines):
        if not pending:
            start = first + offset
        line = line.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, (pending + line).strip().removeprefix("$ ")
        pending = ""


def shown_commands() -> list[Shown]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(ROOT))
        for language, first, body in blocks(text):
            if language in SHELL_LANGUAGES:
                found += [Shown(name, n, line, True) for n, line in joined(body, first) if command_of(line)]
        for number, span in prose_spans(text):
            if command_of(span):
                found.append(Shown(name, number, span, False))
    return found


def words(line: str) -> list[str]:
    """The words of the line's first command (up to `&`, `;`, `|` or `&&`)."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in a table's shorthand: split on spaces
        tokens = line.split("#")[0].split()
    for i, token in enumerate(tokens):
        if token in ("&", "&&", "|", "||", ";") or token.endswith(";"):
            return tokens[:i] + ([token[:-1]] if token.endswith(";") and len(token) > 1 else [])
    return tokens


def command_of(line: str) -> tuple[str, list[str]] | None:
    """(command, its arguments) of a `tunesmith CMD ...` line, or of a stage script started by python or a
    launcher; None for any other line. Environment assignments before the program are skipped."""
    tokens = words(line)
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    if Path(tokens[0]).name == "tunesmith" or tokens[:3] in (["python", "-m", "tunesmith"],
                                                             [".venv/bin/python", "-m", "tunesmith"]):
        rest = tokens[1:] if Path(tokens[0]).name == "tunesmith" else tokens[3:]
        return (rest[0], rest[1:]) if rest else ("--help", [])
    if Path(tokens[0]).name in ("python", "python3", "torchrun", "deepspeed", "accelerate"):
        for i, token in enumerate(tokens):
            if token in SCRIPT_COMMANDS:
                return SCRIPT_COMMANDS[token], tokens[i + 1:]
    return None


def invocation_of(command: str, argv: list[str]) -> Invocation:
    flags = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    for kind, selector in reversed(COMMAND_RUNS.get(command, ((command, ()),))):
        if not selector or flags & policy_flags():
            return Invocation(command, kind, selector)
    return Invocation(command, command)


def policy_flags() -> set[str]:
    from tunesmith.evaluation.command import POLICY_FLAGS

    return set(POLICY_FLAGS)


@functools.cache
def known_flags(invocation: Invocation) -> frozenset[str]:
    """Every option string of the invocation's parser, without its dashes (one parser built per invocation)."""
    return frozenset(s[2:] for s in parser_of(invocation)._option_string_actions if s.startswith("--"))


def filled_in(argv: list[str]) -> list[str]:
    """The arguments with table shorthand undone: `[--flag X]` brackets and `a\\|b` alternatives (the first kept)."""
    out = []
    for token in argv:
        token = token.strip("[]").replace("\\|", "|")
        if token and token not in ("|", "...", "…"):
            out.append(token.split("|")[0] if not token.startswith("-") else token)
    return out


def problems_of(shown: Shown) -> list[str]:
    command, argv = command_of(shown.text)
    if command in ("--help", "-h", "--version", "-V") or PLACEHOLDER.match(command):
        return []
    if command in cli.HIDDEN_COMMANDS:
        return [f"`tunesmith {command}` is an old name; teach the command it now is"]
    if command not in cli.COMMANDS:
        return [f"no command `tunesmith {command}`"]
    argv = filled_in(argv)
    invocation = invocation_of(command, argv)
    known = known_flags(invocation)
    problems = []
    for token in argv:
        if not token.startswith("--"):
            continue
        name = token[2:].split("=")[0]
        if name in known:
            continue
        underscored = name.replace("-", "_")
        if underscored in DEPRECATED_FLAGS or underscored in MEANING_MOVED:
            new = DEPRECATED_FLAGS.get(underscored) or MEANING_MOVED[underscored][0]
            problems.append(f"--{name} is an old spelling: teach --{new}")
        else:
            problems.append(f"`{invocation.title}` has no flag --{name}")
    if problems or not shown.in_shell_block or "--help" in argv or "-h" in argv:
        return problems
    values = [a for a in argv if not PLACEHOLDER.match(a)] if any(map(PLACEHOLDER.match, argv)) else argv
    if values is not argv:  # a value the reader fills in: only the flags are checked
        return []
    try:
        parse_namespace(RUN_ARGUMENTS[invocation.kind], argv)
    except ConfigError as e:
        problems.append(str(e))
    except SystemExit:  # argparse's own refusal (a value of the wrong type), printed to stderr
        problems.append("argparse refused the values")
    return problems


SHOWN = shown_commands()


def test_the_pages_show_commands_to_check():
    assert len(SHOWN) > 100
    assert {s.page for s in SHOWN} >= {"README.md", "docs/sft.md", "docs/launch.md", "docs/your-own-model.md"}
    assert any("sft/train.py" in s.text for s in SHOWN)  # launcher lines are read too


def test_every_command_line_shown_parses_with_its_commands_flags(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # run configs and data paths as the pages give them, from the repository root
    wrong = [f"{shown}\n    {problem}" for shown in SHOWN for problem in problems_of(shown)]
    assert not wrong, "\n".join(wrong)


# A code span in prose names a repository file by one of these endings (a data file there is often the reader's own).
PROSE_FILE = re.compile(r"\.(py|sh|ya?ml|json|toml|cfg|md|go|png)$|/$")


def path_problems(page: str, number: int, token: str, in_prose: bool = False) -> list[str]:
    """A repository path (its first folder one of the repository's) that does not exist. In prose a module path
    may also be given from the package (`data/template.py` for tunesmith/data/template.py)."""
    token = token.strip("`'\",;:()").split("=")[-1].split("#")[0].rstrip(".")
    if not re.match(r"^\.?[\w.-]+/[\w./*-]*$", token) or "*" in token or token.startswith("./"):
        return []
    if in_prose and not PROSE_FILE.search(token) or any(PLACEHOLDER.match(part) for part in token.split("/") if part):
        return []
    first = token.split("/")[0]
    if first not in TOP_LEVEL and not (first.startswith(".") and first not in (".", "..", ".venv", ".venv-floors")):
        return []
    path = token.rstrip("/")
    candidates = [path, f"tunesmith/{path}"] if in_prose else [path]
    if any(c in TRACKED or any(name.startswith(c + "/") for name in TRACKED) for c in candidates):
        return []
    return [f"{page}:{number}: {token}: no such path in the repository"]


def test_every_repository_path_the_pages_name_exists():
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(ROOT))
        for language, first, body in blocks(text):
            if language in SHELL_LANGUAGES:
                for number, line in joined(body, first):
                    for token in words(line):
                        missing += path_problems(name, number, token)
        for number, span in prose_spans(text):
            for token in span.split():
                missing += path_problems(name, number, token, in_prose=True)
    assert not missing, "\n".join(missing)


def quoted_helps() -> list[tuple[str, int, list[str], list[str]]]:
    """(page, line, the command's arguments, the quoted lines) of each block that opens with `$ tunesmith ... --help`."""
    quotes = []
    for page in PAGES:
        for _, first, body in blocks(page.read_text(encoding="utf-8")):
            if body and body[0].startswith("$ ") and body[0].rstrip().endswith("--help"):
                command = command_of(body[0][2:])
                if command:
                    quotes.append((str(page.relative_to(ROOT)), first, [command[0], *command[1]], body[1:]))
    return quotes


def normalized(text: str) -> str:
    return " ".join(text.split())


WIDTH = 120


def test_prose_lines_keep_to_120_characters():
    wide = [f"{page.relative_to(ROOT)}:{number}: {len(line)} characters"
            for page in PAGES if page.name != "benchmark.md"
            for number, line in prose(page.read_text(encoding="utf-8"))
            if len(line) > WIDTH and not line.lstrip().startswith("|")]
    assert not wide, "\n".join(wide)


def help_text(argv: list[str], capsys) -> str:
    try:
        cli.main(argv)  # `tunesmith --help` returns; a command's --help exits 0
    except SystemExit as stop:
        assert stop.code in (0, None), argv
    return capsys.readouterr().out


def stale_lines(quotes: list[tuple[str, int, list[str], list[str]]], capsys) -> list[str]:
    stale = []
    for page, number, argv, quoted in quotes:
        real = normalized(help_text(argv, capsys))
        stale += [f"{page}:{number}: `tunesmith {' '.join(argv)}` no longer prints: {line.strip()}"
                  for line in quoted if line.strip() not in ("", "...", "…") and normalized(line) not in real]
    return stale


def test_every_quoted_help_says_what_the_help_says(monkeypatch, capsys):
    quotes = quoted_helps()
    assert {page for page, *_ in quotes} >= {"docs/plan.md"}
    monkeypatch.setenv("COLUMNS", "120")  # argparse wraps at the terminal's width; the pages quote it at 120
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main sets it for the recipe
    stale = stale_lines(quotes, capsys)
    assert not stale, "\n".join(stale)
    # and a quote the help does not print is found
    assert stale_lines([("p.md", 1, ["plan", "--help"], ["  --memory_gb MEMORY_GB  required where there is no GPU"])],
                       capsys)


@pytest.mark.parametrize("line, problem", [
    ("tunesmith sft configs/sft_lora_demo.yaml --lerning_rate 1e-4", "has no flag --lerning_rate"),
    ("tunesmith eval --policy P --prompts F", "--prompts is an old spelling: teach --data_path"),
    ("tunesmith chat --sample true", "--sample is an old spelling: teach --do_sample"),
    ("tunesmith eval-policy --policy P", "is an old name"),
    ("torchrun --nproc_per_node 2 sft/train.py configs/sft_lora_demo.yaml --no_such_flag 1", "no flag --no_such_flag"),
    ("tunesmith sft configs/no_such_config.yaml", "no such file"),
    ("tunesmith plan --plan_tokens many", "argparse refused"),
])
def test_the_check_finds_what_it_is_for(line, problem, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    found = problems_of(Shown("page.md", 1, line, True))
    assert any(problem in p for p in found), found


def test_the_path_check_finds_a_missing_path():
    assert path_problems("p.md", 1, ".gpu/run.sh") and path_problems("p.md", 1, "configs/no_such.yaml")
    assert path_problems("p.md", 1, "tunesmith/no_such.py", in_prose=True)
    assert not path_problems("p.md", 1, "data/template.py", in_prose=True)  # tunesmith/data/template.py
    assert not path_problems("p.md", 1, "configs/sft_lora_demo.yaml") and not path_problems("p.md", 1, "outputs/x")
