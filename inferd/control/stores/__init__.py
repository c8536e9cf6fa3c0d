"""Store adapters of the control plane (see `inferd.control.ports`).

`open_store(database_url)` picks one: `sqlite:///path` (the embedded
default), `postgresql://...`, or `memory://` (tests).
"""

from __future__ import annotations

from inferd.control.model import StoreError
from inferd.control.ports import Store
from inferd.redact import redact_url

__all__ = ["open_store", "redact_url", "sqlite_path"]


def open_store(database_url: str) -> Store:
    """Open (and migrate) the store at `database_url`; blocking, for start-up.

    Raises `StoreError` for a URL it does not understand, `StoreUnavailable`
    when the database cannot be reached.
    """
    scheme = database_url.partition(":")[0].lower()
    from inferd.control.stores.sql.store import MemoryStore, PostgresStore, SqliteStore

    if scheme == "sqlite":
        return SqliteStore.open(sqlite_path(database_url))
    if scheme in ("postgresql", "postgres"):
        return PostgresStore.open(database_url)
    if scheme == "memory":
        return MemoryStore()
    raise StoreError(
        f"unsupported database URL {redact_url(database_url)!r}: "
        "use sqlite:///path/to/inferd.db or postgresql://user@host/db"
    )


def sqlite_path(database_url: str) -> str:
    """The file of a SQLite URL, SQLAlchemy's form: `sqlite:///inferd.db` is
    relative to the working directory, `sqlite:////var/lib/inferd.db` absolute."""
    prefix = "sqlite:///"
    if not database_url.startswith(prefix) or len(database_url) == len(prefix):
        raise StoreError(f"a SQLite URL reads sqlite:///path, not {database_url!r}")
    return database_url[len(prefix) :]
