"""The reliability report: for each test carrying
`@pytest.mark.reliability(item=N)`, the item number, the test, what it checks
(its docstring's first paragraph), the result and the seconds it took
(setup + call + teardown; a session fixture, such as the shared vLLM replica,
counts in the first test that uses it), as a table and as docs/reliability.md.

`Collector` is a pytest plugin. The test command (`make test`) registers it
through `--reliability-report` (tests/conftest.py), so the page is written by
the suite's own run; `scripts/reliability_report.py` runs only the marked tests.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest


@dataclass
class Row:
    item: int
    test: str  # node id below the tests directory
    checks: str
    order: int  # execution order, to keep ties stable
    outcomes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def result(self) -> str:
        """One word for one run; counts when a node id ran several times
        (generated cases, such as schemathesis examples, share theirs)."""
        if len(self.outcomes) == 1:
            return self.outcomes[0]
        counts = {o: self.outcomes.count(o) for o in dict.fromkeys(self.outcomes)}
        return ", ".join(f"{n} {o}" for o, n in counts.items())

    @property
    def ok(self) -> bool:
        return all(o in ("passed", "xfailed") for o in self.outcomes)


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    paragraph = doc.strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def _without_group(nodeid: str) -> str:
    """The node id as collected: pytest-xdist's `loadgroup` adds `@group`."""
    return nodeid.rsplit("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid


def _item_number(item: pytest.Item) -> int | None:
    marker = item.get_closest_marker("reliability")
    if marker is None:
        return None
    number = marker.kwargs.get("item", marker.args[0] if marker.args else None)
    return int(number) if number is not None else None


class Collector:
    """The pytest plugin: one `Row` per node id of a marked test.

    Under pytest-xdist (`make test` runs two workers) each worker collects
    the marks and runs part of the tests; the controller sees every result
    but collects nothing. So results are kept by node id wherever they
    arrive, and each worker hands its rows to the controller when it ends
    (`workeroutput`), where they are joined."""

    def __init__(self) -> None:
        self.config: pytest.Config | None = None
        self.rows: dict[str, Row] = {}
        self._results: dict[str, Row] = {}  # node id -> outcomes and seconds
        self._current: dict[str, str] = {}  # node id -> outcome of the test so far
        self._started = time.monotonic()
        self.wall_s = 0.0
        self.exit_status = 0
        # Marked tests that a -k, -m or --deselect left out: the page would
        # then describe part of the list as if it were all of it.
        self.deselected_marked = 0

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for order, item in enumerate(items):
            number = _item_number(item)
            nodeid = _without_group(item.nodeid)
            if number is None or nodeid in self.rows:
                continue
            doc = getattr(getattr(item, "obj", None), "__doc__", None)
            self.rows[nodeid] = Row(
                item=number,
                test=re.sub(r"^tests/", "", nodeid),
                checks=_first_paragraph(doc),
                order=order,
            )

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.deselected_marked += sum(_item_number(item) is not None for item in items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = _without_group(report.nodeid)
        result = self._results.setdefault(nodeid, Row(0, nodeid, "", 0))
        result.seconds += report.duration
        outcome = self._current.get(nodeid, "passed")
        if report.when == "setup":
            outcome = "passed"
        if report.failed:
            outcome = "error" if report.when != "call" else "failed"
        elif report.skipped and report.when in ("setup", "call"):
            outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        self._current[nodeid] = outcome
        if report.when == "teardown":
            result.outcomes.append(self._current.pop(nodeid))

    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.wall_s = time.monotonic() - self._started
        self.exit_status = int(exitstatus)
        if self.is_worker:
            output = self.config.workeroutput  # type: ignore[union-attr]
            output["reliability_rows"] = [
                (nodeid, row.item, row.test, row.checks, row.order)
                for nodeid, row in self.rows.items()
            ]
            output["reliability_deselected"] = self.deselected_marked

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        """A worker ended: its rows join the controller's."""
        output = getattr(node, "workeroutput", {})
        for nodeid, item, test, checks, order in output.get("reliability_rows", []):
            self.rows.setdefault(nodeid, Row(item=item, test=test, checks=checks, order=order))
        # Every worker collects (and deselects) the whole suite alike.
        self.deselected_marked = max(
            self.deselected_marked, output.get("reliability_deselected", 0)
        )

    def _joined(self) -> list[Row]:
        joined = []
        for nodeid, row in self.rows.items():
            result = self._results.get(nodeid)
            if result is not None:
                row.outcomes, row.seconds = result.outcomes, result.seconds
            joined.append(row)
        return joined

    def ordered(self) -> list[Row]:
        ran = [row for row in self._joined() if row.outcomes]
        return sorted(ran, key=lambda r: (r.item, r.order))

    def why_not_written(self, whole_suite: bool) -> str | None:
        """None when this run may write the page: it passed, and every marked
        test of the suite ran. Otherwise the reason, said instead of writing."""
        if self.exit_status != 0:
            return f"the run failed (pytest exit status {self.exit_status})"
        if not whole_suite:
            return "the run collected only part of tests/ (a path or node id was given)"
        if self.deselected_marked:
            return f"{self.deselected_marked} marked tests were deselected"
        not_run = [row.test for row in self._joined() if not row.outcomes]
        if not_run:
            return f"{len(not_run)} marked tests did not run (first: {not_run[0]})"
        if not self.rows:
            return "no marked test was collected"
        return None


def current_commit(repo: str | os.PathLike[str] = ".") -> str:
    """HEAD's hash, with '+ uncommitted changes' when the tree differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "inferd", "tests")
    return f"{head} + uncommitted changes" if dirty else head


def text_table(rows: Sequence[Row]) -> str:
    header = ("item", "test", "what it checks", "result", "seconds")
    lines = [
        (str(r.item), r.test.split("::", 1)[-1], _clip(r.checks, 90), r.result, f"{r.seconds:.1f}")
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    return "\n".join(out)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(rows: Sequence[Row], command: str, exit_code: int, wall_s: float, commit: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    passed = sum(r.ok for r in rows)
    lines = [
        "# Reliability",
        "",
        "The list of faults, overload, bad input and security checks, each a test",
        "marked `@pytest.mark.reliability(item=N)`. This page is written by",
        "the test command (`make test`, through `--reliability-report`) from the",
        "suite's own run, or by `scripts/reliability_report.py` for the marked tests alone,",
        "and only by a run in which every marked test ran and the run passed.",
        "",
        f"- Date: {now}",
        f"- Commit: {commit}",
        f"- Command: `{command}`",
        f"- Machine: {os.cpu_count()} CPU cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        f"- Result: {passed} of {len(rows)} tests passed (pytest exit status {exit_code}), "
        f"{wall_s:.0f} s in all",
        "",
        "| item | test | what it checks | result | seconds |",
        "|---:|---|---|---|---:|",
    ]
    lines += [
        f"| {r.item} | `{_cell(r.test)}` | {_cell(r.checks)} | {r.result} | {r.seconds:.1f} |"
        for r in rows
    ]
    lines += [
        "",
        "Seconds are setup + call + teardown of each test; the shared real-engine",
        "replicas (vLLM, diffusers) are started once per run and counted in the",
        "first test that uses them.",
        "",
    ]
    return "\n".join(lines)
