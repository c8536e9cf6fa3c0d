"""The one SQL core: transactions on worker threads, error mapping, the
change log and its feed, over a `Dialect` that knows the engine.

Every call runs on the database's own worker thread(s) (the drivers are
synchronous DB-API ones), so callers just `await`. A write is one
transaction: the repository's statements, then the change-log rows it named
(`Tx.changed`), committed together before its coroutine returns. A watcher
thread follows the change log (another process's writes included) and
publishes each row to the feed; where no other process can write (SQLite
`:memory:`), a commit publishes its own rows at once instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, TypeVar, cast

from inferd.control.model import Change, ChangeKind, StoreClosed, StoreError
from inferd.control.stores.feed import ChangeHub

logger = logging.getLogger(__name__)

T = TypeVar("T")
Row = tuple[Any, ...]

# Change-log rows kept for followers that fell behind; older ones go.
KEEP_CHANGES = 10_000
# How often the watcher looks for other processes' writes.
POLL_INTERVAL_S = 0.5


class Violation(StoreError):
    """A unique or foreign-key constraint refused a write. `where` names it
    as the engine does: SQLite `table.column` pairs, PostgreSQL the
    constraint's name (`table_column_key`)."""

    def __init__(self, unique: bool, where: Sequence[str]) -> None:
        super().__init__(f"{'unique' if unique else 'foreign key'} violation: {', '.join(where)}")
        self.unique = unique
        self.where = tuple(where)

    def involves(self, table: str, column: str) -> bool:
        return any(
            w == f"{table}.{column}" or w.startswith(f"{table}_{column}_") for w in self.where
        )


class Dialect(ABC):
    """What differs between the engines (`sqlite_dialect`, `postgres_dialect`);
    the defaults are an engine's that needs nothing done there."""

    name: str
    workers: int
    private: bool  # no other process writes: commits publish their own changes
    for_share = for_update = ""  # the row locks a SELECT may take
    encoders: dict[str, Callable[[Any], Any]]  # by storage kind (absent: as is)
    decoders: dict[str, Callable[[Any], Any]]

    def encode(self, storage: str, value: Any) -> Any:
        encode = self.encoders.get(storage)
        return value if encode is None or value is None else encode(value)

    def sql(self, text: str) -> Any:
        """`text` written with `?` placeholders, in the driver's form."""
        return text

    def fence(self, conn: Any, term: int | None) -> None:
        """Raise `Deposed` unless `term` is the leader's (None: any instance's write)."""
        return None

    def before_log(self, conn: Any) -> None:
        return None  # (what orders the change log's appends, where needed)

    def after_log(self, conn: Any, last_seq: int) -> None:
        return None  # (what tells the followers, where they are not poked)

    @abstractmethod
    def connection(self, write: bool) -> AbstractContextManager[Any]:
        """A connection in a transaction (for a write: an exclusive one),
        committed on exit; driver errors as `Violation`, `StoreUnavailable`."""

    @abstractmethod
    def migrating(self) -> AbstractContextManager[Any]:
        """One migration's transaction, exclusive across processes."""

    @abstractmethod
    def position(self, table: str) -> str:
        """The column that orders a table's rows by insertion."""

    @abstractmethod
    def starts_with(self, column: str, prefix: str) -> tuple[str, list[Any]]: ...
    @abstractmethod
    def follow(
        self, stop: threading.Event, poke: threading.Event, read: Callable[[Any], None]
    ) -> None:
        """Call `read(conn)` on a reading connection until `stop`: at once,
        after each `poke` or notification, and every POLL_INTERVAL_S."""

    @abstractmethod
    def quota_lock(self, project_id: str) -> AbstractAsyncContextManager[None]:
        """Serialises a project's quota checks across instances."""

    @abstractmethod
    def describe(self) -> str: ...
    @abstractmethod
    def close(self) -> None: ...


