"""Leader election over PostgreSQL, with a fencing term.

Several `inferd serve` instances share one PostgreSQL; all of them serve
clients, and exactly one, the leader, runs what must be single (reconciler,
autoscaler, launcher, liveness sweep). Two mechanisms together:

- A session advisory lock on a dedicated, non-pooled connection. The server
  releases it when that session ends (process killed, connection lost), so
  another instance takes over without waiting for any lease to expire. A
  pooled connection would hand the lock to whoever borrows it next, and
  PgBouncer in transaction mode breaks session locks altogether.
- A term: the `inferd_leader` row's counter, incremented by every new leader
  in the session that holds the lock. Every leader write runs in a `fenced`
  transaction that reads the term `FOR SHARE` and refuses to go on when it
  is not the writer's own: a deposed leader's late write (a tick that was
  already running when its connection dropped) fails instead of undoing the
  new leader's work. The share lock makes the check hold until commit: the
  next leader's term increment waits for the write to finish.

A leader that cannot confirm its session (an error, or no answer within the
check timeout) stops leading at once; the pure `lease_holds` also ends
leadership when confirmations stop for a while without an error (a stalled
event loop), because by then the server may have let the lock go.

The policy is pure (frozen dataclasses, the clock passed in) and tested as
tables; `PostgresElection` is the adapter, tested on a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

logger = logging.getLogger(__name__)

# The advisory lock key: any 64-bit number every instance agrees on. It is
# the text's hash so that other applications on the same database, which
# pick their own keys, are unlikely to collide with it.
LOCK_KEY_SQL = "hashtext('inferd-leader')"

# Created by the store's migrations; repeated here (idempotent) so that the
# election works on a database whose schema it does not otherwise own.
SCHEMA_STATEMENTS = (
    """CREATE TABLE IF NOT EXISTS inferd_leader (
        id integer PRIMARY KEY CHECK (id = 1),
        term bigint NOT NULL,
        holder text,
        since timestamptz,
        heartbeat_at timestamptz)""",
    "INSERT INTO inferd_leader (id, term) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
)


# -- the policy (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class LeaseSettings:
    # How often a follower tries the lock: the bound on failover once the
    # server has noticed the old leader's session is gone.
    retry_s: float = 0.5
    # How often the leader confirms its session and heartbeat.
    check_s: float = 1.0
    # How long one confirmation may take before the session counts as lost.
    check_timeout_s: float = 2.0
    # A heartbeat older than this, while the lock stays held elsewhere, is
    # reported (never acted on: only the lock decides who leads).
    stale_heartbeat_s: float = 30.0

    @property
    def lease_s(self) -> float:
        """The longest a leader goes on without a confirmed session."""
        return self.check_s + self.check_timeout_s


@dataclass(frozen=True)
class Leadership:
    """This instance's view of its own leadership."""

    term: int | None = None  # None: not leading
    confirmed_at: float | None = None  # clock of the last confirmed session

    @property
    def leading(self) -> bool:
        return self.term is not None


NOT_LEADING = Leadership()


def elected(term: int, now: float) -> Leadership:
    return Leadership(term=term, confirmed_at=now)


def confirmed(state: Leadership, now: float) -> Leadership:
    return replace(state, confirmed_at=now) if state.leading else state


def lease_holds(state: Leadership, now: float, settings: LeaseSettings) -> bool:
    """Whether this instance may still act as the leader at `now`."""
    if state.term is None or state.confirmed_at is None:
        return False
    return now - state.confirmed_at <= settings.lease_s


def fence_allows(writer_term: int, current_term: int) -> bool:
    """A leader write goes through only under the term it was elected with.
    An older term is a deposed leader; a newer one cannot be issued to a
    writer and means the caller is confused: refused as well."""
    return writer_term == current_term


def heartbeat_stale(
    heartbeat_age_s: float | None, lock_free: bool, settings: LeaseSettings
) -> bool:
    """A follower's alarm: the lock is held, yet the holder has not beaten
    for `stale_heartbeat_s` (a half-open connection the server has not yet
    dropped). The follower reports it and does not take over."""
    if lock_free or heartbeat_age_s is None:
        return False
    return heartbeat_age_s > settings.stale_heartbeat_s


# -- what others see -----------------------------------------------------------


@dataclass(frozen=True)
class LeaderInfo:
    """The `inferd_leader` row, as `GET /healthz` shows it."""

    term: int
    holder: str | None
    since: datetime | None
    heartbeat_at: datetime | None


class Deposed(Exception):
    """A leader write under a term that is no longer current."""

    def __init__(self, writer_term: int, current_term: int) -> None:
        super().__init__(
            f"leader term {writer_term} is over (current term {current_term}): write refused"
        )
        self.writer_term = writer_term
        self.current_term = current_term


class LeaderDuties(Protocol):
    """What the leader runs: started with the term on election, stopped the
    moment leadership ends (and again on shutdown; both idempotent)."""

    async def start(self, term: int) -> None: ...

    async def stop(self) -> None: ...


# -- PostgreSQL ----------------------------------------------------------------


