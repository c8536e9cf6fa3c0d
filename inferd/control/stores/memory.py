"""The in-memory store of tests: the SQL store on SQLite `:memory:`, so code
tested against it behaves as on SQLite and PostgreSQL (the contract suite
holds all three to the same rules). Nothing survives the process."""

from inferd.control.stores.sql.store import MemoryStore

__all__ = ["MemoryStore"]
