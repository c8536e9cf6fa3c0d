"""The reporter runs on a thread of its own: a serving loop that is blocked
does not stop the reports (they say how long it has been stalled), and the
injected faults drop heartbeats but never status changes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from inferd.replica.reporter import ReportFaults, StatusReporter
from inferd.testing import replica_report
from tests.support import FakeRegistry


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def block_serving_loop(seconds: float) -> None:
    """Hold the calling thread (the serving loop's) without yielding to its loop."""
    threading.Event().wait(seconds)


def test_reports_go_out_while_the_serving_loop_is_blocked() -> None:
    registry = FakeRegistry()
    status = {"value": "ready"}
    released = threading.Event()

    async def scenario() -> None:
        reporter = StatusReporter(
            registry.url,
            "r1",
            "s3cret",
            lambda: replica_report("r1", {"status": status["value"]}),
            on_orphaned=lambda: None,
            interval=0.1,
        )
        reporter.start()
        await asyncio.to_thread(wait_for, lambda: len(registry.reports) >= 2)
        before = len(registry.reports)
        # The serving loop blocks (an engine holding it, say): no await at all.
        block_serving_loop(2.5)
        during = registry.reports[before:]
        # Heartbeats went out meanwhile, each saying the loop is stalled.
        stalled = [r["loopStalledS"] for r in during if r.get("loopStalledS") is not None]
        assert stalled, during
        assert max(stalled) >= 1.0
        # Free again: the next heartbeats carry a fresh snapshot, not stalled.
        status["value"] = "draining"
        await asyncio.to_thread(
            wait_for,
            lambda: any(
                r["status"] == "draining" and r.get("loopStalledS") is None
                for r in registry.reports
            ),
        )
        released.set()
        await reporter.close()

    try:
        asyncio.run(scenario())
        assert released.is_set()
        seqs = [r["seq"] for r in registry.reports]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    finally:
        registry.stop()


def test_dropped_heartbeats_never_drop_a_status_change() -> None:
    registry = FakeRegistry()
    status = {"value": "loading"}

    async def scenario() -> None:
        reporter = StatusReporter(
            registry.url,
            "r1",
            None,
            lambda: replica_report("r1", {"status": status["value"]}),
            on_orphaned=lambda: None,
            interval=0.05,
            faults=ReportFaults(drop=1.0),
        )
        reporter.start()
        await asyncio.sleep(0.5)  # heartbeats: all dropped
        status["value"] = "ready"
        reporter.notify()
        await asyncio.to_thread(wait_for, lambda: registry.statuses() == ["loading", "ready"])
        count = len(registry.reports)
        await asyncio.sleep(0.5)
        assert len(registry.reports) == count  # still no heartbeat
        await reporter.close()

    try:
        asyncio.run(scenario())
        assert registry.statuses() == ["loading", "ready"]
    finally:
        registry.stop()
