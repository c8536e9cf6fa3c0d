"""The reconciler against the shipped fakes (`inferd.control.fakes`) and the
in-memory store, with an injected clock: ticks are called directly, replica
ends are fed from the fake launcher's `exits()`, and nothing sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from inferd.control.cluster.ports import Deposed
from inferd.control.fakes import FakeLauncher, FakeLoad
from inferd.control.model import Endpoint, ReplicaRecord
from inferd.control.ports import ExitReason, ReplicaExit
from inferd.control.replicas.reconciler import Reconciler, ReconcilerSettings
from inferd.control.replicas.registry import Registry, Replica
from inferd.control.stores.memory import MemoryStore
from inferd.replica.config import ModelSource
from inferd.testing import replica_report
from inferd.vocab import ModelKind
from inferd.vocab import ReplicaStatus as S
from tests.support import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.anyio


DEAD_AFTER_S = 10.0


class FakeProbe:
    """A health probe whose answers the test sets: the replicas in
    `answering` answer, the others do not; every probe is counted."""

    def __init__(self) -> None:
        self.answering: set[str] = set()
        self.probed: list[str] = []

    async def __call__(self, replica: Replica) -> bool:
        self.probed.append(replica.replica_id)
        return replica.replica_id in self.answering


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def endpoint(**changes: Any) -> Endpoint:
    row = Endpoint(
        id="e1", name="demo", model_name="tiny-chat", model_kind="chat", gpu_type="cpu",
        gpu_count=1, location_name="local", min_replicas=0, max_replicas=3,
        retention_seconds=60, hourly_price=0.0, currency="USD",
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    return dataclasses.replace(row, **changes)


def model_of(name: str) -> ModelSource:
    return ModelSource(name, ModelKind.CHAT, f"builtin:{name}")


class World:
    def __init__(self, row: Endpoint, slots: int = 8) -> None:
        self.clock = Clock()
        self.rows = [row]
        self.launcher = FakeLauncher(slots)
        self.traffic = FakeLoad()
        self.records = MemoryStore()
        self.probe = FakeProbe()
        self.registry = self.new_registry()
        self.reconciler = self.new_reconciler()

    def new_registry(self) -> Registry:
        """Writes the replica rows to `records`. Unresponsive after 3 s of
        silence, taken for dead after DEAD_AFTER_S."""
        return Registry(
            clock=self.clock,
            health_period_s=1,
            failure_periods=3,
            dead_after_s=DEAD_AFTER_S,
            rows=self.records,
        )

    def new_reconciler(self) -> Reconciler:
        return Reconciler(
            registry=self.registry,
            launcher=self.launcher,
            load=self.traffic,
            aborter=self.traffic,
            endpoints=self.endpoints,
            models=model_of,
            settings=ReconcilerSettings(
                target_concurrency=4, upscale_delay_s=2, downscale_delay_s=10
            ),
            clock=self.clock,
            probe=self.probe,
        )

    async def endpoints(self) -> list[Endpoint]:
        return self.rows

    async def open(self) -> World:
        await self.records.insert_endpoint(self.rows[0], b"h" * 32)
        return self

    async def stored(self) -> dict[str, ReplicaRecord]:
        return {r.id: r for r in await self.records.list_replicas()}

    async def settle(self) -> None:
        """Hand the launcher's pending exits to the reconciler, as its
        `exits()` follower would."""
        queue = self.launcher._exits_queue()
        while not queue.empty():
            exited = queue.get_nowait()
            assert exited is not None
            await self.reconciler.replica_exited(exited)

    async def tick(
        self, advance: float = 0.0, heartbeat: bool = True, silent: frozenset[str] = frozenset()
    ) -> None:
        """Advance the clock; replicas that reported before report again
        (their heartbeat), unless `heartbeat` is False or they are `silent`;
        the health probes the pass starts are answered before it returns."""
        self.clock.now += advance
        await self.settle()
        if heartbeat:
            for replica in self.registry.all():
                alive = replica.replica_id in self.launcher.alive
                if replica.replica_id in silent:
                    continue
                if alive and replica.last_report_at is not None:
                    self.registry.report(
                        replica.replica_id,
                        self.launcher.alive[replica.replica_id].secret,
                        replica_report(
                            replica.replica_id, {"status": replica.status.value, "url": replica.url}
                        ),
                    )
        await self.reconciler.tick()
        await self.reconciler.prober.settle()

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
                    replica_report(
                        replica.replica_id,
                        {"status": status, "url": f"http://127.0.0.1/{replica.replica_id}"},
                    ),
                )


async def test_scale_from_zero_on_a_held_request_then_to_zero_after_retention() -> None:
    w = await World(endpoint(min_replicas=0, retention_seconds=30)).open()
    await w.tick()
    assert w.launcher.launched == []  # never called: stays at zero
    w.traffic.set("e1", held=1, last_request_at=0.0)
    await w.tick()
    assert len(w.launcher.launched) == 1  # at once, no upscale delay
    assert (await w.stored())[w.live()[0]].status == "starting"  # persisted at launch
    w.report_all("ready")
    w.traffic.set("e1", held=0, last_request_at=1.0)
    await w.tick(1)
    assert (await w.stored())[w.live()[0]].status == "ready"
    await w.tick(29)
    assert w.launcher.stopping == set()  # within the retention period
    await w.tick(2)
    (victim,) = w.launcher.stopping
    assert w.registry.get(victim).status is S.DRAINING  # type: ignore[union-attr]
    assert w.registry.ready_replicas("e1") == []  # out of routing before it stops
    w.launcher.exit(victim, 0)
    await w.tick(1)
    assert w.live() == [] and await w.stored() == {}


async def test_scale_up_with_load_after_the_delay_and_down_after_its_delay() -> None:
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    w.report_all()
    w.traffic.set("e1", in_flight=12, last_request_at=0.0)
    await w.tick(1)
    assert len(w.live()) == 1  # waiting for the upscale delay
    await w.tick(2)
    assert len(w.live()) == 3
    w.report_all()
    w.traffic.set("e1", in_flight=1, last_request_at=3.0)
    await w.tick(1)
    assert w.launcher.stopping == set()
    await w.tick(10)
    assert len(w.launcher.stopping) == 2  # down to min 1


async def test_scale_down_removes_replicas_still_loading_first() -> None:
    w = await World(endpoint(min_replicas=2, max_replicas=3)).open()
    await w.tick()
    first, second = w.live()
    w.registry.report(
        first,
        w.launcher.alive[first].secret,
        replica_report(first, {"status": "ready", "url": "u"}),
    )
    w.rows = [endpoint(min_replicas=1, max_replicas=1)]
    await w.tick()
    assert w.launcher.stopping == {second}


async def test_a_crashing_replica_is_replaced_with_backoff_and_shows_failed() -> None:
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    (first,) = w.live()
    w.launcher.exit(first, 1, "Traceback...\nRuntimeError: CUDA out of memory")
    await w.tick()
    replica = w.registry.get(first)
    assert replica is not None and replica.status is S.FAILED
    assert "CUDA out of memory" in (replica.reason or "")
    assert len(w.launcher.launched) == 1  # backoff: not at once
    await w.tick(1.1)
    assert len(w.launcher.launched) == 2
    (second,) = w.live()
    w.launcher.exit(second, 1)
    await w.tick()
    await w.tick(1.1)
    assert len(w.launcher.launched) == 2  # second failure: 2 s backoff
    await w.tick(1)
    assert len(w.launcher.launched) == 3
    w.report_all()
    await w.tick()
    assert w.statuses() == ["ready"]  # failures pruned once one is ready
    # ... but the record still says why the last one was replaced.
    last = w.reconciler.last_failure("e1")
    assert last is not None and last.replica_id == second
    assert last.reason.startswith("process exited with code 1")


async def test_replicas_lost_while_serving_are_replaced_at_once_and_not_failed() -> None:
    """Both ready replicas go with their node: replacements are launched in
    the same pass (no crash-loop backoff), and until one is ready the record
    says initializing with why, never failed."""
    from inferd.control.endpoints.records import ReplicaView, derive_status

    w = await World(endpoint(min_replicas=2)).open()
    await w.tick()
    w.report_all()
    await w.tick()
    lost = w.live()
    assert len(lost) == 2
    for rid in lost:
        w.launcher.exit(rid, None, "node 10.0.0.7 left the Ray cluster")
    await w.tick()
    assert len(w.launcher.launched) == 4  # at once
    replacing = w.reconciler.replacing("e1")
    assert replacing is not None and "left the Ray cluster" in replacing
    failed_only = [ReplicaView(1, S.FAILED, reason="lost")] * 2
    derived = derive_status(endpoint(min_replicas=2), failed_only, None, replacing)
    assert (derived.status.value, derived.reason) == ("initializing", replacing)
    w.report_all()
    await w.tick()
    assert w.reconciler.replacing("e1") is None
    # One that served and then crashed is a loss too: replaced at once.
    (crashing, _) = w.live()
    w.launcher.exit(crashing, 1)
    await w.tick()
    assert len(w.launcher.launched) == 5


async def test_a_silent_replica_is_routed_around_then_replaced_then_ended() -> None:
    """Silent but its process alive: unresponsive (not killed) after the
    failure periods; past the grace, the endpoint's last ready replica is
    kept and a replacement launched beside it; once that is ready, the
    silent one is ended (killed, its requests aborted)."""
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    w.report_all()
    (rid,) = w.live()
    await w.tick(3.5, heartbeat=False)
    replica = w.registry.get(rid)
    assert replica is not None and replica.unresponsive and replica.status is S.READY
    assert rid in w.probe.probed  # asked directly
    assert w.launcher.killed == [] and len(w.launcher.launched) == 1
    await w.tick(DEAD_AFTER_S - 3, heartbeat=False)  # past the grace
    assert w.launcher.killed == []  # the last ready one: kept
    assert len(w.launcher.launched) == 2  # ... and replaced beside it
    new = next(r for r in w.live() if r != rid)
    w.registry.report(
        new,
        w.launcher.alive[new].secret,
        replica_report(new, {"status": "ready", "url": "http://127.0.0.1/new"}),
    )
    await w.tick(1, silent=frozenset({rid}))
    assert w.launcher.killed == [rid]
    assert rid in w.traffic.aborted
    assert w.live() == [new]
    assert len(w.launcher.launched) == 2


async def test_a_silent_replica_that_answers_its_probe_is_never_ended() -> None:
    w = await World(endpoint(min_replicas=2)).open()
    await w.tick()
    w.report_all()
    first, _ = w.live()
    w.probe.answering.add(first)
    for _ in range(4 * int(DEAD_AFTER_S)):
        await w.tick(1, silent=frozenset({first}))
        replica = w.registry.get(first)
        assert replica is not None and not replica.unresponsive
    assert w.launcher.killed == [] and len(w.launcher.launched) == 2
    assert w.statuses() == ["ready", "ready"]


async def test_replicas_all_silent_are_ended_a_bounded_share_at_a_time() -> None:
    """Three replicas go silent at once (their node is overloaded, say):
    at most a third of them is ended per window, never the last ready one."""
    w = await World(endpoint(min_replicas=3), slots=3).open()
    await w.tick()
    w.report_all()
    silent = frozenset(w.live())
    assert len(silent) == 3
    await w.tick(DEAD_AFTER_S + 1, silent=silent)
    assert len(w.launcher.killed) == 1
    for _ in range(30):  # the rest of the window: nothing more is ended
        await w.tick(5, silent=silent)
        assert len(w.launcher.killed) == 1
    # Past the window, one more; the last ready one never.
    await w.tick(ReconcilerSettings().silent_end_window_s, silent=silent)
    assert len(w.launcher.killed) == 2
    await w.tick(ReconcilerSettings().silent_end_window_s, silent=silent)
    assert len(w.launcher.killed) == 2
    (last,) = (rid for rid in silent if rid not in w.launcher.killed)
    assert w.registry.get(last).status is S.READY  # type: ignore[union-attr]


async def test_no_capacity_is_reported_not_retried_blindly() -> None:
    w = await World(endpoint(min_replicas=2), slots=1).open()
    await w.tick()
    assert len(w.launcher.launched) == 1
    assert w.reconciler.capacity_reason("e1") == "no free slot"


async def test_a_replica_that_fits_nowhere_is_told_apart_from_a_full_cluster() -> None:
    """No capacity now (every slot taken) is worth waiting for; a location
    with nothing of the type at all is not: only that one is `unplaceable`,
    and it clears once the cluster could take it."""
    w = await World(endpoint(min_replicas=2), slots=1).open()
    await w.tick()
    assert w.reconciler.capacity_reason("e1") == "no free slot"
    assert w.reconciler.unplaceable("e1") is None
    w = await World(endpoint(min_replicas=1, location_name="nowhere")).open()
    await w.tick()
    assert w.reconciler.unplaceable("e1") == "no location 'nowhere'"
    assert w.launcher.launched == []
    w.launcher.location = "nowhere"
    await w.tick()
    assert w.reconciler.unplaceable("e1") is None


async def test_gpu_change_rolls_replicas_over() -> None:
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    w.report_all()
    (old,) = w.live()
    w.rows = [endpoint(min_replicas=1, generation=2)]
    await w.tick()
    new = [r for r in w.live() if r != old]
    assert len(new) == 1 and w.launcher.stopping == set()  # old serves until new is ready
    w.registry.report(
        new[0],
        w.launcher.alive[new[0]].secret,
        replica_report(new[0], {"status": "ready", "url": "u"}),
    )
    await w.tick()
    assert w.launcher.stopping == {old}


async def test_delete_drains_everything_and_waits_for_the_processes() -> None:
    w = await World(endpoint(min_replicas=2)).open()
    await w.tick()
    w.report_all()
    ids = w.live()
    follower = asyncio.ensure_future(follow(w))
    drain = asyncio.ensure_future(w.reconciler.drain_endpoint("e1", timeout_s=5))
    await until(lambda: w.launcher.stopping == set(ids))
    assert not drain.done()  # waits for the processes, not only the stop requests
    w.launcher.exit(ids[0], 0)
    await until(lambda: w.registry.get(ids[0]) is None)
    assert not drain.done()
    w.launcher.exit(ids[1], 0)
    await drain
    follower.cancel()
    assert w.registry.of_endpoint("e1") == [] and await w.stored() == {}


async def test_delete_kills_what_does_not_end_within_the_timeout() -> None:
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    (rid,) = w.live()
    follower = asyncio.ensure_future(follow(w))
    await w.reconciler.drain_endpoint("e1", timeout_s=0)
    follower.cancel()
    assert w.launcher.killed == [rid] and w.registry.of_endpoint("e1") == []


async def test_delete_while_the_loop_ticks_forgets_each_replica_once() -> None:
    """DELETE's drain and the reconcile loop both write the store; they must
    take turns."""
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    w.report_all()
    await w.tick()
    (rid,) = w.live()
    w.rows[0] = dataclasses.replace(w.rows[0], deleting_at=T0)
    follower = asyncio.ensure_future(follow(w))
    w.launcher.exit(rid, 0)  # its process ended just now
    ticks = [w.reconciler.tick() for _ in range(3)]
    await asyncio.gather(w.reconciler.drain_endpoint("e1", timeout_s=5), *ticks)
    follower.cancel()
    assert w.registry.of_endpoint("e1") == [] and await w.stored() == {}


async def test_a_copy_that_lags_behind_a_delete_launches_nothing() -> None:
    """The endpoint copy lags behind a delete: DELETE's drain found nothing to
    stop, and the copy still shows the row live (wanting a replica). No pass
    launches for it; once the copy has caught up, nothing is remembered."""
    w = await World(endpoint(min_replicas=0)).open()
    await w.tick()
    assert w.live() == []
    await w.reconciler.drain_endpoint("e1", timeout_s=5)  # nothing to stop yet
    w.rows[0] = dataclasses.replace(w.rows[0], min_replicas=1)  # the stale copy
    await w.tick()
    await w.tick(advance=5)
    assert w.launcher.launched == [] and await w.stored() == {}
    w.rows.clear()  # the copy catches up: the endpoint is gone
    await w.tick()
    assert w.reconciler._deleted == set()


async def test_a_replica_left_after_its_endpoints_delete_is_stopped() -> None:
    """A replica whose endpoint is gone from the copy (launched by another
    leader's last pass, say) is drained and its row removed."""
    w = await World(endpoint(min_replicas=1)).open()
    await w.tick()
    (rid,) = w.live()
    w.rows.clear()  # the endpoint is gone, its replica was not drained
    await w.tick()
    assert w.launcher.stopping == {rid}
    w.launcher.exit(rid, 1)  # not a clean exit: a failed row would stay
    await w.tick()
    await w.tick()
    assert w.registry.of_endpoint("e1") == [] and await w.stored() == {}


async def test_an_exit_is_told_apart_by_its_reason() -> None:
    """A stopped replica that drained goes; one that crashed is failed."""
    w = await World(endpoint(min_replicas=2)).open()
    await w.tick()
    w.report_all()
    first, second = w.live()
    await w.reconciler.replica_exited(ReplicaExit(first, ExitReason.EXITED, 3, "boom"))
    replica = w.registry.get(first)
    assert replica is not None and replica.status is S.FAILED and "boom" in (replica.reason or "")
    assert first in w.traffic.aborted
    w.registry.set_status(second, S.DRAINING, "scaled down")
    await w.reconciler.replica_exited(ReplicaExit(second, ExitReason.STOPPED, 0))
    assert w.registry.get(second) is None


async def test_creating_or_changing_an_endpoint_wakes_the_loop_at_once() -> None:
    w = await World(endpoint(min_replicas=1)).open()
    w.reconciler.settings = dataclasses.replace(w.reconciler.settings, period_s=3600)
    w.reconciler.start()
    await until(lambda: len(w.launcher.launched) == 1)  # the first tick
    w.rows = [endpoint(min_replicas=2)]
    w.reconciler.endpoint_changed("e1")
    await until(lambda: len(w.launcher.launched) == 2)  # not an hour later
    await w.reconciler.stop()


async def follow(w: World) -> None:
    async for exited in w.launcher.exits():
        await w.reconciler.replica_exited(exited)


until = eventually


async def test_adopt_after_restart_keeps_replicas_and_counts_them_as_wanted() -> None:
    w = await World(endpoint(min_replicas=0)).open()
    w.traffic.set("e1", held=1, last_request_at=0.0)
    await w.tick()
    w.report_all()
    await w.tick()
    rows = await w.records.list_replicas()
    # A new control plane: fresh registry and reconciler, same launcher and store.
    fresh = World(endpoint(min_replicas=0))
    fresh.launcher = w.launcher
    fresh.records = w.records
    fresh.registry = fresh.new_registry()
    fresh.reconciler = fresh.new_reconciler()
    adopted = await fresh.reconciler.adopt(rows, fresh.rows)
    assert adopted == [rows[0].id]
    await fresh.tick()
    assert fresh.launcher.stopping == set()  # not scaled away on the first tick
    assert fresh.registry.ready_replicas("e1")  # routable at once (url was stored)


@pytest.mark.parametrize("status", ["stopped", "failed"])
async def test_adopt_skips_finished_replicas(status: str) -> None:
    w = await World(endpoint()).open()
    record = ReplicaRecord("r-x", "e1", 1, "cpu", 1, b"d", status, T0, T0, node="fake")
    assert await w.reconciler.adopt([record], w.rows) == []


class FencingStore(MemoryStore):
    """A memory store that fences replica writes as PostgreSQL does: a term
    other than `current` is refused, and nothing is written."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 1
        self.terms: list[int | None] = []

    def _fence(self, term: int | None) -> None:
        self.terms.append(term)
        if term is not None and term != self.current:
            raise Deposed(term, self.current)

    async def insert_replica(self, record: ReplicaRecord, *, term: int | None = None) -> None:
        self._fence(term)
        await super().insert_replica(record, term=term)

    async def update_replica(self, replica_id: str, **kw: Any) -> None:
        self._fence(kw.get("term"))
        await super().update_replica(replica_id, **kw)

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        self._fence(term)
        await super().delete_replica(replica_id, term=term)


async def test_a_deposed_reconciler_stops_acting_on_its_first_refused_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World(endpoint(min_replicas=1))
    store = w.records = FencingStore()
    w.registry = w.new_registry()
    w.reconciler = w.new_reconciler()
    await w.open()
    w.reconciler.settings = dataclasses.replace(w.reconciler.settings, period_s=3600)
    w.reconciler.start(term=1)
    await until(lambda: store.terms == [1])  # the leader's write carried its term
    assert len(w.launcher.launched) == 1
    store.current = 2  # another instance leads now
    w.rows = [endpoint(min_replicas=3)]
    w.reconciler.endpoint_changed("e1")
    task = w.reconciler._task
    assert task is not None
    await until(task.done)
    assert task.exception() is None  # stopped, not crashed
    assert len(await store.list_replicas()) == 1  # the refused write left nothing
    launched = len(w.launcher.launched)
    w.reconciler.endpoint_changed("e1")
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(w.launcher.launched) == launched  # no longer acts as leader
    refused = [r for r in caplog.records if "reconciler stops" in r.getMessage()]
    assert len(refused) == 1
    await w.reconciler.stop()


class Looks:
    """Which endpoints each pass looked at (the quota cap is asked once per
    endpoint looked at)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, row: Any, desired: int, rows: Any) -> tuple[int, str | None]:
        self.seen.append(row.id)
        return desired, None


