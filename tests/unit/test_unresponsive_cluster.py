"""Two control-plane instances on one store, in process: the leader's
`unresponsive` mark reaches the other instance through the replica's row
(its routing, record, console and /metrics), and whichever instance hears
the replica serve again clears it everywhere. Each instance has its own
registry, clock and mirror of the store; the mirrors are read by hand (what
the change feed's follower does on every replica change)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from inferd.control.endpoints.views import ReplicaViews
from inferd.control.model import ReplicaFailure
from inferd.control.replicas import registry as registry_module
from inferd.control.replicas.registry import Registry, Replica, secret_digest
from inferd.control.replicas.registry_api import ReplicaCollector
from inferd.control.replicas.replica_mirror import ReplicaMirror
from inferd.control.stores.memory import MemoryStore
from inferd.server.console import ReplicaLines
from inferd.testing import replica_report
from inferd.vocab import ReplicaStatus as S
from tests.records import endpoint_row, replica_record

pytestmark = pytest.mark.anyio

SILENT_LIMIT_S = 3.0  # health period 1 s, 3 failure periods


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoCapacityNews:
    def capacity_reason(self, endpoint_id: str) -> str | None:
        return None

    def last_failure(self, endpoint_id: str) -> ReplicaFailure | None:
        return None

    def replacing(self, endpoint_id: str) -> str | None:
        return None


class Instance:
    def __init__(self, store: MemoryStore) -> None:
        self.clock = Clock()
        self.registry = Registry(
            clock=self.clock, health_period_s=1.0, failure_periods=3, rows=store
        )
        self.mirror = ReplicaMirror(store, self.registry)

    def report(self, rid: str, **extra: Any) -> None:
        body = {"status": "ready", "url": f"http://127.0.0.1/{rid}", **extra}
        self.registry.report(rid, f"s-{rid}", replica_report(rid, body))

    def routed(self) -> set[str]:
        return {r.replica_id for r in self.registry.ready_replicas("e1")}

    def record_marks(self) -> dict[str, str | None]:
        views = ReplicaViews(self.registry, NoCapacityNews())("e1").replicas
        return {v.replica_id or "": v.unresponsive_since for v in views}

    def console_marks(self) -> dict[str, str | None]:
        return {
            line.replica_id: line.unresponsive_since for line in ReplicaLines(self.registry)("e1")
        }

    def metric(self) -> float:
        (family,) = [
            f for f in ReplicaCollector(self.registry).collect() if f.name.endswith("unresponsive")
        ]
        (sample,) = family.samples
        return sample.value


async def cluster() -> tuple[MemoryStore, Instance, Instance]:
    """A leader that launched r1 and r2 (both ready, reporting to it) and a
    follower that mirrors them."""
    store = MemoryStore()
    row = endpoint_row(1, id="e1")
    await store.insert_endpoint(row, b"h" * 32)
    leader, follower = Instance(store), Instance(store)
    leader.registry.lead(1)
    leader.registry.start_judging()
    for n, rid in enumerate(("r1", "r2"), start=1):
        record = replica_record(n, "e1", id=rid, secret_hash=secret_digest(f"s-{rid}"))
        replica = Replica(rid, "e1", 1, "cpu", 1, secret_digest(f"s-{rid}"))
        await leader.registry.add_launched(replica, record)
        leader.report(rid)
    await leader.registry.flush()
    for instance in (leader, follower):
        await instance.mirror.reload()  # as each follows the feed from its start
    assert follower.routed() == {"r1", "r2"}
    return store, leader, follower


async def test_the_leaders_mark_routes_every_instance_around_the_replica() -> None:
    _, leader, follower = await cluster()
    leader.clock.now += SILENT_LIMIT_S + 0.5
    leader.report("r2")  # r1 went quiet
    leader.registry.check_liveness()
    assert leader.routed() == {"r2"}
    marked = leader.record_marks()["r1"]
    assert marked is not None
    await leader.registry.flush()
    await follower.mirror.reload()
    await leader.mirror.reload()  # its own write read back changes nothing
    for instance in (leader, follower):
        assert instance.routed() == {"r2"}
        assert instance.record_marks() == {"r1": marked, "r2": None}
        assert instance.console_marks() == {"r1": marked, "r2": None}
        assert instance.metric() == 1
    # Still ready, and still routed to when it is the only one left.
    r1 = follower.registry.get("r1")
    assert r1 is not None and r1.status is S.READY and r1.unresponsive


async def test_a_mark_written_in_the_same_millisecond_as_the_last_report_reaches_every_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows carry their write time to the millisecond: a mark written right
    after the replica's last report can carry the same `updated_at`, and
    must still be read as a new write (the content changed)."""
    frozen = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    monkeypatch.setattr(registry_module, "utc_now", lambda: frozen)
    _, leader, follower = await cluster()
    leader.clock.now += SILENT_LIMIT_S + 0.5
    leader.report("r2")
    leader.registry.check_liveness()
    await leader.registry.flush()
    for instance in (leader, follower):  # as each follows the feed
        await instance.mirror.reload()
    assert follower.routed() == {"r2"}
    assert follower.record_marks()["r1"] is not None
    # And cleared in the same millisecond too: heard again everywhere.
    follower.report("r1")
    await follower.registry.flush()
    await leader.mirror.reload()
    assert leader.routed() == {"r1", "r2"}


