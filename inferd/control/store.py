"""SQLite store of the control plane: endpoints, their tokens, admin keys.

One file, WAL journal, `synchronous=FULL`: every method that writes has
committed and fsynced before it returns, so an answer the API sent survives
a SIGKILL or a power cut. One connection guarded by a lock; calls are short
and synchronous, and async callers run writes in a worker thread (see
`inferd.control.service`). Columns hold plain values only (no pickles).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from inferd.control.accounts.sqlite import SqliteAccounts
from inferd.control.migrations import migrate


def utc_now_text() -> str:
    """RFC 3339 UTC timestamp with milliseconds, as stored and as served."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class EndpointRow:
    """One endpoint as stored (settings only; replicas live elsewhere)."""

    id: str
    name: str
    model_name: str
    model_kind: str
    gpu_type: str
    gpu_count: int
    location_name: str
    min_replicas: int
    max_replicas: int
    retention_seconds: int
    hourly_price: float
    currency: str
    created_at: str
    updated_at: str
    deleting_at: str | None = None
    generation: int = 1
    project_id: str = "default"


_ENDPOINT_COLUMNS = tuple(f.name for f in fields(EndpointRow))
_SELECT_ENDPOINT = f"SELECT {', '.join(_ENDPOINT_COLUMNS)} FROM endpoints"
# Columns PATCH-like updates may change.
UPDATABLE = frozenset(
    {
        "min_replicas",
        "max_replicas",
        "retention_seconds",
        "gpu_type",
        "gpu_count",
        "hourly_price",
        "currency",
        "generation",
        "updated_at",
    }
)


@dataclass(frozen=True)
class ReplicaRow:
    """One replica as stored: enough to adopt it after a restart."""

    id: str
    endpoint_id: str
    generation: int
    gpu_type: str
    gpu_count: int
    gpu_ids: str  # comma-separated physical indices; "" on CPU
    pid: int
    secret_hash: bytes
    status: str
    reason: str | None
    url: str | None
    created_at: str
    updated_at: str

    def gpu_id_tuple(self) -> tuple[int, ...]:
        return tuple(int(i) for i in self.gpu_ids.split(",") if i)


_REPLICA_COLUMNS = tuple(f.name for f in fields(ReplicaRow))


class DuplicateName(Exception):
    """Another endpoint already has this name."""


class StoreError(RuntimeError):
    """The database could not be opened or is not in WAL mode."""


