"""The SQLite store (embedded default); the only place `sqlite3` is used."""

from inferd.control.stores.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
