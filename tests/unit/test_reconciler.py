"""The reconciler against in-memory fakes of the launcher, the gateway's
traffic and the store, with an injected clock: ticks are called directly."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest

from inferd.control.launchers.base import Capacity, ExitedReplica, LaunchedReplica, ReplicaSpec
from inferd.control.model import Endpoint, ReplicaRecord
from inferd.control.reconciler import Reconciler, ReconcilerSettings
from inferd.control.registry import Registry
from inferd.gateway.traffic import TrafficSnapshot
from inferd.vocab import ReplicaStatus as S


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeLauncher:
    def __init__(self, slots: int = 8) -> None:
        self.slots = slots
        self.alive: dict[str, ReplicaSpec] = {}
        self.stopping: set[str] = set()
        self.exits: list[ExitedReplica] = []
        self.launched: list[ReplicaSpec] = []
        self.killed: list[str] = []
        self.pids = iter(range(100, 10_000))

    def capacity(self) -> Capacity:
        return Capacity({"cpu": self.slots - len(self.alive)}, {"cpu": self.slots})

    def cannot_place(self, gpu_type: str, gpu_count: int) -> str | None:
        return None if len(self.alive) < self.slots else "no free slot"

    def launch(self, spec: ReplicaSpec) -> LaunchedReplica:
        self.alive[spec.replica_id] = spec
        self.launched.append(spec)
        return LaunchedReplica(spec.replica_id, next(self.pids), ())

    def stop(self, replica_id: str, grace_s: float) -> None:
        self.stopping.add(replica_id)

    def kill(self, replica_id: str) -> None:
        self.killed.append(replica_id)
        self.exit(replica_id, -9)

    def exit(self, replica_id: str, code: int | None, log: str = "") -> None:
        if self.alive.pop(replica_id, None) is not None:
            self.exits.append(ExitedReplica(replica_id, code, log))

    def reap(self) -> list[ExitedReplica]:
        exits, self.exits = self.exits, []
        return exits

    def adopt(self, replica_id: str, pid: int, gpu_ids: tuple[int, ...]) -> bool:
        return replica_id in self.alive

    def running(self) -> list[str]:
        return list(self.alive)

    def shutdown(self, grace_s: float) -> None:
        self.alive.clear()


class FakeTraffic:
    def __init__(self) -> None:
        self.snapshots: dict[str, TrafficSnapshot] = {}
        self.aborted: list[str] = []

    def set(self, endpoint_id: str, **fields: Any) -> None:
        base = dict(
            endpoint_id=endpoint_id,
            in_flight=0,
            in_flight_by_replica=MappingProxyType({}),
            held=0,
            last_request_at=None,
            service_times=(),
            requests_total=0,
        )
        base.update(fields)
        self.snapshots[endpoint_id] = TrafficSnapshot(**base)  # type: ignore[arg-type]

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        if endpoint_id not in self.snapshots:
            self.set(endpoint_id)
        return self.snapshots[endpoint_id]

    def abort_replica(self, replica_id: str, reason: str = "") -> int:
        self.aborted.append(replica_id)
        return 0

    def forget_endpoint(self, endpoint_id: str) -> None:
        self.snapshots.pop(endpoint_id, None)


class MemoryRecords:
    """The replica half of a store; `yielding`: each call lets other tasks
    run first, as a database round trip does."""

    def __init__(self, yielding: bool = False) -> None:
        self.rows: dict[str, ReplicaRecord] = {}
        self.yielding = yielding

    async def _pause(self) -> None:
        if self.yielding:
            await asyncio.sleep(0)

    async def insert_replica(self, row: ReplicaRecord) -> None:
        await self._pause()
        self.rows[row.id] = row

    async def update_replica(self, replica_id: str, **fields: Any) -> None:
        await self._pause()
        fields["updated_at"] = fields.pop("at")
        self.rows[replica_id] = dataclasses.replace(self.rows[replica_id], **fields)

    async def delete_replica(self, replica_id: str) -> None:
        await self._pause()
        self.rows.pop(replica_id, None)

    async def list_replicas(self) -> list[ReplicaRecord]:
        return list(self.rows.values())


T0 = datetime(2025, 1, 1, tzinfo=UTC)


def endpoint(**changes: Any) -> Endpoint:
    row = Endpoint(
        id="e1", name="demo", model_name="tiny-chat", model_kind="chat", gpu_type="cpu",
        gpu_count=1, location_name="local", min_replicas=0, max_replicas=3,
        retention_seconds=60, hourly_price=0.0, currency="USD",
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    return dataclasses.replace(row, **changes)


class World:
    def __init__(self, row: Endpoint, slots: int = 8, yielding: bool = False) -> None:
        self.clock = Clock()
        self.rows = [row]
        self.launcher = FakeLauncher(slots)
        self.traffic = FakeTraffic()
        self.records = MemoryRecords(yielding)
        self.registry = Registry(clock=self.clock, health_period_s=1, failure_periods=3)
        self.reconciler = Reconciler(
            registry=self.registry,
            launcher=self.launcher,
            traffic=self.traffic,
            records=self.records,
            endpoints=lambda: self.rows,
            settings=ReconcilerSettings(
                target_concurrency=4, upscale_delay_s=2, downscale_delay_s=10
            ),
            clock=self.clock,
        )

    def tick(self, advance: float = 0.0, heartbeat: bool = True) -> None:
        """Advance the clock; replicas that reported before report again
        (their heartbeat), unless `heartbeat` is False."""
        self.clock.now += advance
        if heartbeat:
            for replica in self.registry.all():
                alive = replica.replica_id in self.launcher.alive
                if alive and replica.last_report_at is not None:
                    self.registry.report(
                        replica.replica_id,
                        self.launcher.alive[replica.replica_id].secret,
                        {"status": replica.status.value, "url": replica.url},
                    )
        asyncio.run(self.reconciler.tick())

    def live(self) -> list[str]:
        return [r.replica_id for r in self.registry.of_endpoint("e1") if r.live]

    def statuses(self) -> list[str]:
        return sorted(r.status.value for r in self.registry.of_endpoint("e1"))

    def report_all(self, status: str = "ready") -> None:
        for replica in self.registry.all():
            if replica.live and replica.status is not S.DRAINING:
                # The fake launcher holds the secret in the spec.
                secret = self.launcher.alive[replica.replica_id].secret
                self.registry.report(
                    replica.replica_id,
                    secret,
                    {"status": status, "url": f"http://127.0.0.1/{replica.replica_id}"},
                )


def test_scale_from_zero_on_a_held_request_then_to_zero_after_retention() -> None:
    w = World(endpoint(min_replicas=0, retention_seconds=30))
    w.tick()
    assert w.launcher.launched == []  # never called: stays at zero
    w.traffic.set("e1", held=1, last_request_at=0.0)
    w.tick()
    assert len(w.launcher.launched) == 1  # at once, no upscale delay
    assert w.records.rows[w.live()[0]].status == "starting"  # persisted at launch
    w.report_all("ready")
    w.traffic.set("e1", held=0, last_request_at=1.0)
    w.tick(1)
    assert w.records.rows[w.live()[0]].status == "ready"
    w.tick(29)
    assert w.launcher.stopping == set()  # within the retention period
    w.tick(2)
    (victim,) = w.launcher.stopping
    assert w.registry.get(victim).status is S.DRAINING  # type: ignore[union-attr]
    assert w.registry.ready_replicas("e1") == []  # out of routing before it stops
    w.launcher.exit(victim, 0)
    w.tick(1)
    assert w.live() == [] and w.records.rows == {}


def test_scale_up_with_load_after_the_delay_and_down_after_its_delay() -> None:
    w = World(endpoint(min_replicas=1))
    w.tick()
    w.report_all()
    w.traffic.set("e1", in_flight=12, last_request_at=0.0)
    w.tick(1)
    assert len(w.live()) == 1  # waiting for the upscale delay
    w.tick(2)
    assert len(w.live()) == 3
    w.report_all()
    w.traffic.set("e1", in_flight=1, last_request_at=3.0)
    w.tick(1)
    assert w.launcher.stopping == set()
    w.tick(10)
    assert len(w.launcher.stopping) == 2  # down to min 1


def test_scale_down_removes_replicas_still_loading_first() -> None:
    w = World(endpoint(min_replicas=2, max_replicas=3))
    w.tick()
    first, second = w.live()
    w.registry.report(first, w.launcher.alive[first].secret, {"status": "ready", "url": "u"})
    w.rows = [endpoint(min_replicas=1, max_replicas=1)]
    w.tick()
    assert w.launcher.stopping == {second}


def test_a_crashing_replica_is_replaced_with_backoff_and_shows_failed() -> None:
    w = World(endpoint(min_replicas=1))
    w.tick()
    (first,) = w.live()
    w.launcher.exit(first, 1, "Traceback...\nRuntimeError: CUDA out of memory")
    w.tick()
    replica = w.registry.get(first)
    assert replica is not None and replica.status is S.FAILED
    assert "CUDA out of memory" in (replica.reason or "")
    assert len(w.launcher.launched) == 1  # backoff: not at once
    w.tick(1.1)
    assert len(w.launcher.launched) == 2
    (second,) = w.live()
    w.launcher.exit(second, 1)
    w.tick()
    w.tick(1.1)
    assert len(w.launcher.launched) == 2  # second failure: 2 s backoff
    w.tick(1)
    assert len(w.launcher.launched) == 3
    w.report_all()
    w.tick()
    assert w.statuses() == ["ready"]  # failures pruned once one is ready


def test_a_silent_replica_is_failed_killed_and_its_requests_aborted() -> None:
    w = World(endpoint(min_replicas=1))
    w.tick()
    w.report_all()
    (rid,) = w.live()
    w.tick(3.5, heartbeat=False)
    assert w.launcher.killed == [rid]
    assert rid in w.traffic.aborted
    w.tick(1.1)
    assert len(w.launcher.launched) == 2


def test_no_capacity_is_reported_not_retried_blindly() -> None:
    w = World(endpoint(min_replicas=2), slots=1)
    w.tick()
    assert len(w.launcher.launched) == 1
    assert w.reconciler.capacity_reason("e1") == "no free slot"


def test_gpu_change_rolls_replicas_over() -> None:
    w = World(endpoint(min_replicas=1))
    w.tick()
    w.report_all()
    (old,) = w.live()
    w.rows = [endpoint(min_replicas=1, generation=2)]
    w.tick()
    new = [r for r in w.live() if r != old]
    assert len(new) == 1 and w.launcher.stopping == set()  # old serves until new is ready
    w.registry.report(new[0], w.launcher.alive[new[0]].secret, {"status": "ready", "url": "u"})
    w.tick()
    assert w.launcher.stopping == {old}


def test_delete_drains_everything_and_waits_for_the_processes() -> None:
    w = World(endpoint(min_replicas=2))
    w.tick()
    w.report_all()
    ids = w.live()

    async def delete() -> None:
        drain = asyncio.ensure_future(w.reconciler.drain_endpoint(w.rows[0], timeout_s=5))
        await asyncio.sleep(0.1)
        assert not drain.done()
        assert w.launcher.stopping == set(ids)
        for rid in ids:
            w.launcher.exit(rid, 0)
        await asyncio.wait_for(drain, 2)

    asyncio.run(delete())
    assert w.registry.of_endpoint("e1") == [] and w.records.rows == {}


def test_delete_while_the_loop_ticks_forgets_each_replica_once() -> None:
    """DELETE's drain and the reconcile loop both write the store; with
    store calls that yield (as worker threads do), they must take turns."""

    w = World(endpoint(min_replicas=1), yielding=True)
    w.tick()
    w.report_all()
    w.tick()
    (rid,) = w.live()
    w.rows[0] = dataclasses.replace(w.rows[0], deleting_at=T0)

    async def delete_while_ticking() -> None:
        w.launcher.exit(rid, 0)  # its process ended just now
        ticks = [w.reconciler.tick() for _ in range(3)]
        await asyncio.gather(w.reconciler.drain_endpoint(w.rows[0], timeout_s=5), *ticks)

    asyncio.run(delete_while_ticking())
    assert w.registry.of_endpoint("e1") == [] and w.records.rows == {}


def test_adopt_after_restart_keeps_replicas_and_counts_them_as_wanted() -> None:
    w = World(endpoint(min_replicas=0))
    w.traffic.set("e1", held=1, last_request_at=0.0)
    w.tick()
    w.report_all()
    w.tick()
    rows = list(w.records.rows.values())
    # A new control plane: fresh registry and reconciler, same launcher state.
    fresh = World(endpoint(min_replicas=0))
    fresh.launcher = w.launcher
    fresh.reconciler.launcher = w.launcher
    fresh.reconciler.records = w.records
    adopted = fresh.reconciler.adopt(rows, fresh.rows)
    assert adopted == [rows[0].id]
    fresh.tick()
    assert fresh.launcher.stopping == set()  # not scaled away on the first tick
    assert fresh.registry.ready_replicas("e1")  # routable at once (url was stored)


@pytest.mark.parametrize("status", ["stopped", "failed"])
def test_adopt_skips_finished_replicas(status: str) -> None:
    w = World(endpoint())
    row = ReplicaRecord(
        "r-x", "e1", 1, "cpu", 1, b"d", status, T0, T0, placement={"pid": "5", "gpu_ids": ""}
    )
    assert w.reconciler.adopt([row], w.rows) == []
