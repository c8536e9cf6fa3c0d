"""The control plane's store: every repository over one `Database`.

`SqlStore` is the union the composition root hands out (`Store`); each
consumer takes the narrow port of one repository. The openers choose the
engine: a SQLite file, SQLite `:memory:` (tests) or PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from inferd.control.model import Change
from inferd.control.stores.sql.accounts import Accounts
from inferd.control.stores.sql.adapters import Adapters
from inferd.control.stores.sql.admin_keys import AdminKeys
from inferd.control.stores.sql.batches import Batches
from inferd.control.stores.sql.database import Database, Row
from inferd.control.stores.sql.endpoints import ClientTokens, Endpoints
from inferd.control.stores.sql.models import Models
from inferd.control.stores.sql.rate_limits import RateLimitBuckets
from inferd.control.stores.sql.replicas import Replicas
from inferd.control.stores.sql.sqlite_dialect import MEMORY, SqliteDialect


class SqlStore(
    Endpoints,
    ClientTokens,
    RateLimitBuckets,
    Replicas,
    Adapters,
    Models,
    Accounts,
    AdminKeys,
    Batches,
):
    """Everything the control plane keeps, in one database."""

    def describe(self) -> str:
        """Where the state lives, for people (no password)."""
        return self._dialect.describe()

    def changes(self) -> AsyncIterator[Change]:
        return self._db.changes()

    async def schema_version(self) -> int:
        return await self._db.schema_version()

    async def close(self) -> None:
        await self._db.close()

    def close_sync(self) -> None:
        """`close` for callers without an event loop (start-up failures)."""
        self._db.close_sync()


class SqliteStore(SqlStore):
    """A SQLite file: the embedded default."""

    def __init__(self, db: Database, path: Path) -> None:
        super().__init__(db)
        self.path = path

    @classmethod
    def open(cls, path: Path | str) -> SqliteStore:
        return cls(Database(SqliteDialect.open(path)), Path(path))

    def pragma(self, name: str) -> object:
        return self._sqlite.pragma(name)

    def integrity_check(self) -> str:
        return str(self.pragma("integrity_check"))

    # For tests that look at the file itself (what is stored, the triggers).
    def _query(self, text: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._db.call(False, lambda tx: tx.all(text, params))

    def _tx(self) -> AbstractContextManager[Any]:
        return self._sqlite.connection(True)

    @property
    def _sqlite(self) -> SqliteDialect:
        assert isinstance(self._dialect, SqliteDialect)
        return self._dialect


class MemoryStore(SqlStore):
    """SQLite `:memory:`, for tests: the same repositories, kept by nobody
    after the process. `unavailable`: set by a test to act as a database
    that went away (every call raises `StoreUnavailable` until cleared)."""

    def __init__(self) -> None:
        self._sqlite = SqliteDialect.open(MEMORY)
        super().__init__(Database(self._sqlite))

    @property
    def unavailable(self) -> bool:
        return self._sqlite.unavailable

    @unavailable.setter
    def unavailable(self, value: bool) -> None:
        self._sqlite.unavailable = value


class PostgresStore(SqlStore):
    """A PostgreSQL database: several control planes share it."""

    @classmethod
    def open(cls, url: str) -> PostgresStore:
        from inferd.control.stores.sql.postgres_dialect import PostgresDialect

        return cls(Database(PostgresDialect.open(url)))
