"""Sharing the gateways' load between instances over PostgreSQL.

Each instance keeps counting its own requests (the gateway's traffic) and,
about every second, upserts one row per endpoint it has seen into
`inferd_gateway_load` (UNLOGGED: soft state, rebuilt within a second after a
crash). The leader sums the fresh rows: the autoscaler then sees every
instance's traffic, not only what reached the leader. This is the pattern of
Knative's per-activator reports and Ray Serve's per-handle metrics.

Freshness: a row counts only while younger than `max_age_s` (twice the
publishing interval, at least 3 s), so an instance that died stops holding
load up; its `last_request_at` still counts, so an endpoint does not scale
to zero earlier because the instance that saw its last request is gone.
The leader hands the other instances' rows to its `MergedLoad` as samples,
which adds them to its own gateway's live counts.
Times in rows are the database's clock (`now()`), never a process's
monotonic clock, which does not compare across machines.

A request held at zero replicas cannot wait a publishing period: the
instance that holds it writes its row and sends `NOTIFY inferd_wake` in the
same transaction (delivered at commit), and the leader, listening, wakes
its reconciler at once. NOTIFY is not a queue (a listener that is not
connected misses it), so the leader also re-reads the table every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inferd.control.ports import LoadSample

logger = logging.getLogger(__name__)

WAKE_CHANNEL = "inferd_wake"

SCHEMA_STATEMENTS = (
    """CREATE UNLOGGED TABLE IF NOT EXISTS inferd_gateway_load (
        instance_id text NOT NULL,
        endpoint_id text NOT NULL,
        in_flight integer NOT NULL,
        held integer NOT NULL,
        last_request_at timestamptz,
        reported_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (instance_id, endpoint_id))""",
)


# -- the policy (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class LoadReport:
    """One instance's load for one endpoint. Times: seconds since the epoch,
    on the database's clock."""

    instance_id: str
    endpoint_id: str
    in_flight: int
    held: int
    last_request_at: float | None
    reported_at: float


def max_age(interval_s: float) -> float:
    """How old a report may be and still count: two missed intervals, and
    never under 3 s (a busy instance's event loop can be late a second)."""
    return max(3.0, 2.0 * interval_s)


def remote_samples(
    reports: Iterable[LoadReport],
    own_instance: str,
    db_now: float,
    mono_now: float,
    max_age_s: float,
) -> list[LoadSample]:
    """The other instances' reports as load samples on this process's clock
    (for `MergedLoad.publish`, which adds them to this gateway's own counts).
    A stale report adds no load but keeps its last request: an endpoint
    must not scale to zero early because the instance that saw its last
    request died. Every sample is taken `mono_now`: staleness is judged
    here, against the database's clock."""
    samples = []
    for report in reports:
        if report.instance_id == own_instance:
            continue
        fresh = db_now - report.reported_at <= max_age_s
        last = report.last_request_at
        samples.append(
            LoadSample(
                source=report.instance_id,
                endpoint_id=report.endpoint_id,
                in_flight=report.in_flight if fresh else 0,
                held=report.held if fresh else 0,
                in_flight_by_replica=MappingProxyType({}),
                last_request_at=None if last is None else mono_now - (db_now - last),
                at=mono_now,
            )
        )
    return samples


@dataclass(frozen=True)
class LocalLoad:
    """One endpoint's load as this instance's gateway counts it. Its
    `last_request_at` is on this process's monotonic clock; it is sent as
    an age, and the database turns it into a time on its own clock."""

    endpoint_id: str
    in_flight: int
    held: int
    last_request_at: float | None


def rows_to_publish(
    current: Mapping[str, LocalLoad], published: Mapping[str, LocalLoad]
) -> list[LocalLoad]:
    """The rows an instance writes this round: those whose numbers changed
    since it last wrote them, and those carrying load (a heartbeat, so they
    stay fresh). An idle, unchanged row ages out harmlessly: stale rows add
    no load, and their `last_request_at` still counts."""
    return [
        load
        for endpoint_id, load in current.items()
        if load != published.get(endpoint_id) or load.in_flight or load.held
    ]


# -- PostgreSQL ----------------------------------------------------------------