async def watched_world(rows: list[Endpoint], settings: ReconcilerSettings) -> tuple[World, Looks]:
    w = World(rows[0])
    w.rows = rows
    for row in rows:
        await w.records.insert_endpoint(row, row.id.encode().ljust(32, b"h"))
    looks = Looks()
    w.reconciler = w.new_reconciler()
    w.reconciler.settings = settings
    w.reconciler.replica_cap = looks
    return w, looks


async def test_a_ring_looks_only_at_the_endpoint_that_changed() -> None:
    rows = [endpoint(id=f"e{n}", name=f"n{n}") for n in range(5)]
    w, looks = await watched_world(rows, ReconcilerSettings(period_s=3600, resync_s=3600))
    w.reconciler.start()
    await until(lambda: len(looks.seen) == 5)  # the first pass looks at every one
    looks.seen.clear()
    w.reconciler.endpoint_changed("e3")
    await until(lambda: bool(looks.seen))
    for _ in range(50):
        await asyncio.sleep(0)
    assert looks.seen == ["e3"]
    # A request held on another endpoint: that one, at once.
    w.reconciler.capacity_wanted("e1")
    await until(lambda: len(looks.seen) == 2)
    assert looks.seen == ["e3", "e1"]
    await w.reconciler.stop()


async def test_endpoints_that_move_with_the_clock_are_swept_and_all_are_resynced() -> None:
    rows = [endpoint(id="busy", name="busy", min_replicas=1)] + [
        endpoint(id=f"idle{n}", name=f"idle{n}") for n in range(3)
    ]
    w, looks = await watched_world(rows, ReconcilerSettings(period_s=0.01, resync_s=3600))
    w.reconciler.start()
    await until(lambda: len(looks.seen) >= 4)
    await until(lambda: looks.seen[4:].count("busy") >= 3, turns=100_000)
    assert set(looks.seen[4:]) == {"busy"}  # a replica to keep: looked at every period
    await w.reconciler.stop()
    looks.seen.clear()
    w.reconciler.settings = ReconcilerSettings(period_s=3600, resync_s=0.01)
    w.reconciler.start()
    await until(lambda: looks.seen.count("idle0") >= 2, turns=100_000)
    await w.reconciler.stop()


