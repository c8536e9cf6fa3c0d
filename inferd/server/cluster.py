"""One instance's part in a cluster of `inferd serve` instances that share a
PostgreSQL.

Every instance:
- publishes its gateway's per-endpoint load about every second
  (`LoadPublisher`), and at once, with a wake-up notification, when a
  request is held at zero replicas;
- takes part in the leader election (`inferd.control.leader`).

The leader alone, while it leads (`LeaderDutySet` started by the election):
- listens for wake-ups and re-reads the shared load every interval
  (`ClusterLoadFeed`), handing the other instances' load to its
  `MergedLoad`, so that the autoscaler sees the traffic of every instance;
- runs the reconciler, the autoscaler, the launcher and the liveness sweep.

Leadership lost means those duties stop at once; the gateway, the management
API and replica reports keep going on every instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from inferd.control import loadshare
from inferd.control.leader import Deposed, LeaderDuties
from inferd.control.loadshare import (
    WAKE_CHANNEL,
    Listener,
    LocalLoad,
    remote_samples,
    rows_to_publish,
)
from inferd.control.model import ReplicaRecord
from inferd.control.ports import LoadSample
from inferd.control.service import Drain
from inferd.gateway.traffic import TrafficSnapshot

logger = logging.getLogger(__name__)


def local_loads(snapshots: Iterable[TrafficSnapshot]) -> dict[str, LocalLoad]:
    return {
        snap.endpoint_id: LocalLoad(
            snap.endpoint_id, snap.in_flight, snap.held, snap.last_request_at
        )
        for snap in snapshots
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
        traffic: Callable[[], Iterable[TrafficSnapshot]],
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`traffic`: this gateway's per-endpoint snapshots, now."""
        self.url = url
        self.instance_id = instance_id
        self.interval_s = interval_s
        self._traffic = traffic
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
        loads = local_loads(self._traffic())
        rows = rows_to_publish(loads, self._published)
        if not rows:
            return
        async with self._lock:
            conn = await self._connection()
            await loadshare.publish(conn, self.instance_id, rows, self._clock())
        self._published.update({row.endpoint_id: row for row in rows})

    async def _wake(self, endpoint_id: str) -> None:
        snap = local_loads(self._traffic()).get(endpoint_id)
        load = LocalLoad(
            endpoint_id,
            snap.in_flight if snap else 0,
            max(1, snap.held if snap else 0),
            snap.last_request_at if snap else self._clock(),
        )
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


class ClusterLoadFeed:
    """A leader duty: every `interval_s`, hands the other instances' load
    (`inferd_gateway_load`) to `publish` (the leader's `MergedLoad`); on a
    wake-up notification, re-reads at once and calls `wake(endpoint_id)`
    (the reconciler)."""

    def __init__(
        self,
        url: str,
        instance_id: str,
        publish: Callable[[LoadSample], None],
        wake: Callable[[str], None],
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.instance_id = instance_id
        self.interval_s = interval_s
        self._publish = publish
        self._wake = wake
        self._clock = clock
        self._max_age = loadshare.max_age(interval_s)
        self.last_samples: list[LoadSample] = []
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
        self.last_samples = remote_samples(
            reports, self.instance_id, db_now, self._clock(), self._max_age
        )
        for sample in self.last_samples:
            self._publish(sample)

    async def _on_wake(self, channel: str, endpoint_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.refresh()
        self._wake(endpoint_id)

    async def _on_resync(self) -> None:
        # Wake-ups sent while not listening are lost: read the table and let
        # the reconciler look at every endpoint.
        with contextlib.suppress(Exception):
            await self.refresh()
        for sample in self.last_samples:
            if sample.held:
                self._wake(sample.endpoint_id)

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


class ClusterSignals:
    """`ScaleSignals` for an instance of a cluster: the local reconciler
    (which acts only while this instance leads) and, for a request waiting
    for capacity, the leader wherever it runs (through the database)."""

    def __init__(self, reconciler: Any, publisher: LoadPublisher) -> None:
        self._reconciler = reconciler
        self._publisher = publisher

    def capacity_wanted(self, endpoint_id: str) -> None:
        self._reconciler.capacity_wanted(endpoint_id)
        self._publisher.wake(endpoint_id)

    def endpoint_changed(self, endpoint_id: str) -> None:
        self._reconciler.endpoint_changed(endpoint_id)


class ReplicaRows(Protocol):
    async def list_replicas(self) -> list[ReplicaRecord]: ...


class ClusterDrain:
    """Deleting an endpoint through any instance: the leader stops its
    replicas (the endpoint is marked deleting in the store, which every
    instance follows); another instance waits until their rows are gone."""

    def __init__(
        self,
        reconciler: Drain,
        leading: Callable[[], bool],
        replicas: ReplicaRows,
        timeout_s: float,
        poll_s: float = 0.2,
    ) -> None:
        self._reconciler = reconciler
        self._leading = leading
        self._replicas = replicas
        self._timeout_s = timeout_s
        self._poll_s = poll_s

    async def drain_endpoint(self, endpoint_id: str) -> None:
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            if self._leading():
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
            await asyncio.sleep(self._poll_s)


class LeaderFlag:
    """A leader duty that only records whether the duties run: what the
    parts built before the election (the drain, the replica mirror) ask."""

    def __init__(self) -> None:
        self.term: int | None = None

    async def start(self, term: int) -> None:
        self.term = term

    async def stop(self) -> None:
        self.term = None

    def leading(self) -> bool:
        return self.term is not None
