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