class Store(SqliteAccounts):
    def __init__(self, conn: sqlite3.Connection, path: Path | None) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, now: Callable[[], str] = utc_now_text) -> Store:
        """Open (creating if needed) the database at `path` and migrate it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit; transactions are explicit below.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: cannot switch to WAL journal (got {mode})")
            # FULL: the WAL is fsynced at every commit, so a commit that
            # returned survives power loss, not only a process crash.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            # Foreign keys on only after migrating: a migration that rebuilds
            # a table must not cascade its DROP to the rows that refer to it.
            migrate(conn, now)
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        with contextlib.suppress(OSError):
            path.chmod(0o600)  # holds token digests; no reason for others to read it
        return cls(conn, path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # --- introspection -------------------------------------------------------------

    def schema_version(self) -> int:
        rows = self._query("SELECT MAX(version) FROM schema_migrations")
        return int(rows[0][0] or 0)

    def pragma(self, name: str) -> Any:
        return self._query(f"PRAGMA {name}")[0][0]

    def integrity_check(self) -> str:
        return str(self.pragma("integrity_check"))

    # --- endpoints -------------------------------------------------------------------

    def insert_endpoint(self, row: EndpointRow, token_hash: bytes) -> None:
        """Insert the endpoint and its first token in one transaction."""
        placeholders = ", ".join("?" for _ in _ENDPOINT_COLUMNS)
        try:
            with self._tx() as conn:
                conn.execute(
                    f"INSERT INTO endpoints ({', '.join(_ENDPOINT_COLUMNS)}) "
                    f"VALUES ({placeholders})",
                    tuple(getattr(row, c) for c in _ENDPOINT_COLUMNS),
                )
                conn.execute(
                    "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at)"
                    " VALUES (?, ?, ?)",
                    (row.id, token_hash, row.created_at),
                )
        except sqlite3.IntegrityError as exc:
            if "endpoints.project_id, endpoints.name" in str(exc):
                raise DuplicateName(row.name) from None
            raise

    def get_endpoint(self, endpoint_id: str) -> EndpointRow | None:
        rows = self._query(_SELECT_ENDPOINT + " WHERE id = ?", (endpoint_id,))
        return EndpointRow(*rows[0]) if rows else None

    def list_endpoints(self) -> list[EndpointRow]:
        return [EndpointRow(*r) for r in self._query(_SELECT_ENDPOINT + " ORDER BY rowid")]

    def update_endpoint(self, endpoint_id: str, **changes: Any) -> EndpointRow:
        """Apply `changes` (column -> value); KeyError if the endpoint is gone."""
        bad = set(changes) - UPDATABLE
        if bad:
            raise ValueError(f"not updatable: {sorted(bad)}")
        with self._tx() as conn:
            row = conn.execute(_SELECT_ENDPOINT + " WHERE id = ?", (endpoint_id,)).fetchone()
            if row is None:
                raise KeyError(endpoint_id)
            if changes:
                assignments = ", ".join(f"{c} = ?" for c in changes)
                conn.execute(
                    f"UPDATE endpoints SET {assignments} WHERE id = ?",
                    (*changes.values(), endpoint_id),
                )
        return replace(EndpointRow(*row), **changes)

    def mark_deleting(self, endpoint_id: str, at: str) -> EndpointRow:
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE endpoints SET deleting_at = COALESCE(deleting_at, ?), updated_at = ?"
                " WHERE id = ?",
                (at, at, endpoint_id),
            )
            if cur.rowcount == 0:
                raise KeyError(endpoint_id)
            row = conn.execute(_SELECT_ENDPOINT + " WHERE id = ?", (endpoint_id,)).fetchone()
        return EndpointRow(*row)

    def delete_endpoint(self, endpoint_id: str) -> bool:
        """Remove the endpoint and (by cascade) its tokens; False if it was not there."""
        with self._tx() as conn:
            cur = conn.execute("DELETE FROM endpoints WHERE id = ?", (endpoint_id,))
            return cur.rowcount > 0

    # --- endpoint tokens ---------------------------------------------------------------

    def replace_token(self, endpoint_id: str, token_hash: bytes, at: str) -> None:
        """Revoke the active token and store the new one in the same transaction."""
        with self._tx() as conn:
            exists = conn.execute(
                "SELECT 1 FROM endpoints WHERE id = ? AND deleting_at IS NULL", (endpoint_id,)
            ).fetchone()
            if exists is None:
                raise KeyError(endpoint_id)
            conn.execute(
                "UPDATE endpoint_tokens SET revoked_at = ?"
                " WHERE endpoint_id = ? AND revoked_at IS NULL",
                (at, endpoint_id),
            )
            conn.execute(
                "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at)"
                " VALUES (?, ?, ?)",
                (endpoint_id, token_hash, at),
            )

    def active_token_hashes(self) -> dict[str, bytes]:
        rows = self._query(
            "SELECT t.endpoint_id, t.token_hash FROM endpoint_tokens t"
            " JOIN endpoints e ON e.id = t.endpoint_id"
            " WHERE t.revoked_at IS NULL AND e.deleting_at IS NULL"
        )
        return {endpoint_id: bytes(digest) for endpoint_id, digest in rows}

    # --- admin keys --------------------------------------------------------------------

    def admin_key_hashes(self) -> list[bytes]:
        rows = self._query("SELECT key_hash FROM admin_keys WHERE revoked_at IS NULL ORDER BY id")
        return [bytes(r[0]) for r in rows]

    def add_admin_key(self, key_hash: bytes, at: str, *, revoke_others: bool = False) -> None:
        with self._tx() as conn:
            if revoke_others:
                conn.execute("UPDATE admin_keys SET revoked_at = ? WHERE revoked_at IS NULL", (at,))
            conn.execute(
                "INSERT INTO admin_keys (key_hash, created_at) VALUES (?, ?)", (key_hash, at)
            )

    # --- replicas -------------------------------------------------------------------------

    def insert_replica(self, row: ReplicaRow) -> None:
        placeholders = ", ".join("?" for _ in _REPLICA_COLUMNS)
        with self._tx() as conn:
            conn.execute(
                f"INSERT INTO replicas ({', '.join(_REPLICA_COLUMNS)}) VALUES ({placeholders})",
                tuple(getattr(row, c) for c in _REPLICA_COLUMNS),
            )

    def update_replica(
        self, replica_id: str, *, status: str, reason: str | None, url: str | None, at: str
    ) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE replicas SET status = ?, reason = ?, url = ?, updated_at = ? WHERE id = ?",
                (status, reason, url, at, replica_id),
            )

    def delete_replica(self, replica_id: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))

    def list_replicas(self) -> list[ReplicaRow]:
        rows = self._query(f"SELECT {', '.join(_REPLICA_COLUMNS)} FROM replicas ORDER BY rowid")
        return [
            ReplicaRow(*row[:7], bytes(row[7]), *row[8:])  # type: ignore[call-arg]
            for row in rows
        ]

    # --- meta --------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