async def ensure_schema(conn: Any) -> None:
    """Create the leader row if missing (`conn`: a psycopg AsyncConnection).
    Serialised by a transaction-scoped lock: instances starting together."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('inferd-migrate'))")
        for statement in SCHEMA_STATEMENTS:
            await conn.execute(statement)


@contextlib.asynccontextmanager
async def fenced(conn: Any, term: int) -> AsyncIterator[Any]:
    """A transaction on `conn` (a psycopg AsyncConnection) that commits only
    if `term` is still the current leader term. Raises `Deposed` before the
    body runs otherwise. Store writes made by the leader run inside it."""
    async with conn.transaction():
        cursor = await conn.execute(_TERM_FOR_SHARE)
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0
        if not fence_allows(term, current):
            raise Deposed(term, current)
        yield conn


_TERM_FOR_SHARE = "SELECT term FROM inferd_leader WHERE id = 1 FOR SHARE"


def check_term_sync(conn: Any, term: int) -> None:
    """The same check for a synchronous psycopg connection, to run first
    inside the store's own write transaction (a store on worker threads):
    `with conn.transaction(): check_term_sync(conn, term); <the write>`."""
    row = conn.execute(_TERM_FOR_SHARE).fetchone()
    current = int(row[0]) if row else 0
    if not fence_allows(term, current):
        raise Deposed(term, current)


async def read_leader(conn: Any) -> LeaderInfo | None:
    cursor = await conn.execute(
        "SELECT term, holder, since, heartbeat_at FROM inferd_leader WHERE id = 1"
    )
    row = await cursor.fetchone()
    if row is None:
        return None
    return LeaderInfo(term=int(row[0]), holder=row[1], since=row[2], heartbeat_at=row[3])


def connect_kwargs(instance_id: str, settings: LeaseSettings) -> dict[str, Any]:
    """The lock connection notices a dead peer through TCP keepalives and a
    user timeout, well inside the failover goal, instead of the kernel's
    default of hours."""
    return {
        "autocommit": True,
        "application_name": f"inferd-leader {instance_id}"[:63],
        "connect_timeout": max(1, int(settings.check_timeout_s)),
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
        "tcp_user_timeout": int(settings.lease_s * 1000),
    }


class PostgresElection:
    """Runs the election for one instance: tries the lock every `retry_s`,
    and while leading confirms the session every `check_s`. `duties` are
    started on election and stopped when the session cannot be confirmed."""

    def __init__(
        self,
        url: str,
        instance_id: str,
        duties: LeaderDuties,
        settings: LeaseSettings = LeaseSettings(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.instance_id = instance_id
        self.settings = settings
        self._duties = duties
        self._clock = clock
        self._conn: Any = None
        self._state = NOT_LEADING
        self._info: LeaderInfo | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()

    # -- state ---------------------------------------------------------------

    @property
    def term(self) -> int | None:
        """The term to fence writes with, while the lease holds."""
        state = self._state
        return state.term if lease_holds(state, self._clock(), self.settings) else None

    @property
    def leading(self) -> bool:
        return self.term is not None

    @property
    def info(self) -> LeaderInfo | None:
        """The leader row as last read (by a follower) or written (by us)."""
        return self._info

    async def wait_changed(self, timeout: float) -> None:
        """Returns when leadership was gained or lost, or after `timeout`."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        self._changed.clear()

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stops leading (duties first), then closes the lock session, which
        lets another instance take over at once."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._step_down("shutting down")
        await self._close()

    async def _run(self) -> None:
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
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)

    async def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            self._conn = await psycopg.AsyncConnection.connect(
                self.url, **connect_kwargs(self.instance_id, self.settings)
            )
            await ensure_schema(self._conn)
        return self._conn

    async def _try_acquire(self) -> None:
        conn = await self._connection()
        timeout = self.settings.check_timeout_s
        cursor = await asyncio.wait_for(
            conn.execute(f"SELECT pg_try_advisory_lock({LOCK_KEY_SQL})"), timeout
        )
        row = await cursor.fetchone()
        if not (row and row[0]):
            self._info = await asyncio.wait_for(read_leader(conn), timeout)
            age = await self._heartbeat_age(conn)
            if heartbeat_stale(age, lock_free=False, settings=self.settings):
                logger.warning(
                    "leader %s holds the lock but has not beaten for %.0fs",
                    self._info.holder if self._info else "?",
                    age,
                )
            return
        cursor = await asyncio.wait_for(
            conn.execute(
                "UPDATE inferd_leader SET term = term + 1, holder = %s, since = now(),"
                " heartbeat_at = now() WHERE id = 1"
                " RETURNING term, holder, since, heartbeat_at",
                (self.instance_id,),
            ),
            timeout,
        )
        row = await cursor.fetchone()
        term = int(row[0])
        self._info = LeaderInfo(term=term, holder=row[1], since=row[2], heartbeat_at=row[3])
        self._state = elected(term, self._clock())
        logger.info("%s leads (term %d)", self.instance_id, term)
        self._changed.set()
        try:
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
        conn = await self._connection()
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
        # The session may hold the lock still (a late confirmation, failed
        # duties): closing it is the one sure way to release it.
        await self._close()

    async def _step_down(self, why: str) -> None:
        if not self._state.leading:
            return
        logger.warning("%s stops leading (term %s): %s", self.instance_id, self._state.term, why)
        self._state = NOT_LEADING
        self._changed.set()
        try:
            await self._duties.stop()
        except Exception:
            logger.exception("stopping the leader duties failed")

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
