"""The suite's own shape: what would stop `make test` at collection.

Test directories are not packages (pytest imports each test module by its
basename), so two test files of one name in different directories make the
whole run stop with "import file mismatch" - which a run of one directory
never shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique_across_directories() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
