"""benchmarks/: a package, each benchmark run from the repository root as `python -m benchmarks.NAME`. Every module
imports as `benchmarks.NAME` with no path set up by the test (pyproject.toml's pytest pythonpath puts the root on
sys.path), none edits sys.path itself, and each one's docstring shows the command that runs it."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import benchmarks

PACKAGE = Path(benchmarks.__file__).parent
MODULES = sorted(module.name for module in pkgutil.iter_modules([str(PACKAGE)]))
BENCHMARKS = [name for name in MODULES if name != "common"]


def test_the_package_holds_the_benchmarks_and_their_driver():
    assert {"common", "sft", "dpo", "rl", "context", "attention", "serve", "moe", "row_bound"} <= set(MODULES)
    listed = set(re.findall(r"^    (\w+(?:, \w+)*)  ", benchmarks.__doc__, flags=re.M))
    assert {name for line in listed for name in line.split(", ")} == set(MODULES)  # the package's docstring lists each


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_imports_and_its_docstring_opens_with_its_command(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert f"python -m benchmarks.{name} " in module.__doc__.split("\n\n")[1], module.__doc__[:400]
    assert callable(module.main)


def test_no_benchmark_edits_sys_path():
    edits = [f"benchmarks/{path.name}:{node.lineno}" for path in sorted(PACKAGE.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys"]
    assert not edits
