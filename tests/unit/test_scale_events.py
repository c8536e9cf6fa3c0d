"""The reconciler records each change of desired replicas with its cause,
over a fake launcher and an injected clock (no sleeps)."""

from __future__ import annotations

import pytest

from inferd.control.replicas.scale_events import ScaleCause
from tests.unit.test_reconciler import World, endpoint

pytestmark = pytest.mark.anyio


def causes(w: World) -> list[tuple[ScaleCause, int, int]]:
    return [
        (e.cause, e.from_replicas, e.to_replicas) for e in w.reconciler.journal.of_endpoint("e1")
    ]


async def test_load_idle_manual_and_failure_each_leave_an_event() -> None:
    w = await World(endpoint(min_replicas=0, retention_seconds=30)).open()
    await w.tick()
    assert causes(w) == []  # nothing wanted, nothing recorded
    w.traffic.set("e1", held=1, last_request_at=0.0)
    await w.tick()
    w.report_all("ready")
    w.traffic.set("e1", held=0, last_request_at=1.0)
    await w.tick(1)
    await w.tick(29)
    await w.tick(2)  # idle past the retention period
    (victim,) = w.launcher.stopping
    w.launcher.exit(victim, 0)
    await w.tick(1)
    w.rows = [endpoint(min_replicas=1, retention_seconds=30)]  # a settings change
    await w.tick(1)
    (replica,) = w.live()
    w.launcher.exit(replica, 1, "RuntimeError: CUDA out of memory")
    await w.tick()
    assert causes(w) == [
        (ScaleCause.LOAD, 0, 1),
        (ScaleCause.IDLE, 1, 0),
        (ScaleCause.MANUAL, 0, 1),
        (ScaleCause.FAILURE, 1, 1),
    ]
    failure = w.reconciler.journal.of_endpoint("e1")[-1]
    assert "CUDA out of memory" in failure.reason
    w.rows = []  # deleted: its story goes with it
    await w.tick()
    assert causes(w) == []


def test_migrations_of_one_lost_replica_are_one_line_with_a_count() -> None:
    from inferd.control.replicas.scale_events import ScaleJournal

    journal = ScaleJournal(wall=lambda: "2026-01-01T00:00:00.000Z")
    lost_a = "a stream's replica r1 was lost (connection_lost); continued on another"
    lost_b = "a stream's replica r2 was lost (engine_failed); continued on another"
    for text in (lost_a, lost_a, lost_a, lost_b):
        journal.record_migration("e1", text)
    journal.record("e1", 1, 2, "2 requests held")
    journal.record_migration("e1", lost_b)
    events = journal.of_endpoint("e1")
    assert [(e.cause, e.to_replicas, e.reason) for e in events] == [
        (ScaleCause.MIGRATION, 3, lost_a),
        (ScaleCause.MIGRATION, 1, lost_b),
        (ScaleCause.LOAD, 2, "2 requests held"),
        (ScaleCause.MIGRATION, 1, lost_b),
    ]
