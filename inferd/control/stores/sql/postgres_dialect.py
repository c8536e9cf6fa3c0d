"""PostgreSQL: several control planes, one database. A `psycopg_pool` pool
whose connections are checked before they are lent; an unreachable server
is `StoreUnavailable` (503). TIMESTAMPTZ, JSONB, an identity `seq` orders
each table. The change log is appended under one advisory lock (sequence
order is commit order) with a NOTIFY; the watcher LISTENs and reads the log
at each notification and every POLL_INTERVAL_S (NOTIFY has no replay)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from inferd.control.model import Deposed, StoreUnavailable, fence_allows
from inferd.control.stores.sql.database import POLL_INTERVAL_S, Dialect, Violation
from inferd.control.stores.sql.migrations import migrate
from inferd.redact import redact_url

logger = logging.getLogger(__name__)

CHANNEL = "inferd_changes"
# pg_advisory_xact_lock keys: any constants shared by every inferd.
MIGRATION_LOCK = 0x1F_E7D0_0001
CHANGES_LOCK = 0x1F_E7D0_0002
CONNECT_TIMEOUT_S = 3
# How long a call waits for a pooled connection before answering 503.
ACQUIRE_TIMEOUT_S = 3.0
POOL_SIZE = 4
# How long a quota check waits for another instance's before answering 503.
QUOTA_LOCK_TIMEOUT: LiteralString = "SET LOCAL lock_timeout = '10s'"
# The leader row stays FOR SHARE until the write commits, so the next
# leader's term cannot be issued while a deposed leader's write is under way.
TERM_FOR_SHARE: LiteralString = "SELECT term FROM inferd_leader WHERE id = 1 FOR SHARE"

_ENCODE: dict[str, Callable[[Any], Any]] = {"json": Jsonb}
_DECODE: dict[str, Callable[[Any], Any]] = {
    "time": lambda value: value.astimezone(UTC),
    "json": lambda value: json.loads(value) if isinstance(value, str) else value,
    "bytes": bytes,
}
# Tables without an identity column are listed in key order.
_KEY_ORDER = {"model_profiles": "model_name, gpu_type, gpu_count"}


def quota_lock_key(project_id: str) -> int:
    """A project's quota lock key: a signed 64-bit digest, prefixed apart."""
    digest = hashlib.blake2b(f"inferd-quota:{project_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def check_term_sync(conn: Any, term: int) -> None:
    """Raises `Deposed` unless `term` is the leader's, first inside a write's
    own transaction on a synchronous connection (see TERM_FOR_SHARE)."""
    row = conn.execute(TERM_FOR_SHARE).fetchone()
    current = int(row[0]) if row else 0
    if not fence_allows(term, current):
        raise Deposed(term, current)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class PostgresDialect(Dialect):
    encoders, decoders = _ENCODE, _DECODE
    name = "postgres"
    workers = POOL_SIZE
    private = False
    for_share = " FOR SHARE"
    for_update = " FOR UPDATE"

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.first = psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot reach PostgreSQL at {redact_url(url)}: {first_line(exc)}"
            ) from exc
        self.pool: ConnectionPool | None = None

    @classmethod
    def open(cls, url: str) -> PostgresDialect:
        """Connect, migrate (under the migration lock) and open the pool.
        `StoreUnavailable` if the server cannot be reached."""
        dialect = cls(url)
        try:
            migrate(dialect)
            dialect._open_pool()
        except BaseException:
            dialect.close()
            raise
        return dialect

    def _open_pool(self) -> None:
        self.first.close()  # it migrated
        pool = ConnectionPool(
            self.url, min_size=1, max_size=POOL_SIZE, open=False,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S},
            check=ConnectionPool.check_connection, timeout=ACQUIRE_TIMEOUT_S, name="inferd",
        )  # fmt: skip
        try:
            pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        except PoolTimeout as exc:
            pool.close()
            raise StoreUnavailable(f"cannot reach PostgreSQL at {redact_url(self.url)}") from exc
        self.pool = pool

    def sql(self, text: str) -> LiteralString:
        return _converted(text)

    @contextlib.contextmanager
    def connection(self, write: bool) -> Iterator[psycopg.Connection]:
        assert self.pool is not None
        try:
            with self.pool.connection() as conn, conn.transaction():
                yield conn
        except PoolTimeout as exc:
            raise StoreUnavailable("no database connection") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # Lost mid-call (server restart, network): it did not commit.
            raise StoreUnavailable(first_line(exc)) from exc
        except psycopg.errors.UniqueViolation as exc:
            raise Violation(True, [exc.diag.constraint_name or ""]) from exc
        except psycopg.errors.ForeignKeyViolation as exc:
            raise Violation(False, [exc.diag.constraint_name or ""]) from exc

    @contextlib.contextmanager
    def migrating(self) -> Iterator[psycopg.Connection]:
        """One migration's transaction; the lock makes several instances
        starting at once apply each migration once."""
        with self.first.transaction():
            self.first.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            yield self.first

    def position(self, table: str) -> str:
        return _KEY_ORDER.get(table, "seq")

    def starts_with(self, column: str, prefix: str) -> tuple[str, list[Any]]:
        return f"starts_with({column}, ?)", [prefix]  # not LIKE: % and _ are plain

    def fence(self, conn: Any, term: int | None) -> None:
        if term is not None:
            check_term_sync(conn, term)

    def before_log(self, conn: Any) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (CHANGES_LOCK,))

    def after_log(self, conn: Any, last_seq: int) -> None:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(last_seq)))

    def follow(
        self, stop: threading.Event, poke: threading.Event, read: Callable[[Any], None]
    ) -> None:
        conn: psycopg.Connection | None = None
        backoff = POLL_INTERVAL_S
        while not stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(
                        self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                    )
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    if backoff > POLL_INTERVAL_S:
                        logger.info("change feed: reconnected to PostgreSQL")
                    backoff = POLL_INTERVAL_S
                # Read first: what was committed before LISTEN took effect,
                # or while the connection was down, is in the log.
                read(conn)
                for _ in conn.notifies(timeout=POLL_INTERVAL_S, stop_after=1):
                    pass
            except psycopg.Error as exc:
                if conn is not None:
                    conn.close()
                    conn = None
                    logger.warning("change feed: lost PostgreSQL (%s); polling", first_line(exc))
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if conn is not None:
            conn.close()

    @contextlib.asynccontextmanager
    async def quota_lock(self, project_id: str) -> AsyncIterator[None]:
        """A session advisory lock per project, on a connection held from the
        check to the end of the write (the write commits on another one). A
        holder whose connection dies loses the lock with it."""
        key = quota_lock_key(project_id)
        conn = await asyncio.to_thread(self._hold_lock, key)
        try:
            yield
        finally:
            await asyncio.to_thread(self._release_lock, conn, key)

    def _hold_lock(self, key: int) -> psycopg.Connection:
        assert self.pool is not None
        try:
            conn = self.pool.getconn(timeout=ACQUIRE_TIMEOUT_S)
        except PoolTimeout as exc:
            raise StoreUnavailable("no database connection") from exc
        try:
            with conn.transaction():
                conn.execute(QUOTA_LOCK_TIMEOUT)
                conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.Error as exc:
            self.pool.putconn(conn)
            raise StoreUnavailable(first_line(exc)) from exc
        return conn

    def _release_lock(self, conn: psycopg.Connection, key: int) -> None:
        assert self.pool is not None
        try:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            conn.commit()
        except psycopg.Error:
            pass  # the connection is gone, and the server let the lock go with it
        finally:
            self.pool.putconn(conn)

    def describe(self) -> str:
        return redact_url(self.url)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        self.first.close()


@functools.lru_cache(maxsize=4096)  # the statements are a fixed set
def _converted(text: str) -> LiteralString:
    """`?` placeholders as psycopg's `%s` (the store's SQL has no `%` of its own)."""
    return text.replace("%", "%%").replace("?", "%s")