async def test_adopted_replicas_are_judged_only_after_a_grace_of_their_own() -> None:
    """A new leader adopts first and judges later: an adopted replica that
    has not reported to it yet is silent since its adoption, not since its
    last report to the old leader; a probe answer keeps it; silence past
    the grace of its own ends it (one of two: the share allows one)."""
    w = await World(endpoint(min_replicas=2)).open()
    await w.tick()
    w.report_all()
    await w.tick()
    adopted = frozenset(w.live())
    records = list((await w.stored()).values())
    w.clock.now += 1000  # the old leader's last word is long past
    w.registry = w.new_registry()
    w.reconciler = w.new_reconciler()
    assert set(await w.reconciler.adopt(records, w.rows)) == adopted
    await w.tick(DEAD_AFTER_S - 1, silent=adopted)
    assert w.launcher.killed == []
    first, second = sorted(adopted)
    w.probe.answering.add(first)
    await w.tick(0.5, silent=adopted)  # probed: the first answers
    assert w.launcher.killed == []
    await w.tick(1.5, silent=adopted)
    assert w.launcher.killed == [second]
    assert first in w.live()


async def test_a_leader_again_counts_silence_only_from_its_new_term() -> None:
    """A leader that lost the lead and wins it back keeps the replicas it
    launched (nothing to adopt), but not its old clock: while another
    instance led, their reports went there, and that silence was not
    observed here. Ended only after a grace of silence it saw itself."""
    w = await World(endpoint(min_replicas=2)).open()
    await w.tick()
    w.report_all()
    await w.tick()
    watched = frozenset(w.live())
    w.reconciler.settings = dataclasses.replace(w.reconciler.settings, period_s=3600, resync_s=3600)
    w.clock.now += 1000  # led elsewhere meanwhile
    w.reconciler.start(term=2)  # its first pass runs at once
    await w.tick(DEAD_AFTER_S - 1, silent=watched)
    assert w.launcher.killed == []
    await w.tick(2, silent=watched)
    assert len(w.launcher.killed) == 1  # the share: one of two at a time
    await w.reconciler.stop()
