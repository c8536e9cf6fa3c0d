"""`Postgres`: the `Coordination` of instances that share one PostgreSQL.

- **Election** (`inferd.control.cluster.lease` has the policy): a session
  advisory lock on a dedicated connection, and a term in `inferd_leader`
  incremented by each new leader. Every leader write checks the term in its
  own transaction (`fenced`, `check_term_sync`), so a deposed leader's late
  write fails. No claim is made before `ready` (the store's own connection
  pool) answers: a leader whose duties cannot reach the database would
  step down at once and be elected again seconds later.
- **Load sharing** (`inferd.control.cluster.loadshare` has the policy):
  every instance upserts its gateway's per-endpoint load into
  `inferd_gateway_load` about every interval; the leader re-reads the table
  every interval and hands the other instances' rows to `on_remote_load`.
- **Wake-ups**: a request held at zero replicas writes its row and
  `NOTIFY inferd_wake` in one transaction; the leader LISTENs and calls
  `on_wake` at once, and after each reconnect reads the table again
  (NOTIFY is not a queue).

Both tables are created by the store's migrations
(`inferd.control.stores.sql.migrations`). All connections come from
one `Connections` manager: the lock session (dedicated: a pooled one would
hand the lock to whoever borrows it next), one shared connection for load
rows, and the listener's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from inferd.aio import wait_event
from inferd.control.cluster.lease import (
    NOT_LEADING,
    LeaseSettings,
    confirmed,
    elected,
    fence_allows,
    heartbeat_stale,
    lease_holds,
)
from inferd.control.cluster.loadshare import (
    LoadReport,
    LocalLoad,
    max_age,
    remote_samples,
    rows_to_publish,
)
from inferd.control.cluster.ports import LeaderDuties, LeaderInfo
from inferd.control.model import Deposed
from inferd.control.ports import LoadSample
from inferd.control.stores.sql.postgres_dialect import TERM_FOR_SHARE
from inferd.control.stores.sql.postgres_dialect import check_term_sync as check_term_sync
from inferd.gateway.traffic import TrafficSnapshot

logger = logging.getLogger(__name__)

# The advisory lock key: any 64-bit number every instance agrees on. It is
# the text's hash so that other applications on the same database, which
# pick their own keys, are unlikely to collide with it.
LOCK_KEY_SQL = "hashtext('inferd-leader')"
WAKE_CHANNEL = "inferd_wake"
UNKNOWN_LEADER = LeaderInfo(term=None, holder=None)
DEFAULT_LEASE = LeaseSettings()

# -- SQL -------------------------------------------------------------------------


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


@contextlib.asynccontextmanager
async def fenced(conn: Any, term: int) -> AsyncIterator[Any]:
    """A transaction on `conn` (a psycopg AsyncConnection) that commits only
    if `term` is still the current leader term. Raises `Deposed` before the
    body runs otherwise."""
    async with conn.transaction():
        cursor = await conn.execute(TERM_FOR_SHARE)
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0
        if not fence_allows(term, current):
            raise Deposed(term, current)
        yield conn


async def read_leader(conn: Any) -> LeaderInfo | None:
    cursor = await conn.execute(
        "SELECT term, holder, since, heartbeat_at FROM inferd_leader WHERE id = 1"
    )
    row = await cursor.fetchone()
    if row is None:
        return None
    return LeaderInfo(term=int(row[0]), holder=row[1], since=row[2], heartbeat_at=row[3])


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


def local_loads(snapshots: Iterable[TrafficSnapshot]) -> dict[str, LocalLoad]:
    return {
        snap.endpoint_id: LocalLoad(
            snap.endpoint_id, snap.in_flight, snap.held, snap.last_request_at
        )
        for snap in snapshots
    }


# -- connections -----------------------------------------------------------------


class Connections:
    """Every PostgreSQL connection of the coordination: opened with the same
    keepalives, reopened on the next use after a failure."""

    def __init__(self, url: str, instance_id: str, lease: LeaseSettings) -> None:
        self.url = url
        self.instance_id = instance_id
        self._lease = lease
        self._session: Any = None
        self._shared: Any = None
        self._shared_lock = asyncio.Lock()

    async def _open(self, **extra: Any) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, keepalives=1, keepalives_idle=5, **extra
        )

    async def session(self) -> Any:
        """The lock's own session. It notices a dead peer through keepalives
        and a user timeout, well inside the failover goal, instead of the
        kernel's default of hours."""
        if self._session is None or self._session.closed:
            self._session = await self._open(
                application_name=f"inferd-leader {self.instance_id}"[:63],
                connect_timeout=max(1, int(self._lease.check_timeout_s)),
                keepalives_interval=2,
                keepalives_count=2,
                tcp_user_timeout=int(self._lease.lease_s * 1000),
            )
        return self._session

    async def close_session(self) -> None:
        """The one sure way to release the lock."""
        conn, self._session = self._session, None
        await _close(conn)

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[Any]:
        """The load rows' connection, one user at a time; closed on an error
        (reopened by the next user)."""
        async with self._shared_lock:
            if self._shared is None or self._shared.closed:
                self._shared = await self._open(connect_timeout=3)
            try:
                yield self._shared
            except BaseException:
                conn, self._shared = self._shared, None
                await _close(conn)
                raise

    async def listen(self, channel: str) -> Any:
        """A new connection that LISTENs on `channel` (the caller closes it)."""
        conn = await self._open(connect_timeout=3, keepalives_interval=2, keepalives_count=2)
        await conn.execute(f'LISTEN "{channel}"')
        return conn

    async def close(self) -> None:
        await self.close_session()
        async with self._shared_lock:
            conn, self._shared = self._shared, None
            await _close(conn)


