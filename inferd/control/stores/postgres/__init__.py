"""The PostgreSQL store (psycopg 3 with a connection pool)."""

from inferd.control.stores.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
