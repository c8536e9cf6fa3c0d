"""What the leader runs, and what the other parts ask of the leadership.

The `Coordination` starts `LeaderDuties` with the term on each election
(at once for `Solo`) and stops them when the lead ends:
- `LeaderFlag` records whether they run (the drain and the replica mirror
  ask it; they are built before any election);
- `ReplicaDuty` adopts the replicas in the store this launcher does not
  watch yet, removes a cluster's unrecorded ones, then runs the reconciler
  and the usage meter's replica-seconds.

`Signals` and `LeaderDrain` are what the gateway and the endpoint service
hold: the same objects in both run modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from inferd.control.accounts.meter_feed import MeterFeed
from inferd.control.cluster.ports import Coordination, Deposed, LeaderDuties
from inferd.control.model import Change, ChangeKind, Endpoint, ReplicaRecord
from inferd.control.ports import Launcher, ScaleSignals
from inferd.control.replicas.reconciler import Reconciler
from inferd.control.replicas.registry import Registry

logger = logging.getLogger(__name__)


class LeaderDutySet:
    """Several duties as one: started in order, stopped in reverse; a duty
    that fails to stop does not keep the others running."""

    def __init__(self, duties: Sequence[LeaderDuties]) -> None:
        self._duties = tuple(duties)
        self._started: list[LeaderDuties] = []

    async def start(self, term: int) -> None:
        for duty in self._duties:
            await duty.start(term)
            self._started.append(duty)

    async def stop(self) -> None:
        while self._started:
            duty = self._started.pop()
            try:
                await duty.stop()
            except Exception:
                logger.exception("stopping leader duty %r failed", duty)


class LeaderFlag:
    """A leader duty that only records whether the duties run: what the
    parts built before the election (the drain, the replica mirror) ask."""

    def __init__(self) -> None:
        self.term: int | None = None
        self.changed = asyncio.Event()

    async def start(self, term: int) -> None:
        self.term = term
        self.changed.set()

    async def stop(self) -> None:
        self.term = None
        self.changed.set()

    def leading(self) -> bool:
        return self.term is not None


class ReplicaRows(Protocol):
    async def list_replicas(self) -> list[ReplicaRecord]: ...

    async def list_endpoints(self) -> list[Endpoint]: ...

    async def confirm_term(self, term: int) -> None: ...

    def changes(self) -> AsyncIterator[Change]: ...


class PendingDeletions(Protocol):
    async def finish_pending_deletions(self) -> None: ...


class ReplicaDuty:
    """What only the leader may do: finish the deletions a previous leader
    left, adopt the replicas in the store that this launcher does not watch
    yet (all of them at a first start; a dead leader's, for its successor),
    then reconcile. `run_replicas` False (the management API alone, for
    tests and benchmarks): the deletions only."""

    def __init__(
        self,
        store: ReplicaRows,
        registry: Registry,
        launcher: Launcher,
        reconciler: Reconciler,
        service: PendingDeletions,
        meter_feed: MeterFeed,
        run_replicas: bool = True,
    ) -> None:
        self._store = store
        self._registry = registry
        self._launcher = launcher
        self._reconciler = reconciler
        self._service = service
        # Replica-seconds are sampled where the replicas are reconciled: by
        # one instance, so that a cluster does not count them twice.
        self._meter_feed = meter_feed
        self._run_replicas = run_replicas
        self._running = False

    async def start(self, term: int) -> None:
        # Every replica write carries the term, so that it is refused once
        # another instance leads (a single instance's store has no other
        # writer and ignores it).
        await self._service.finish_pending_deletions()
        if not self._run_replicas:
            return
        self._registry.lead(term)
        records = await self._store.list_replicas()
        # Those it watches already stay as they are (this instance led
        # before, lost the lead in a database outage, and leads again).
        watched = set(self._reconciler.running())
        records = [record for record in records if record.id not in watched]
        endpoints = await self._store.list_endpoints()
        adopted = set(await self._reconciler.adopt(records, endpoints))
        # A launcher whose cluster may hold replicas the store never
        # recorded (Ray) removes them; a local one has nothing to sweep.
        sweep = getattr(self._launcher, "sweep_orphans", None)
        if sweep is not None:
            await sweep(
                adopted | watched | await self._recorded_since(records), self._confirm(term)
            )
        self._registry.drop_rows([record.id for record in records if record.id not in adopted])
        await self._registry.flush()
        if records:
            logger.info("adopted %d of %d replicas", len(adopted), len(records))
        self._reconciler.start(term)
        self._meter_feed.start()
        self._running = True

    async def _recorded_since(self, records: list[ReplicaRecord]) -> set[str]:
        """Replicas recorded after `records` was read: a successor's, should
        this instance have lost the lead meanwhile; never orphans."""
        seen = {record.id for record in records}
        return {r.id for r in await self._store.list_replicas() if r.id not in seen}

    def _confirm(self, term: int) -> Callable[[], Awaitable[None]]:
        async def confirm() -> None:
            await self._store.confirm_term(term)

        return confirm

    async def stop(self) -> None:
        self._registry.lead(None)
        if not self._running:
            return
        self._running = False
        await self._meter_feed.stop()
        await self._reconciler.stop()

    async def end_replicas(self, grace_s: float) -> None:
        """The cluster ends with this instance (a cluster of one): no one
        will adopt its replicas, so they stop now, and their rows go."""
        if not self._run_replicas:
            return
        await self._launcher.shutdown(grace_s)
        for replica in self._registry.all():
            self._registry.remove(replica.replica_id)
        await self._registry.flush()


class Signals:
    """`ScaleSignals` of the gateway and the endpoint service: the local
    reconciler (which acts only while this instance leads) and, for a
    request waiting for capacity, the leader wherever it runs."""

    def __init__(self, reconciler: ScaleSignals, coordination: Coordination) -> None:
        self._reconciler = reconciler
        self._coordination = coordination

    def capacity_wanted(self, endpoint_id: str) -> None:
        self._reconciler.capacity_wanted(endpoint_id)
        self._coordination.wake(endpoint_id)

    def endpoint_changed(self, endpoint_id: str) -> None:
        self._reconciler.endpoint_changed(endpoint_id)


class LeaderDrain:
    """Deleting an endpoint through any instance: the leader stops its
    replicas (the endpoint is marked deleting in the store, which every
    instance follows); another instance waits, on the store's change feed,
    until their rows are gone."""

    def __init__(
        self,
        reconciler: Reconciler,
        flag: LeaderFlag,
        replicas: ReplicaRows,
        timeout_s: float,
    ) -> None:
        self._reconciler = reconciler
        self._flag = flag
        self._replicas = replicas
        self._timeout_s = timeout_s

    async def drain_endpoint(self, endpoint_id: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        feed = self._replicas.changes()
        try:
            while loop.time() < deadline:
                self._flag.changed.clear()
                if self._flag.leading():
                    try:
                        await self._reconciler.drain_endpoint(endpoint_id)
                        return
                    except Deposed:
                        # Deposed mid-drain: the new leader finishes the
                        # deletion; wait for its rows to go, as a follower.
                        pass
                rows = await self._replicas.list_replicas()
                if not any(row.endpoint_id == endpoint_id for row in rows):
                    return
                await _next_change_or(feed, self._flag.changed, deadline - loop.time())
        finally:
            with contextlib.suppress(Exception):
                await feed.aclose()  # type: ignore[attr-defined]


async def _next_change_or(
    feed: AsyncIterator[Change], leadership: asyncio.Event, timeout: float
) -> None:
    """Until a replica changes in the store, this instance's lead changes,
    or `timeout` passes."""
    replica_change = asyncio.ensure_future(_next_replica_change(feed))
    lead_change = asyncio.ensure_future(leadership.wait())
    try:
        await asyncio.wait(
            {replica_change, lead_change},
            timeout=max(timeout, 0.0),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for task in (replica_change, lead_change):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await task


async def _next_replica_change(feed: AsyncIterator[Change]) -> None:
    async for change in feed:
        if change.kind in (ChangeKind.REPLICA, ChangeKind.RESYNC):
            return
    # The store closed: nothing more will come.
    await asyncio.Event().wait()
