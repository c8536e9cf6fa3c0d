"""SQLite: the embedded default (a file), and the in-memory store of tests.

A file: WAL journal, `synchronous=FULL` (a commit that returned survives a
power cut), one connection used by one worker thread, writes in `BEGIN
IMMEDIATE`. Times are RFC 3339 text in UTC with milliseconds (fixed width:
text order is time order), JSON is text, and the rowid orders each table.
Instances sharing a file run on one machine: the quota lock is a `flock`
beside it, and the change log is followed by polling a second connection.
`:memory:` is one process's: commits publish their own changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from inferd.control.model import StoreError, StoreUnavailable, parse_rfc3339, rfc3339
from inferd.control.stores.sql.database import POLL_INTERVAL_S, Dialect, Violation
from inferd.control.stores.sql.migrations import migrate

logger = logging.getLogger(__name__)

# How long a quota check waits for another instance's before answering 503.
QUOTA_LOCK_TIMEOUT_S = 10.0
MEMORY = ":memory:"

_ENCODE: dict[str, Callable[[Any], Any]] = {
    "time": rfc3339,
    "json": lambda value: json.dumps(value, sort_keys=True),
}
_DECODE: dict[str, Callable[[Any], Any]] = {
    "time": parse_rfc3339,
    "json": json.loads,
    "bytes": bytes,
}


class SqliteDialect(Dialect):
    # No row locks: BEGIN IMMEDIATE already holds the write lock; writers
    # commit in the order they log, and the watcher is poked after the commit.
    encoders, decoders = _ENCODE, _DECODE
    name = "sqlite"
    workers = 1  # one connection; writes are serialised anyway
    # Instances on one SQLite file elect no leader: no term to fence.

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.private = str(path) == MEMORY
        self.conn = connect(path)
        self._lock = threading.RLock()
        self._quota_lock = asyncio.Lock()  # :memory: is one process's
        # Set by a test to act as a database that went away.
        self.unavailable = False

    @classmethod
    def open(cls, path: Path | str) -> SqliteDialect:
        """Open (creating if needed) the database at `path` (or `:memory:`)
        and migrate it."""
        if str(path) != MEMORY:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            dialect = cls(path)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite database {path}: {exc}") from exc
        try:
            # Foreign keys off while migrating: a migration that rebuilds a
            # table must not cascade its DROP to the rows referring to it.
            dialect.conn.execute("PRAGMA foreign_keys=OFF")
            migrate(dialect)
            dialect.conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            dialect.close()
            raise StoreError(f"cannot migrate the SQLite database {path}: {exc}") from exc
        except BaseException:
            dialect.close()
            raise
        if not dialect.private:
            with contextlib.suppress(OSError):
                Path(path).chmod(0o600)  # holds token digests: nobody else's to read
        return dialect

    @contextlib.contextmanager
    def connection(self, write: bool) -> Iterator[sqlite3.Connection]:
        if self.unavailable:
            raise StoreUnavailable("the in-memory store is marked unavailable")
        with self._lock:
            if not write:
                with _mapped():
                    yield self.conn
                return
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # locked past busy_timeout
                raise StoreUnavailable(str(exc)) from exc
            try:
                with _mapped():
                    yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            try:
                self.conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                self.conn.execute("ROLLBACK")
                raise StoreUnavailable(str(exc)) from exc

    @contextlib.contextmanager
    def migrating(self) -> Iterator[sqlite3.Connection]:
        """One migration's transaction, exclusive across processes."""
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def position(self, table: str) -> str:
        return "rowid"

    def starts_with(self, column: str, prefix: str) -> tuple[str, list[Any]]:
        # Not LIKE: it is case-insensitive in SQLite and treats % and _ as wildcards.
        return f"substr({column}, 1, ?) = ?", [len(prefix), prefix]

    def follow(
        self, stop: threading.Event, poke: threading.Event, read: Callable[[Any], None]
    ) -> None:
        """A read-only second connection, so that following never waits for a write."""
        conn = connect(self.path, read_only=True)
        try:
            while not stop.is_set():
                poke.wait(POLL_INTERVAL_S)
                poke.clear()
                try:
                    read(conn)
                except sqlite3.Error:
                    logger.exception("reading the SQLite change log failed; retrying")
        finally:
            conn.close()

    @contextlib.asynccontextmanager
    async def quota_lock(self, project_id: str) -> AsyncIterator[None]:
        """Instances sharing this file run on one machine: an exclusive
        `flock` on a file beside it serialises their quota checks (one lock
        for every project: creates are rare). Closing the file releases it,
        also when the process dies."""
        if self.private:
            async with self._quota_lock:
                yield
            return
        fd = os.open(f"{self.path}.quota-lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            deadline = time.monotonic() + QUOTA_LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreUnavailable("another instance holds the quota lock") from None
                    await asyncio.sleep(0.01)
            yield
        finally:
            os.close(fd)

    def describe(self) -> str:
        return "memory (nothing is kept after exit)" if self.private else str(self.path)

    def pragma(self, name: str) -> Any:
        with self._lock:
            return self.conn.execute(f"PRAGMA {name}").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self.conn.close()


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except sqlite3.IntegrityError as exc:
        # SQLite has no per-constraint code: the message names the columns.
        name = exc.sqlite_errorname
        if name in ("SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY"):
            where = str(exc).partition(":")[2].split(",")
            raise Violation(True, [w.strip() for w in where]) from exc
        if name == "SQLITE_CONSTRAINT_FOREIGNKEY":
            raise Violation(False, []) from exc
        raise


def connect(path: Path | str, *, read_only: bool = False) -> sqlite3.Connection:
    # isolation_level=None: autocommit; transactions are explicit.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        if not read_only and str(path) != MEMORY:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: cannot switch to WAL journal (got {mode})")
        # FULL: the WAL is fsynced at every commit, so a commit that
        # returned survives power loss, not only a process crash.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
    except BaseException:
        conn.close()
        raise
    return conn
