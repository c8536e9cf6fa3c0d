"""The suite cannot skip silently: the one way a test may be skipped is
`require()` in tests/support.py (a failure when `CI` is set). Any other
skip, skipif, importorskip or xfail anywhere under tests/ fails this test,
naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
THE_GATE = TESTS / "support.py"
# pytest's and unittest's ways to not run a test, or to run it without
# failing: `pytest.skip(...)`, `pytest.mark.skipif`, `unittest.skipUnless`...
SKIPPING = frozenset(
    {"skip", "skipif", "importorskip", "xfail", "skipIf", "skipUnless", "expectedFailure"}
)
FRAMEWORKS = frozenset({"pytest", "unittest", "_pytest"})


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def silent_skips(source: str) -> list[tuple[int, str]]:
    """(line, what) for every skip outside the gate in one module's source."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in SKIPPING:
            if _root_name(node) in FRAMEWORKS:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FRAMEWORKS:
            found += [(node.lineno, f"from {node.module} import {a.name}")
                      for a in node.names if a.name in SKIPPING]  # fmt: skip
        elif isinstance(node, ast.Constant) and node.value in ("skip", "skipif", "xfail"):
            # `getattr(pytest.mark, "skip")`, `request.node.add_marker("xfail")`
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_skip_or_xfail_outside_the_gate() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}: {what}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != THE_GATE and path != Path(__file__).resolve()
        for line, what in silent_skips(path.read_text())
    ]
    assert found == [], "skip through require()/needs() in tests/support.py only:\n" + "\n".join(
        found
    )


def test_the_scan_finds_every_form() -> None:
    """The scan itself, on each form it must catch (so that a change to it
    cannot quietly stop catching one)."""
    forms = [
        "import pytest\npytest.skip('x')",
        "import pytest\nvllm = pytest.importorskip('vllm')",
        "import pytest\n@pytest.mark.skipif(True, reason='x')\ndef test(): pass",
        "import pytest\n@pytest.mark.xfail\ndef test(): pass",
        "import pytest\npytestmark = pytest.mark.skip",
        "import pytest\ndef test(): pytest.xfail('x')",
        "import unittest\n@unittest.skipUnless(False, 'x')\ndef test(): pass",
        "from pytest import importorskip",
        "import pytest\nmark = getattr(pytest.mark, 'skip')",
    ]
    assert [bool(silent_skips(form)) for form in forms] == [True] * len(forms)
    assert silent_skips("import pytest\n@pytest.mark.slow\ndef test_skipping(): pass") == []
