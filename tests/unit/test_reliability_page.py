"""docs/reliability.md is written only by a complete run that passed, names
the commit it was made from, and its counts are those of its own table."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.reliability.report import Collector, Row, current_commit, markdown

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"


def test_the_committed_page_comes_from_a_commit_of_this_history() -> None:
    text = PAGE.read_text()
    found = re.search(r"^- Commit: ([0-9a-f]{40})$", text, re.MULTILINE)
    assert found, "docs/reliability.md names no clean commit (a run on a changed tree?)"
    ancestor = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", found[1], "HEAD"],
        capture_output=True,
        check=False,
    )
    assert ancestor.returncode == 0, f"{found[1]} is not an ancestor of HEAD"


def test_the_committed_pages_counts_are_those_of_its_table() -> None:
    text = PAGE.read_text()
    summary = re.search(
        r"^- Result: (\d+) of (\d+) tests passed \(pytest exit status (\d+)\)", text, re.M
    )
    assert summary, "no result line"
    passed, total, status = (int(g) for g in summary.groups())
    results = re.findall(r"^\| \d+ \| `[^`]+` \| .* \| ([^|]+) \| [\d.]+ \|$", text, re.MULTILINE)
    assert status == 0
    assert total == len(results) > 0
    # A node id run several times (generated cases) reads "N passed".
    assert passed == total == sum(bool(re.fullmatch(r"(\d+ )?passed", r.strip())) for r in results)


def collector(outcomes: dict[str, list[str]], exit_status: int = 0) -> Collector:
    c = Collector()
    for n, (test, outs) in enumerate(outcomes.items()):
        c.rows[test] = Row(item=1, test=test, checks="", order=n, outcomes=outs)
    c.exit_status = exit_status
    return c


def test_only_a_whole_passing_run_may_write_the_page() -> None:
    ok = collector({"a": ["passed"], "b": ["passed"]})
    assert ok.why_not_written(whole_suite=True) is None
    assert "only part" in (ok.why_not_written(whole_suite=False) or "")
    failed = collector({"a": ["passed"], "b": ["failed"]}, exit_status=1)
    assert "exit status 1" in (failed.why_not_written(whole_suite=True) or "")
    stopped = collector({"a": ["passed"], "b": []})  # -x, or interrupted
    assert "did not run" in (stopped.why_not_written(whole_suite=True) or "")
    narrowed = collector({"a": ["passed"]})
    marked: Any = SimpleNamespace(
        get_closest_marker=lambda name: SimpleNamespace(kwargs={"item": 3}, args=())
    )
    unmarked: Any = SimpleNamespace(get_closest_marker=lambda name: None)
    narrowed.pytest_deselected([marked, unmarked])
    assert narrowed.why_not_written(whole_suite=True) == "1 marked tests were deselected"
    assert "no marked test" in (collector({}).why_not_written(whole_suite=True) or "")


def test_the_page_states_its_commit_and_counts() -> None:
    rows = [Row(1, "t::a", "checks a", 0, ["passed"]), Row(2, "t::b", "checks b", 1, ["passed"])]
    text = markdown(rows, "python -m pytest tests", 0, 12.0, "f" * 40)
    assert f"- Commit: {'f' * 40}" in text
    assert "- Result: 2 of 2 tests passed (pytest exit status 0), 12 s in all" in text


def test_a_changed_tree_is_named_as_such(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "one")
    assert re.fullmatch(r"[0-9a-f]{40}", current_commit(tmp_path))
    (tmp_path / "tests" / "t.py").write_text("x = 2\n")
    assert current_commit(tmp_path).endswith(" + uncommitted changes")