class Tx:
    """One transaction's connection, as repositories see it."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect
        self.changes: list[tuple[ChangeKind, str]] = []

    def execute(self, text: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self.dialect.sql(text), params)

    def one(self, text: str, params: Sequence[Any] = ()) -> Row | None:
        return cast("Row | None", self.execute(text, params).fetchone())

    def all(self, text: str, params: Sequence[Any] = ()) -> list[Row]:
        return cast("list[Row]", self.execute(text, params).fetchall())

    def count(self, text: str, params: Sequence[Any] = ()) -> int:
        """The rows a statement changed."""
        return int(self.execute(text, params).rowcount)

    def many(self, text: str, rows: Sequence[Sequence[Any]]) -> None:
        cursor = self.conn.cursor()
        try:
            cursor.executemany(self.dialect.sql(text), rows)
        finally:
            cursor.close()

    def changed(self, kind: ChangeKind, key: str = "") -> None:
        """Log this change with the write (published once committed)."""
        self.changes.append((kind, key))

    def fence(self, term: int | None) -> None:
        self.dialect.fence(self.conn, term)


class Database:
    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._executor = ThreadPoolExecutor(
            max_workers=dialect.workers, thread_name_prefix=f"inferd-{dialect.name}"
        )
        self._hub = ChangeHub()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._poke = threading.Event()
        self._watcher: threading.Thread | None = None
        self._cursor = self.call(False, _last_seq)

    # --- running statements -----------------------------------------------------------

    def call(self, write: bool, fn: Callable[[Tx], T]) -> T:
        """`fn` in one transaction, on this thread (a worker's or start-up's)."""
        with self.dialect.connection(write) as conn:
            tx = Tx(conn, self.dialect)
            result = fn(tx)
            if tx.changes:
                self._log(tx)
        if tx.changes:
            self._published(conn)
        return result

    async def read(self, fn: Callable[[Tx], T]) -> T:
        return await self._in_worker(functools.partial(self.call, False, fn))

    async def write(self, fn: Callable[[Tx], T]) -> T:
        return await self._in_worker(functools.partial(self.call, True, fn))

    async def rows(self, text: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self.read(lambda tx: tx.all(text, params))

    async def _in_worker(self, fn: Callable[[], T]) -> T:
        if self._closed.is_set():
            raise StoreClosed
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except RuntimeError:
            # The executor refuses new work once `close` has shut it down.
            if self._closed.is_set():
                raise StoreClosed from None
            raise

    # --- the change log and its feed ---------------------------------------------------

    def _log(self, tx: Tx) -> None:
        """Append to the change log, last thing before the commit."""
        self.dialect.before_log(tx.conn)
        last = 0
        for kind, key in tx.changes:
            row = tx.one(
                "INSERT INTO changes (kind, key) VALUES (?, ?) RETURNING seq", (kind.value, key)
            )
            assert row is not None
            last = int(row[0])
            if last % 1000 == 0:
                tx.execute("DELETE FROM changes WHERE seq <= ?", (last - KEEP_CHANGES,))
        self.dialect.after_log(tx.conn, last)

    def _published(self, conn: Any) -> None:
        if not self.dialect.private:
            self._poke.set()
            return
        if self._hub.subscribed:
            self.call(False, lambda tx: self._publish_new(tx.conn))

    def changes(self) -> AsyncIterator[Change]:
        subscription = self._hub.subscribe()
        with self._lock:
            if self._watcher is None and not self._closed.is_set() and not self.dialect.private:
                self._watcher = threading.Thread(
                    target=self.dialect.follow,
                    args=(self._closed, self._poke, self._publish_new),
                    name=f"inferd-{self.dialect.name}-changes",
                    daemon=True,
                )
                self._watcher.start()
            elif self.dialect.private:
                self._cursor = self.call(False, _last_seq)
        return subscription

    def _publish_new(self, conn: Any) -> None:
        with self._lock:
            tx = Tx(conn, self.dialect)
            rows = tx.all(
                "SELECT seq, kind, key FROM changes WHERE seq > ? ORDER BY seq", (self._cursor,)
            )
            if not rows:
                return
            if rows[0][0] > self._cursor + 1 and not self._continuous(tx):
                self._hub.publish(Change(ChangeKind.RESYNC))
            for seq, kind, key in rows:
                self._hub.publish(Change(ChangeKind(kind), key))
                self._cursor = int(seq)

    def _continuous(self, tx: Tx) -> bool:
        """A gap in sequence numbers is normal (a rolled-back write used one);
        changes were lost only if the log was pruned past our cursor."""
        row = tx.one("SELECT MIN(seq) FROM changes")
        oldest = int(row[0]) if row and row[0] is not None else 0
        return oldest <= self._cursor + 1 or self._cursor == 0

    # --- lifecycle ------------------------------------------------------------------------

    async def schema_version(self) -> int:
        row = (await self.rows("SELECT MAX(version) FROM schema_migrations"))[0]
        return int(row[0] or 0)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """`close` for callers without an event loop (start-up failures)."""
        self._closed.set()
        self._poke.set()
        self._hub.close()
        if self._watcher is not None:
            self._watcher.join(POLL_INTERVAL_S * 10)
        self._executor.shutdown(wait=True)
        self.dialect.close()


def _last_seq(tx: Tx) -> int:
    row = tx.one("SELECT COALESCE(MAX(seq), 0) FROM changes")
    return int(row[0]) if row else 0
