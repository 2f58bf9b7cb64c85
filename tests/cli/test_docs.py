"""The documentation: the site builds with `mkdocs build --strict` (a broken link or anchor, or a page left out of
the navigation, fails it); its CLI reference, generated from the parser, lists exactly the flags each command's
`--help` lists, with the help texts and defaults of the dataclasses; and the README stays a short front page
whose links resolve, down to their anchors."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import markdown
import pytest

from tunesmith import cli
from tunesmith.cli_reference import (
    MARKER,
    all_spellings,
    default_text,
    inline_markdown,
    invocations,
    reference_flags,
    reference_markdown,
)
from tunesmith.hparams import RUN_ARGUMENTS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 250
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as `mkdocs build --strict` builds it, into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "NO_MKDOCS_2_WARNING": "1"})  # no banner
    assert proc.returncode == 0, f"mkdocs build --strict failed (bash scripts/setup.sh installs mkdocs):\n{proc.stderr[-6000:]}"
    return out


@pytest.fixture(scope="module")
def reference() -> str:
    return reference_markdown()


def built_page(site: Path, source: str) -> str:
    """The HTML of docs/<source> (foo.md -> foo/index.html, index.md -> index.html)."""
    stem = source.removesuffix(".md")
    return (site / ("index.html" if stem == "index" else f"{stem}/index.html")).read_text(encoding="utf-8")


def test_the_site_builds_strict_with_the_generated_cli_reference(site):
    page = built_page(site, "cli.md")
    assert MARKER not in page
    for invocation in invocations():
        assert f'id="{invocation.anchor}"' in page, f"no section for `{invocation.title}`"
    assert "<code>--lora_r</code>" in page and "<code>--learning_rate</code>" in page
    assert (site / "ui_train.png").is_file() and "ui_train.png" in built_page(site, "ui.md")


def help_flags(text: str) -> set[str]:
    """The option strings of argparse's --help: an option line opens with two spaces and a dash, and its
    invocation (what comes before the help text) lists every spelling with metavars between."""
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("  -"):
            invocation = re.split(r"\s{2,}", line.strip())[0]
            flags |= set(re.findall(r"(?:^|, )(--?[\w-]+)", invocation))
    return flags


@pytest.mark.parametrize("invocation", invocations(), ids=lambda i: i.anchor)
def test_the_reference_lists_exactly_the_flags_of_the_commands_help(invocation, capsys, monkeypatch):
    """Through the real command, as a user asks for its help: so a recipe that parses another kind of run than
    the reference assumes, or a flag added outside the dataclasses, shows up here."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main sets it for the recipe
    with pytest.raises(SystemExit) as stop:
        cli.main([invocation.command, *invocation.selector, "--help"])
    assert stop.value.code == 0
    shown = help_flags(capsys.readouterr().out)
    flags = list(reference_flags(invocation))
    documented = set().union(*(all_spellings(f.names) for f in flags if not f.hidden))
    assert len(shown) > 5
    assert not shown - documented, f"`{invocation.title} --help` lists flags the reference lacks"
    assert not documented - shown, f"the reference lists flags `{invocation.title} --help` lacks"


def test_every_command_and_every_kind_of_run_is_documented():
    assert {i.command for i in invocations()} == set(cli.COMMANDS)
    assert sorted(i.kind for i in invocations()) == sorted(RUN_ARGUMENTS)


@pytest.mark.parametrize("invocation", invocations(), ids=lambda i: i.anchor)
def test_each_flag_carries_its_fields_help_text_and_default(invocation, reference):
    by_name = {name: flag for flag in reference_flags(invocation) for name in flag.names}
    checked = 0
    for dtype in RUN_ARGUMENTS[invocation.kind]:
        for field in dataclasses.fields(dtype):
            help_text = field.metadata.get("help")
            if not field.init or not help_text or field.name == "debug":  # --debug is the boundary's own
                continue
            flag = by_name[f"--{field.name}"]
            assert flag.help == " ".join(help_text.replace("%%", "%").split()), field.name
            default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
            assert default_text(flag.default) == default_text(default), field.name
            assert inline_markdown(flag.help) in reference
            checked += 1
    assert checked >= 5


def test_a_help_text_shows_as_itself_in_a_table_cell():
    text = "a|b for <file> & *each* [x](y) {#id} `--a|b` 50% of __init__ \\n"
    rendered = markdown.markdown(f"| h |\n|---|\n| {inline_markdown(text)} |", extensions=["tables", "attr_list"])
    cells = re.findall(r"<td>(.*?)</td>", rendered)
    assert [html.unescape(re.sub(r"</?code>", "`", cell)) for cell in cells] == [text]  # code spans kept as code


def test_the_readme_is_a_short_front_page_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == [
        "bash scripts/quickstart.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    linked = {link.split("#")[0] for link in MARKDOWN_LINK.findall(text)}
    assert {"docs/index.md", "docs/getting-started.md", "docs/cli.md"} <= linked


def test_the_readmes_links_resolve_down_to_their_anchors_in_the_built_site(site):
    broken = []
    for link in MARKDOWN_LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        if not (ROOT / path).exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.startswith("docs/") and f'id="{anchor}"' not in built_page(site, path[len("docs/"):]):
            broken.append(f"{link}: no such heading on the page")
    assert not broken, broken
