"""Where things are: the repository, and the tests' own data (tests/data, tests/go)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_DATA = ROOT / "tests" / "data"
GO = ROOT / "tests" / "go"
