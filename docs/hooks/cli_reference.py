"""MkDocs hook (mkdocs.yml `hooks:`): fills docs/cli.md's marker with the CLI reference that
tunesmith/cli_reference.py generates from the parser, each time the site is built."""

from __future__ import annotations

from typing import Any

from mkdocs.exceptions import PluginError

from tunesmith.cli_reference import MARKER, reference_markdown

PAGE = "cli.md"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:  # a page published without its reference would look complete and say nothing
        raise PluginError(f"docs/{PAGE} has lost its marker {MARKER}, where the generated CLI reference goes")
    return markdown.replace(MARKER, reference_markdown())