async def test_the_replica_heard_by_another_instance_is_back_everywhere() -> None:
    _, leader, follower = await cluster()
    leader.clock.now += SILENT_LIMIT_S + 0.5
    leader.report("r2")
    leader.registry.check_liveness()
    await leader.registry.flush()
    await follower.mirror.reload()
    assert follower.routed() == {"r2"}
    # r1 now reports to the follower (say the balancer sends it there).
    follower.report("r1")
    assert follower.routed() == {"r1", "r2"}
    await follower.registry.flush()  # a follower's write: no leader term
    await leader.mirror.reload()
    assert leader.routed() == {"r1", "r2"}
    assert leader.record_marks() == {"r1": None, "r2": None} and leader.metric() == 0
    # And the leader's sweep counts that as heard: not marked again at once.
    leader.clock.now += 1.0
    leader.report("r2")
    leader.registry.check_liveness()
    assert leader.routed() == {"r1", "r2"}


async def test_reports_from_a_stalled_loop_through_another_instance_are_not_heard() -> None:
    """A report sent from the replica's reporter thread while its serving
    loop is stalled says the process lives, not that it serves: the
    instance it reaches writes no heartbeat for it, so the leader still
    finds the replica silent."""
    _, leader, follower = await cluster()
    for _ in range(4):
        leader.clock.now += 1.0
        follower.clock.now += 1.0
        follower.report("r1", loopStalledS=10.0)
        leader.report("r2")
        await follower.registry.flush()
        await leader.mirror.reload()
        leader.registry.check_liveness()
    assert leader.routed() == {"r2"}
    await leader.registry.flush()
    await follower.mirror.reload()
    assert follower.routed() == {"r2"}  # the leader's mark, through the store


async def test_a_new_leader_counts_silence_only_from_when_it_began_to_judge() -> None:
    """The follower's copy of r1 was last heard long ago (r1 reported to
    the old leader, which writes no heartbeats). Leading now, it finds r1
    neither unresponsive nor overdue until it has itself not heard r1 for
    as long."""
    _, _, follower = await cluster()
    follower.clock.now += 10_000.0
    follower.registry.lead(2)
    follower.registry.start_judging()
    findings = follower.registry.check_liveness()
    assert findings.overdue == [] and follower.routed() == {"r1", "r2"}
    follower.clock.now += SILENT_LIMIT_S + 0.5
    follower.report("r2")
    assert follower.registry.check_liveness().overdue == []
    assert follower.routed() == {"r2"}  # its own observation: routed around
    follower.clock.now += 60.0  # the grace, observed by this leader
    assert [r.replica_id for r in follower.registry.check_liveness().overdue] == ["r1"]
