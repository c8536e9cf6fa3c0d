"""One instance's part in a cluster of `inferd serve` instances that share a
PostgreSQL.

Every instance:
- publishes its gateway's per-endpoint load about every second
  (`LoadPublisher`), and at once, with a wake-up notification, when a
  request is held at zero replicas;
- takes part in the leader election (`inferd.control.leader`).

The leader alone, while it leads (`LeaderDutySet` started by the election):
- listens for wake-ups and re-reads the shared load every interval
  (`ClusterLoadFeed`), which feeds `ClusterTraffic`, the reconciler's view of
  the traffic of every instance;
- runs the reconciler, the autoscaler, the launcher and the liveness sweep.

Leadership lost means those duties stop at once; the gateway, the management
API and replica reports keep going on every instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from inferd.control import loadshare
from inferd.control.leader import LeaderDuties
from inferd.control.loadshare import (
    WAKE_CHANNEL,
    ClusterLoad,
    Listener,
    LocalLoad,
    as_report,
    merge_load,
    rows_to_publish,
)
from inferd.gateway.traffic import TrafficSnapshot

logger = logging.getLogger(__name__)


class GatewayTraffic(Protocol):
    def traffic(self, endpoint_id: str) -> TrafficSnapshot: ...

    def traffic_all(self) -> dict[str, TrafficSnapshot]: ...

    def abort_replica(self, replica_id: str, reason: str = ...) -> int: ...

    def forget_endpoint(self, endpoint_id: str) -> None: ...


def local_loads(gateway: GatewayTraffic) -> dict[str, LocalLoad]:
    return {
        endpoint_id: LocalLoad(endpoint_id, snap.in_flight, snap.held, snap.last_request_at)
        for endpoint_id, snap in gateway.traffic_all().items()
    }


async def _connect(url: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=3, keepalives=1, keepalives_idle=5
    )


class LoadPublisher:
    """Writes this instance's load rows every `interval_s`; `wake` writes
    one at once and notifies the leader. Database trouble is logged and
    retried: the gateway never waits on it."""

    def __init__(
        self,
        url: str,
        instance_id: str,
        gateway: GatewayTraffic,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.instance_id = instance_id
        self.interval_s = interval_s
        self._gateway = gateway
        self._clock = clock
        self._published: dict[str, LocalLoad] = {}
        self._conn: Any = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._wakes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._wakes):
            task.cancel()
        # A clean stop: this instance's load goes with it, now.
        with contextlib.suppress(Exception):
            async with self._lock:
                conn = await self._connection()
                await loadshare.forget_instance(conn, self.instance_id)
        await self._close()

    def wake(self, endpoint_id: str) -> None:
        """A request is held with no replica ready (called from the gateway's
        path, which must not wait)."""
        task = asyncio.ensure_future(self._wake(endpoint_id))
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def publish_now(self) -> None:
        loads = local_loads(self._gateway)
        rows = rows_to_publish(loads, self._published)
        if not rows:
            return
        async with self._lock:
            conn = await self._connection()
            await loadshare.publish(conn, self.instance_id, rows, self._clock())
        self._published.update({row.endpoint_id: row for row in rows})

    async def _wake(self, endpoint_id: str) -> None:
        snap = self._gateway.traffic(endpoint_id)
        load = LocalLoad(endpoint_id, snap.in_flight, max(1, snap.held), snap.last_request_at)
        try:
            async with self._lock:
                conn = await self._connection()
                await loadshare.publish_and_wake(conn, self.instance_id, load, self._clock())
            self._published[endpoint_id] = load
        except Exception as exc:
            await self._close()
            logger.warning("could not wake the leader for %s: %s", endpoint_id, exc)

    async def _run(self) -> None:
        while True:
            try:
                await self.publish_now()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._close()
                # Rows may have been lost with the server: publish all again.
                self._published.clear()
                logger.warning("publishing load failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = await _connect(self.url)
            await loadshare.ensure_schema(self._conn)
        return self._conn

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


@dataclass(frozen=True)
class _Merged:
    loads: Mapping[str, ClusterLoad]
    db_now: float
    mono_now: float


class ClusterTraffic:
    """The reconciler's traffic source on the leader: its own gateway's
    snapshot, with the load counts and last request summed over every
    instance's fresh report. Per-replica counts stay this gateway's own (they
    only order scale-down victims)."""

    def __init__(
        self,
        gateway: GatewayTraffic,
        instance_id: str,
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway = gateway
        self.instance_id = instance_id
        self.max_age_s = max_age_s
        self._clock = clock
        self._reports: list[loadshare.LoadReport] = []
        self._db_now: float | None = None
        self._mono_at_read = 0.0

    def update(self, reports: Sequence[loadshare.LoadReport], db_now: float) -> None:
        self._reports = list(reports)
        self._db_now = db_now
        self._mono_at_read = self._clock()

    def merged(self) -> _Merged:
        mono_now = self._clock()
        # The database's clock now, advanced by the time since the last read.
        db_now = (self._db_now or 0.0) + (mono_now - self._mono_at_read)
        own = [
            as_report(load, self.instance_id, mono_now, db_now)
            for load in local_loads(self._gateway).values()
        ]
        reports = self._reports if self._db_now is not None else []
        return _Merged(merge_load(reports, db_now, self.max_age_s, own=own), db_now, mono_now)

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        local = self._gateway.traffic(endpoint_id)
        merged = self.merged()
        load = merged.loads.get(endpoint_id)
        if load is None:
            return local
        last = (
            None
            if load.last_request_at is None
            else merged.mono_now - (merged.db_now - load.last_request_at)
        )
        return replace(local, in_flight=load.in_flight, held=load.held, last_request_at=last)

    def abort_replica(self, replica_id: str, reason: str = "the replica failed") -> int:
        return self._gateway.abort_replica(replica_id, reason)

    def forget_endpoint(self, endpoint_id: str) -> None:
        self._gateway.forget_endpoint(endpoint_id)


class ClusterLoadFeed:
    """A leader duty: re-reads the shared load every `interval_s` into
    `ClusterTraffic`, and on a wake-up notification re-reads at once and
    calls `wake(endpoint_id)` (the reconciler)."""

    def __init__(
        self,
        url: str,
        traffic: ClusterTraffic,
        wake: Callable[[str], None],
        interval_s: float = 1.0,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self._traffic = traffic
        self._wake = wake
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._listener: Listener | None = None

    async def start(self, term: int) -> None:
        self._listener = Listener(self.url, [WAKE_CHANNEL], self._on_wake, self._on_resync)
        self._listener.start()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def refresh(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = await _connect(self.url)
            await loadshare.ensure_schema(self._conn)
        reports, db_now = await loadshare.read_reports(self._conn)
        self._traffic.update(reports, db_now)

    async def _on_wake(self, channel: str, endpoint_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.refresh()
        self._wake(endpoint_id)

    async def _on_resync(self) -> None:
        # Wake-ups sent while not listening are lost: read the table and let
        # the reconciler look at every endpoint.
        with contextlib.suppress(Exception):
            await self.refresh()
        for endpoint_id, load in self._traffic.merged().loads.items():
            if load.held:
                self._wake(endpoint_id)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
                logger.warning("reading the shared load failed: %s", exc)
            await asyncio.sleep(self.interval_s)


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


class CallbackDuty:
    """A leader duty from two coroutines (the reconciler's start and stop)."""

    def __init__(
        self, start: Callable[[int], Awaitable[None]], stop: Callable[[], Awaitable[None]]
    ) -> None:
        self._start = start
        self._stop = stop

    async def start(self, term: int) -> None:
        await self._start(term)

    async def stop(self) -> None:
        await self._stop()