async def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close()


# -- the adapter -------------------------------------------------------------------


class Postgres:
    """`Coordination` over PostgreSQL. `traffic`: this gateway's per-endpoint
    snapshots now; `on_remote_load`: the leader's `MergedLoad.publish`;
    `on_wake`: the leader's reconciler; `ready`: a query through the store's
    pool, awaited before a claim."""

    def __init__(
        self,
        url: str,
        instance_id: str,
        *,
        traffic: Callable[[], Iterable[TrafficSnapshot]],
        on_remote_load: Callable[[LoadSample], None],
        on_wake: Callable[[str], None],
        ready: Callable[[], Awaitable[object]] | None = None,
        interval_s: float = 1.0,
        lease: LeaseSettings = DEFAULT_LEASE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._instance_id = instance_id
        self.interval_s = interval_s
        self.settings = lease
        self._traffic = traffic
        self._on_remote_load = on_remote_load
        self._on_wake = on_wake
        self._ready = ready
        self._clock = clock
        self._db = Connections(url, instance_id, lease)
        self._max_age = max_age(interval_s)
        self._state = NOT_LEADING
        self._info = UNKNOWN_LEADER
        # The session was (re)opened and the store's pool not yet seen
        # answering since: no claim until it does.
        self._unproven = True
        self._duties: LeaderDuties | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._leader_tasks: list[asyncio.Task[None]] = []
        self._wakes: set[asyncio.Task[None]] = set()
        self._published: dict[str, LocalLoad] = {}
        self._stopping = asyncio.Event()
        self.changed = asyncio.Event()
        # What the leader read last (tests and the console).
        self.last_samples: list[LoadSample] = []

    # -- state ---------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def ends_with_instance(self) -> bool:
        return False

    @property
    def term(self) -> int | None:
        state = self._state
        return state.term if lease_holds(state, self._clock(), self.settings) else None

    @property
    def leading(self) -> bool:
        return self.term is not None

    def leader(self) -> LeaderInfo:
        return self._info

    def health(self) -> dict[str, Any]:
        leading = self.leading
        info = self._info
        holder = self._instance_id if leading else info.holder
        if not leading and holder == self._instance_id:
            holder = None  # a row this instance wrote while it led: stale
        return {
            "instance": self._instance_id,
            "leader": {"instance": holder, "term": info.term if holder else None, "self": leading},
        }

    async def confirm(self, term: int) -> None:
        async with self._db.shared() as conn, fenced(conn, term):
            pass

    # -- lifecycle -----------------------------------------------------------

    async def start(self, duties: LeaderDuties) -> None:
        self._duties = duties
        self._stopping.clear()
        self._tasks = [
            asyncio.ensure_future(self._publishing()),
            asyncio.ensure_future(self._electing()),
        ]

    async def stop(self) -> None:
        """Duties first, then the lock session (another instance takes over
        at once), then this instance's load rows."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._step_down("shutting down")
        for task in list(self._wakes):
            task.cancel()
        with contextlib.suppress(Exception):
            async with self._db.shared() as conn:
                await forget_instance(conn, self._instance_id)
        await self._db.close()

    # -- load ------------------------------------------------------------------

    async def publish_load(self, loads: Sequence[LocalLoad]) -> None:
        if not loads:
            return
        async with self._db.shared() as conn:
            await publish(conn, self._instance_id, loads, self._clock())
        self._published.update({load.endpoint_id: load for load in loads})

    async def remote_load(self) -> list[LoadSample]:
        async with self._db.shared() as conn:
            reports, db_now = await read_reports(conn)
        return remote_samples(reports, self._instance_id, db_now, self._clock(), self._max_age)

    def wake(self, endpoint_id: str) -> None:
        task = asyncio.ensure_future(self._wake(endpoint_id))
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _wake(self, endpoint_id: str) -> None:
        snap = local_loads(self._traffic()).get(endpoint_id)
        load = LocalLoad(
            endpoint_id,
            snap.in_flight if snap else 0,
            max(1, snap.held if snap else 0),
            snap.last_request_at if snap else self._clock(),
        )
        try:
            async with self._db.shared() as conn:
                await publish_and_wake(conn, self._instance_id, load, self._clock())
            self._published[endpoint_id] = load
        except Exception as exc:
            logger.warning("could not wake the leader for %s: %s", endpoint_id, exc)

    async def _publishing(self) -> None:
        while True:
            try:
                rows = rows_to_publish(local_loads(self._traffic()), self._published)
                await self.publish_load(rows)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Rows may have been lost with the server: publish all again.
                self._published.clear()
                logger.warning("publishing load failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def _refresh(self) -> None:
        self.last_samples = await self.remote_load()
        for sample in self.last_samples:
            self._on_remote_load(sample)

    async def _reading(self) -> None:
        """A leader's: the other instances' load every interval."""
        while True:
            try:
                await self._refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("reading the shared load failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def _listening(self) -> None:
        """A leader's: wake-ups as they come; after each (re)connect, the
        table again, since wake-ups sent meanwhile are gone."""
        while True:
            conn = None
            try:
                conn = await self._db.listen(WAKE_CHANNEL)
                with contextlib.suppress(Exception):
                    await self._refresh()
                for sample in self.last_samples:
                    if sample.held:
                        self._on_wake(sample.endpoint_id)
                async for note in conn.notifies():
                    with contextlib.suppress(Exception):
                        await self._refresh()
                    self._on_wake(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("listening for wake-ups: %s; reconnecting", exc)
            finally:
                await _close(conn)
            await asyncio.sleep(self.settings.retry_s)

    # -- the election ------------------------------------------------------------

    async def _electing(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._state.leading:
                    await self._confirm()
                    delay = self.settings.check_s
                else:
                    await self._try_acquire()
                    delay = 0.0 if self._state.leading else self.settings.retry_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost connection: never fatal here
                await self._lose(f"{type(exc).__name__}: {exc}")
                delay = self.settings.retry_s
            if delay:
                await wait_event(self._stopping, delay)

    async def _store_ready(self) -> bool:
        if not self._unproven or self._ready is None:
            self._unproven = False
            return True
        try:
            await asyncio.wait_for(self._ready(), self.settings.check_timeout_s * 2)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("not claiming the lead: the store cannot serve yet (%s)", exc)
            return False
        self._unproven = False
        return True

    async def _try_acquire(self) -> None:
        conn = await self._db.session()
        if not await self._store_ready():
            return
        timeout = self.settings.check_timeout_s
        cursor = await asyncio.wait_for(
            conn.execute(f"SELECT pg_try_advisory_lock({LOCK_KEY_SQL})"), timeout
        )
        row = await cursor.fetchone()
        if not (row and row[0]):
            info = await asyncio.wait_for(read_leader(conn), timeout)
            self._info = info or UNKNOWN_LEADER
            age = await self._heartbeat_age(conn)
            if heartbeat_stale(age, lock_free=False, settings=self.settings):
                logger.warning(
                    "leader %s holds the lock but has not beaten for %.0fs",
                    self._info.holder or "?",
                    age,
                )
            return
        cursor = await asyncio.wait_for(
            conn.execute(
                "UPDATE inferd_leader SET term = term + 1, holder = %s, since = now(),"
                " heartbeat_at = now() WHERE id = 1"
                " RETURNING term, holder, since, heartbeat_at",
                (self._instance_id,),
            ),
            timeout,
        )
        row = await cursor.fetchone()
        term = int(row[0])
        self._info = LeaderInfo(term=term, holder=row[1], since=row[2], heartbeat_at=row[3])
        self._state = elected(term, self._clock())
        logger.info("%s leads (term %d)", self._instance_id, term)
        self.changed.set()
        try:
            self._leader_tasks = [
                asyncio.ensure_future(self._listening()),
                asyncio.ensure_future(self._reading()),
            ]
            if self._duties is not None:
                await self._duties.start(term)
        except Exception:
            logger.exception("leader duties failed to start; stepping down")
            await self._lose("duties failed to start")

    async def _heartbeat_age(self, conn: Any) -> float | None:
        cursor = await conn.execute(
            "SELECT extract(epoch FROM now() - heartbeat_at) FROM inferd_leader WHERE id = 1"
        )
        row = await cursor.fetchone()
        return float(row[0]) if row and row[0] is not None else None

    async def _confirm(self) -> None:
        """One round trip on the lock session, also beating the heartbeat;
        a row not updated means the term moved on without us."""
        term = self._state.term
        conn = await self._db.session()
        cursor = await asyncio.wait_for(
            conn.execute(
                "UPDATE inferd_leader SET heartbeat_at = now() WHERE id = 1 AND term = %s"
                " RETURNING term, holder, since, heartbeat_at",
                (term,),
            ),
            self.settings.check_timeout_s,
        )
        row = await cursor.fetchone()
        if row is None:
            await self._lose(f"term {term} is over")
            return
        self._info = LeaderInfo(term=int(row[0]), holder=row[1], since=row[2], heartbeat_at=row[3])
        if not lease_holds(self._state, self._clock(), self.settings):
            # Confirmations came too late (a stalled loop): the server may
            # have let the lock go meanwhile; start over rather than trust it.
            await self._lose("lease ran out between confirmations")
            return
        self._state = confirmed(self._state, self._clock())

    async def _lose(self, why: str) -> None:
        await self._step_down(why)
        # Whoever leads now, this instance cannot tell until it reads the
        # row again; the session may hold the lock still (a late
        # confirmation, failed duties): closing it is the one sure release.
        self._info = UNKNOWN_LEADER
        self._unproven = True
        await self._db.close_session()

    async def _step_down(self, why: str) -> None:
        if not self._state.leading:
            return
        logger.warning("%s stops leading (term %s): %s", self._instance_id, self._state.term, why)
        self._state = NOT_LEADING
        self.changed.set()
        try:
            if self._duties is not None:
                await self._duties.stop()
        except Exception:
            logger.exception("stopping the leader duties failed")
        tasks, self._leader_tasks = self._leader_tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