_UPSERT = """
INSERT INTO inferd_gateway_load
    (instance_id, endpoint_id, in_flight, held, last_request_at, reported_at)
SELECT %s, e, f, h, now() - make_interval(secs => a), now()
FROM unnest(%s::text[], %s::int[], %s::int[], %s::float8[]) AS t(e, f, h, a)
ON CONFLICT (instance_id, endpoint_id) DO UPDATE SET
    in_flight = excluded.in_flight, held = excluded.held,
    last_request_at = excluded.last_request_at, reported_at = excluded.reported_at
"""

_READ = """
SELECT instance_id, endpoint_id, in_flight, held,
       extract(epoch FROM last_request_at)::float8, extract(epoch FROM reported_at)::float8,
       extract(epoch FROM now())::float8
FROM inferd_gateway_load
"""


async def ensure_schema(conn: Any) -> None:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('inferd-migrate'))")
        for statement in SCHEMA_STATEMENTS:
            await conn.execute(statement)


async def publish(conn: Any, instance_id: str, loads: Sequence[LocalLoad], mono_now: float) -> None:
    """One statement for all of this instance's rows (N instances make N
    statements a second, whatever the number of endpoints). `mono_now`: the
    gateway's clock now, to turn its times into ages."""
    if not loads:
        return
    await conn.execute(
        _UPSERT,
        (
            instance_id,
            [load.endpoint_id for load in loads],
            [load.in_flight for load in loads],
            [load.held for load in loads],
            [
                None if load.last_request_at is None else max(0.0, mono_now - load.last_request_at)
                for load in loads
            ],
        ),
    )


async def publish_and_wake(conn: Any, instance_id: str, load: LocalLoad, mono_now: float) -> None:
    """The first held request: the row and the wake-up in one transaction,
    so the leader that wakes reads a row that already says `held`."""
    async with conn.transaction():
        await publish(conn, instance_id, [load], mono_now)
        await conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, load.endpoint_id))


async def read_reports(conn: Any) -> tuple[list[LoadReport], float]:
    """Every row, and the database's `now()` to judge their age by."""
    cursor = await conn.execute(_READ)
    rows = await cursor.fetchall()
    reports = [
        LoadReport(
            instance_id=row[0],
            endpoint_id=row[1],
            in_flight=int(row[2]),
            held=int(row[3]),
            last_request_at=row[4],
            reported_at=row[5],
        )
        for row in rows
    ]
    if rows:
        return reports, float(rows[0][6])
    cursor = await conn.execute("SELECT extract(epoch FROM now())::float8")
    row = await cursor.fetchone()
    return reports, float(row[0])


async def forget_instance(conn: Any, instance_id: str) -> None:
    """On a clean shutdown: this instance's rows go at once."""
    await conn.execute("DELETE FROM inferd_gateway_load WHERE instance_id = %s", (instance_id,))


async def forget_endpoint(conn: Any, endpoint_id: str) -> None:
    await conn.execute("DELETE FROM inferd_gateway_load WHERE endpoint_id = %s", (endpoint_id,))


# -- listening -----------------------------------------------------------------


class Listener:
    """LISTENs on `channels` over a dedicated connection and calls
    `on_notify(channel, payload)` for each notification. After every
    (re)connect it calls `on_resync()` first: notifications sent while it
    was not listening are gone for good, so the caller reloads instead."""

    def __init__(
        self,
        url: str,
        channels: Sequence[str],
        on_notify: Callable[[str, str], Awaitable[None] | None],
        on_resync: Callable[[], Awaitable[None] | None],
        retry_s: float = 0.5,
    ) -> None:
        self.url = url
        self.channels = tuple(channels)
        self._on_notify = on_notify
        self._on_resync = on_resync
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        import psycopg

        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    keepalives=1,
                    keepalives_idle=5,
                    keepalives_interval=2,
                    keepalives_count=2,
                ) as conn:
                    for channel in self.channels:
                        await conn.execute(f'LISTEN "{channel}"')
                    self.connected.set()
                    await _call(self._on_resync)
                    async for note in conn.notifies():
                        await _call(self._on_notify, note.channel, note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("listening on %s: %s; reconnecting", ",".join(self.channels), exc)
            self.connected.clear()
            await asyncio.sleep(self._retry_s)


async def _call(callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
    try:
        result = callback(*args)
        if result is not None:
            await result
    except Exception:
        logger.exception("notification handler failed")
