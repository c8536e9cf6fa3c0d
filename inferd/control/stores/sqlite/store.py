"""SQLite store of the control plane: the embedded default.

One file, WAL journal, `synchronous=FULL`: every write has committed and
fsynced before its coroutine returns, so an answer the API sent survives a
SIGKILL or a power cut. One connection, used only by the store's own worker
thread, so callers just `await` and the fsync of a commit never stalls the
event loop. Columns hold plain values only (no pickles); times are RFC 3339
text in UTC with milliseconds.

Each write also appends to the `changes` table in its transaction; a
watcher thread (started by the first `changes()` subscription) follows that
table, so a second process writing the same file is seen too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from inferd.api.engine_settings import EngineSettings
from inferd.catalog.registered import DuplicateModel, MeasuredProfile, RegisteredModel
from inferd.control.accounts.quota import EndpointShape
from inferd.control.accounts.sqlite import SqliteAccounts
from inferd.control.model import (
    Adapter,
    AdapterUsage,
    Change,
    ChangeKind,
    DuplicateAdapter,
    DuplicateName,
    Endpoint,
    EndpointChanges,
    EndpointGone,
    ReplicaRecord,
    StoreError,
    StoreUnavailable,
    parse_rfc3339,
    rfc3339,
    utc_now_text,
)
from inferd.control.paging import EndpointFilter, Page, page_of
from inferd.control.stores.feed import ChangeHub
from inferd.control.stores.sqlite.migrations import migrate

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ENDPOINT_COLUMNS = (
    "id", "name", "model_name", "model_kind", "gpu_type", "gpu_count", "location_name",
    "min_replicas", "max_replicas", "retention_seconds", "hourly_price", "currency",
    "created_at", "updated_at", "deleting_at", "generation", "project_id", "engine_settings",
)  # fmt: skip
_SELECT_ENDPOINT = f"SELECT {', '.join(_ENDPOINT_COLUMNS)} FROM endpoints"
_REPLICA_COLUMNS = (
    "id", "endpoint_id", "generation", "gpu_type", "gpu_count", "secret_hash", "status",
    "created_at", "updated_at", "node", "placement", "reason", "url",
)  # fmt: skip
# Change-log rows kept for followers that fell behind; older ones go.
KEEP_CHANGES = 10_000
# How often the watcher looks for other processes' writes.
POLL_INTERVAL_S = 0.5
# How long a quota check waits for another instance's before answering 503.
QUOTA_LOCK_TIMEOUT_S = 10.0


def _endpoint(row: tuple[Any, ...]) -> Endpoint:
    values = dict(zip(_ENDPOINT_COLUMNS, row, strict=True))
    for key in ("created_at", "updated_at"):
        values[key] = parse_rfc3339(values[key])
    if values["deleting_at"] is not None:
        values["deleting_at"] = parse_rfc3339(values["deleting_at"])
    values["engine_settings"] = EngineSettings.from_json(values["engine_settings"])
    return Endpoint(**values)


def _endpoint_conditions(where: EndpointFilter, after: int | None) -> tuple[list[str], list[Any]]:
    """The WHERE clauses (and their parameters) of a page of endpoints;
    the rowid is the position (the endpoint's primary key index orders it)."""
    conditions: list[str] = []
    params: list[Any] = []
    if after is not None:
        conditions.append("rowid > ?")
        params.append(after)
    if where.project_ids is not None:
        conditions.append(f"project_id IN ({', '.join('?' for _ in where.project_ids)})")
        params.extend(sorted(where.project_ids))
    if where.model_name is not None:
        conditions.append("model_name = ?")
        params.append(where.model_name)
    if where.location_name is not None:
        conditions.append("location_name = ?")
        params.append(where.location_name)
    if where.name_prefix is not None:
        # Not LIKE: it is case-insensitive in SQLite and treats % and _ as wildcards.
        conditions.append("substr(name, 1, ?) = ?")
        params.extend([len(where.name_prefix), where.name_prefix])
    return conditions, params


def _column_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, EngineSettings):
        return value.to_json()
    return value


def _endpoint_values(endpoint: Endpoint) -> tuple[Any, ...]:
    return tuple(_column_value(getattr(endpoint, column)) for column in _ENDPOINT_COLUMNS)


def _replica(row: tuple[Any, ...]) -> ReplicaRecord:
    values = dict(zip(_REPLICA_COLUMNS, row, strict=True))
    values["secret_hash"] = bytes(values["secret_hash"])
    values["created_at"] = parse_rfc3339(values["created_at"])
    values["updated_at"] = parse_rfc3339(values["updated_at"])
    values["placement"] = json.loads(values["placement"])
    return ReplicaRecord(**values)


def _replica_values(record: ReplicaRecord) -> tuple[Any, ...]:
    values = []
    for column in _REPLICA_COLUMNS:
        value = getattr(record, column)
        if isinstance(value, datetime):
            value = rfc3339(value)
        elif column == "placement":
            value = json.dumps(dict(value), sort_keys=True)
        values.append(value)
    return tuple(values)


class SqliteStore(SqliteAccounts):
    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        self._lock = threading.RLock()
        # One thread: the connection is used by one thread at a time, and
        # writes are serialised anyway.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferd-sqlite")
        self._hub = ChangeHub()
        self._cursor = self._last_seq()
        self._watcher: threading.Thread | None = None
        self._poke = threading.Event()
        self._closed = threading.Event()

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, now: Callable[[], str] = utc_now_text) -> SqliteStore:
        """Open (creating if needed) the database at `path` and migrate it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = _connect(path)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite database {path}: {exc}") from exc
        try:
            # Foreign keys off while migrating: a migration that rebuilds a
            # table must not cascade its DROP to the rows referring to it.
            conn.execute("PRAGMA foreign_keys=OFF")
            migrate(conn, now)
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot migrate the SQLite database {path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        with contextlib.suppress(OSError):
            path.chmod(0o600)  # holds token digests; no reason for others to read it
        return cls(conn, path)

    def describe(self) -> str:
        return str(self.path)

    async def close(self) -> None:
        self._closed.set()
        self._poke.set()
        self._hub.close()
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.join, 5)
        await self._run(self._conn.close)
        self._executor.shutdown(wait=True)

    def close_sync(self) -> None:
        """`close` for callers without an event loop (start-up failures)."""
        self._closed.set()
        self._poke.set()
        self._hub.close()
        self._executor.shutdown(wait=True)
        self._conn.close()

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # locked past busy_timeout
                raise StoreUnavailable(str(exc)) from exc
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                self._conn.execute("ROLLBACK")
                raise StoreUnavailable(str(exc)) from exc
        self._poke.set()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @staticmethod
    def _log(conn: sqlite3.Connection, kind: ChangeKind, key: str = "") -> None:
        seq = conn.execute(
            "INSERT INTO changes (kind, key) VALUES (?, ?) RETURNING seq", (kind.value, key)
        ).fetchone()[0]
        if seq % 1000 == 0:
            conn.execute("DELETE FROM changes WHERE seq <= ?", (seq - KEEP_CHANGES,))

    # --- SQLite-only extras ----------------------------------------------------------

    async def schema_version(self) -> int:
        rows = await self._run(self._query, "SELECT MAX(version) FROM schema_migrations")
        return int(rows[0][0] or 0)

    def pragma(self, name: str) -> Any:
        return self._query(f"PRAGMA {name}")[0][0]

    def integrity_check(self) -> str:
        return str(self.pragma("integrity_check"))

    # --- endpoints -------------------------------------------------------------------

    async def insert_endpoint(self, endpoint: Endpoint, token_hash: bytes) -> None:
        await self._run(self._insert_endpoint, endpoint, token_hash)

    def _insert_endpoint(self, endpoint: Endpoint, token_hash: bytes) -> None:
        placeholders = ", ".join("?" for _ in _ENDPOINT_COLUMNS)
        try:
            with self._tx() as conn:
                conn.execute(
                    f"INSERT INTO endpoints ({', '.join(_ENDPOINT_COLUMNS)}) "
                    f"VALUES ({placeholders})",
                    _endpoint_values(endpoint),
                )
                conn.execute(
                    "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at)"
                    " VALUES (?, ?, ?)",
                    (endpoint.id, token_hash, rfc3339(endpoint.created_at)),
                )
                self._log(conn, ChangeKind.ENDPOINT, endpoint.id)
                self._log(conn, ChangeKind.TOKEN, endpoint.id)
        except sqlite3.IntegrityError as exc:
            # SQLite has no per-constraint code: a UNIQUE failure names the column.
            if exc.sqlite_errorname == "SQLITE_CONSTRAINT_UNIQUE" and "endpoints.name" in str(exc):
                raise DuplicateName(endpoint.name) from None
            raise

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        rows = await self._run(self._query, _SELECT_ENDPOINT + " WHERE id = ?", (endpoint_id,))
        return _endpoint(rows[0]) if rows else None

    async def list_endpoints(self) -> list[Endpoint]:
        rows = await self._run(self._query, _SELECT_ENDPOINT + " ORDER BY rowid")
        return [_endpoint(r) for r in rows]

    async def page_endpoint_ids(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[str]:
        if where.selects_nothing():
            return Page([], None)
        conditions, params = _endpoint_conditions(where, after)
        query = (
            "SELECT rowid, id FROM endpoints"
            f"{' WHERE ' + ' AND '.join(conditions) if conditions else ''}"
            " ORDER BY rowid LIMIT ?"
        )
        rows = await self._run(self._query, query, (*params, limit + 1))
        return page_of([(int(r[0]), str(r[1])) for r in rows], limit)

    @contextlib.asynccontextmanager
    async def quota_lock(self, project_id: str) -> AsyncIterator[None]:
        """Instances sharing this file run on one machine: an exclusive
        `flock` on a file beside it serialises their quota checks (one lock
        for every project: creates are rare). Closing the file releases it,
        also when the process dies."""
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

    async def count_endpoints(self, project_id: str) -> int:
        rows = await self._run(
            self._query, "SELECT count(*) FROM endpoints WHERE project_id = ?", (project_id,)
        )
        return int(rows[0][0])

    async def quota_shapes(self, project_id: str) -> list[EndpointShape]:
        rows = await self._run(
            self._query,
            "SELECT id, gpu_type, gpu_count, min_replicas FROM endpoints"
            " WHERE project_id = ? AND deleting_at IS NULL",
            (project_id,),
        )
        return [EndpointShape(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    async def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> Endpoint:
        return await self._run(self._update_endpoint, endpoint_id, changes)

    def _update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> Endpoint:
        values: dict[str, Any] = {
            **{k: _column_value(v) for k, v in changes.settings().items()},
            "updated_at": rfc3339(changes.updated_at),
        }
        with self._tx() as conn:
            assignments = ", ".join(f"{c} = ?" for c in values)
            conn.execute(
                f"UPDATE endpoints SET {assignments} WHERE id = ?",
                (*values.values(), endpoint_id),
            )
            row = conn.execute(_SELECT_ENDPOINT + " WHERE id = ?", (endpoint_id,)).fetchone()
            if row is None:
                raise EndpointGone(endpoint_id)
            self._log(conn, ChangeKind.ENDPOINT, endpoint_id)
        return _endpoint(row)

    async def mark_deleting(self, endpoint_id: str, at: datetime) -> Endpoint:
        return await self._run(self._mark_deleting, endpoint_id, rfc3339(at))

    def _mark_deleting(self, endpoint_id: str, at: str) -> Endpoint:
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE endpoints SET deleting_at = COALESCE(deleting_at, ?), updated_at = ?"
                " WHERE id = ?",
                (at, at, endpoint_id),
            )
            if cur.rowcount == 0:
                raise EndpointGone(endpoint_id)
            row = conn.execute(_SELECT_ENDPOINT + " WHERE id = ?", (endpoint_id,)).fetchone()
            self._log(conn, ChangeKind.ENDPOINT, endpoint_id)
            self._log(conn, ChangeKind.TOKEN, endpoint_id)
        return _endpoint(row)

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        return await self._run(self._delete_endpoint, endpoint_id)

    def _delete_endpoint(self, endpoint_id: str) -> bool:
        with self._tx() as conn:
            replicas = conn.execute(
                "SELECT id FROM replicas WHERE endpoint_id = ?", (endpoint_id,)
            ).fetchall()
            # Tokens and replicas go by cascade.
            cur = conn.execute("DELETE FROM endpoints WHERE id = ?", (endpoint_id,))
            if cur.rowcount == 0:
                return False
            for (replica_id,) in replicas:
                self._log(conn, ChangeKind.REPLICA, replica_id)
            self._log(conn, ChangeKind.ENDPOINT, endpoint_id)
            self._log(conn, ChangeKind.TOKEN, endpoint_id)
            return True

    # --- endpoint tokens ---------------------------------------------------------------

    async def replace_token(self, endpoint_id: str, token_hash: bytes, at: datetime) -> None:
        await self._run(self._replace_token, endpoint_id, token_hash, rfc3339(at))

    def _replace_token(self, endpoint_id: str, token_hash: bytes, at: str) -> None:
        with self._tx() as conn:
            exists = conn.execute(
                "SELECT 1 FROM endpoints WHERE id = ? AND deleting_at IS NULL", (endpoint_id,)
            ).fetchone()
            if exists is None:
                raise EndpointGone(endpoint_id)
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
            self._log(conn, ChangeKind.TOKEN, endpoint_id)

    _ACTIVE_TOKENS = (
        "SELECT t.endpoint_id, t.token_hash FROM endpoint_tokens t"
        " JOIN endpoints e ON e.id = t.endpoint_id"
        " WHERE t.revoked_at IS NULL AND e.deleting_at IS NULL"
    )

    async def active_token_hashes(self) -> dict[str, bytes]:
        rows = await self._run(self._query, self._ACTIVE_TOKENS)
        return {endpoint_id: bytes(digest) for endpoint_id, digest in rows}

    async def active_token_hash(self, endpoint_id: str) -> bytes | None:
        rows = await self._run(
            self._query, self._ACTIVE_TOKENS + " AND t.endpoint_id = ?", (endpoint_id,)
        )
        return bytes(rows[0][1]) if rows else None

    # --- admin keys --------------------------------------------------------------------

    async def admin_key_hashes(self) -> list[bytes]:
        rows = await self._run(
            self._query, "SELECT key_hash FROM admin_keys WHERE revoked_at IS NULL ORDER BY id"
        )
        return [bytes(r[0]) for r in rows]

    async def add_admin_key(
        self, key_hash: bytes, at: datetime, *, revoke_others: bool = False
    ) -> None:
        await self._run(self._add_admin_key, key_hash, rfc3339(at), revoke_others)

    def _add_admin_key(self, key_hash: bytes, at: str, revoke_others: bool) -> None:
        with self._tx() as conn:
            if revoke_others:
                conn.execute("UPDATE admin_keys SET revoked_at = ? WHERE revoked_at IS NULL", (at,))
            conn.execute(
                "INSERT INTO admin_keys (key_hash, created_at) VALUES (?, ?)", (key_hash, at)
            )
            self._log(conn, ChangeKind.ADMIN_KEY)

    # --- LoRA adapters ----------------------------------------------------------------

    async def add_adapter(self, adapter: Adapter) -> None:
        await self._run(self._add_adapter, adapter)

    def _add_adapter(self, adapter: Adapter) -> None:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT deleting_at FROM endpoints WHERE id = ?", (adapter.endpoint_id,)
            ).fetchone()
            if row is None or row[0] is not None:
                raise EndpointGone(adapter.endpoint_id)
            try:
                conn.execute(
                    "INSERT INTO endpoint_adapters"
                    " (endpoint_id, name, source, rank, base_model, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (adapter.endpoint_id, adapter.name, adapter.source, adapter.rank,
                     adapter.base_model, rfc3339(adapter.created_at)),
                )  # fmt: skip
            except sqlite3.IntegrityError:
                raise DuplicateAdapter(adapter.name) from None
            self._log(conn, ChangeKind.ADAPTER, adapter.endpoint_id)

    async def list_adapters(self, endpoint_id: str | None = None) -> list[Adapter]:
        query = (
            "SELECT endpoint_id, name, source, rank, base_model, created_at FROM endpoint_adapters"
        )
        params: tuple[Any, ...] = ()
        if endpoint_id is not None:
            query += " WHERE endpoint_id = ?"
            params = (endpoint_id,)
        rows = await self._run(self._query, query + " ORDER BY rowid", params)
        return [
            Adapter(r[0], r[1], r[2], int(r[3]), parse_rfc3339(r[5]), base_model=r[4]) for r in rows
        ]

    async def delete_adapter(self, endpoint_id: str, name: str) -> bool:
        def write() -> bool:
            with self._tx() as conn:
                cursor = conn.execute(
                    "DELETE FROM endpoint_adapters WHERE endpoint_id = ? AND name = ?",
                    (endpoint_id, name),
                )
                if cursor.rowcount > 0:
                    self._log(conn, ChangeKind.ADAPTER, endpoint_id)
                return cursor.rowcount > 0

        return await self._run(write)

    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None:
        def write() -> None:
            with self._tx() as conn:
                conn.executemany(
                    "INSERT INTO adapter_usage_hourly (endpoint_id, adapter, hour, requests,"
                    " prompt_tokens, completion_tokens) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (endpoint_id, adapter, hour) DO UPDATE SET"
                    " requests = requests + excluded.requests,"
                    " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
                    " completion_tokens = completion_tokens + excluded.completion_tokens",
                    [(r.endpoint_id, r.adapter, rfc3339(r.hour), r.requests, r.prompt_tokens,
                      r.completion_tokens) for r in rows],
                )  # fmt: skip

        if rows:
            await self._run(write)

    async def adapter_usage(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        rows = await self._run(
            self._query,
            "SELECT hour, requests, prompt_tokens, completion_tokens FROM adapter_usage_hourly"
            " WHERE endpoint_id = ? AND adapter = ? ORDER BY hour",
            (endpoint_id, adapter),
        )
        return [
            AdapterUsage(endpoint_id, adapter, parse_rfc3339(r[0]), int(r[1]), int(r[2]), int(r[3]))
            for r in rows
        ]

    # --- registered models and measured profiles -------------------------------------

    async def add_model(self, model: RegisteredModel) -> None:
        await self._run(self._add_model, model)

    def _add_model(self, model: RegisteredModel) -> None:
        try:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO registered_models (name, project_id, document, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (model.name, model.project_id, json.dumps(model.to_dict()), model.created_at),
                )
                self._log(conn, ChangeKind.MODEL, model.name)
        except sqlite3.IntegrityError:
            raise DuplicateModel(model.name) from None

    async def get_model(self, name: str) -> RegisteredModel | None:
        rows = await self._run(
            self._query, "SELECT document FROM registered_models WHERE name = ?", (name,)
        )
        return RegisteredModel.from_dict(json.loads(rows[0][0])) if rows else None

    async def list_models(self) -> list[RegisteredModel]:
        rows = await self._run(self._query, "SELECT document FROM registered_models ORDER BY rowid")
        return [RegisteredModel.from_dict(json.loads(r[0])) for r in rows]

    async def delete_model(self, name: str) -> bool:
        def write() -> bool:
            with self._tx() as conn:
                cursor = conn.execute("DELETE FROM registered_models WHERE name = ?", (name,))
                if cursor.rowcount > 0:
                    self._log(conn, ChangeKind.MODEL, name)
                return cursor.rowcount > 0

        return await self._run(write)

    async def put_profile(self, profile: MeasuredProfile) -> None:
        def write() -> None:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO model_profiles"
                    " (model_name, gpu_type, gpu_count, document, measured_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (model_name, gpu_type, gpu_count)"
                    " DO UPDATE SET document = excluded.document,"
                    " measured_at = excluded.measured_at",
                    (profile.model_name, profile.gpu_type, profile.gpu_count,
                     json.dumps(profile.to_dict()), profile.measured_at),
                )  # fmt: skip
                self._log(conn, ChangeKind.MODEL, "")

        await self._run(write)

    async def list_profiles(self) -> list[MeasuredProfile]:
        rows = await self._run(self._query, "SELECT document FROM model_profiles ORDER BY rowid")
        return [MeasuredProfile.from_dict(json.loads(r[0])) for r in rows]

    # --- replicas -------------------------------------------------------------------------

    # `term` is ignored: one instance, so no other leader to fence out.
    async def insert_replica(self, record: ReplicaRecord, *, term: int | None = None) -> None:
        await self._run(self._insert_replica, record)

    def _insert_replica(self, record: ReplicaRecord) -> None:
        placeholders = ", ".join("?" for _ in _REPLICA_COLUMNS)
        try:
            with self._tx() as conn:
                conn.execute(
                    f"INSERT INTO replicas ({', '.join(_REPLICA_COLUMNS)}) VALUES ({placeholders})",
                    _replica_values(record),
                )
                self._log(conn, ChangeKind.REPLICA, record.id)
        except sqlite3.IntegrityError as exc:
            if exc.sqlite_errorname == "SQLITE_CONSTRAINT_FOREIGNKEY":
                raise EndpointGone(record.endpoint_id) from None
            raise

    async def update_replica(
        self,
        replica_id: str,
        *,
        status: str,
        reason: str | None,
        url: str | None,
        at: datetime,
        term: int | None = None,
    ) -> None:
        await self._run(self._update_replica, replica_id, status, reason, url, rfc3339(at))

    def _update_replica(
        self, replica_id: str, status: str, reason: str | None, url: str | None, at: str
    ) -> None:
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE replicas SET status = ?, reason = ?, url = ?, updated_at = ? WHERE id = ?",
                (status, reason, url, at, replica_id),
            )
            if cur.rowcount:
                self._log(conn, ChangeKind.REPLICA, replica_id)

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        await self._run(self._delete_replica, replica_id)

    def _delete_replica(self, replica_id: str) -> None:
        with self._tx() as conn:
            cur = conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))
            if cur.rowcount:
                self._log(conn, ChangeKind.REPLICA, replica_id)

    async def confirm_term(self, term: int) -> None:
        return None  # instances on one SQLite file do not elect a leader

    async def list_replicas(self) -> list[ReplicaRecord]:
        rows = await self._run(
            self._query, f"SELECT {', '.join(_REPLICA_COLUMNS)} FROM replicas ORDER BY rowid"
        )
        return [_replica(row) for row in rows]

    # --- change feed -----------------------------------------------------------------------

    def changes(self) -> AsyncIterator[Change]:
        subscription = self._hub.subscribe()
        with self._lock:
            if self._watcher is None and not self._closed.is_set():
                self._watcher = threading.Thread(
                    target=self._watch, name="inferd-sqlite-changes", daemon=True
                )
                self._watcher.start()
        return subscription

    def _last_seq(self) -> int:
        return int(self._query("SELECT COALESCE(MAX(seq), 0) FROM changes")[0][0])

    def _watch(self) -> None:
        """Publish what the change log gained since the last look: after each
        of this store's commits at once, and every POLL_INTERVAL_S for other
        processes' commits."""
        conn = _connect(self.path, read_only=True)
        try:
            while not self._closed.is_set():
                self._poke.wait(POLL_INTERVAL_S)
                self._poke.clear()
                try:
                    self._publish_new(conn)
                except sqlite3.Error:
                    logger.exception("reading the SQLite change log failed; retrying")
        finally:
            conn.close()

    def _publish_new(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute(
            "SELECT seq, kind, key FROM changes WHERE seq > ? ORDER BY seq", (self._cursor,)
        ).fetchall()
        if not rows:
            return
        if rows[0][0] > self._cursor + 1:
            # Pruned past where we were (we were stopped for a long time).
            self._hub.publish(Change(ChangeKind.RESYNC))
        for seq, kind, key in rows:
            self._hub.publish(Change(ChangeKind(kind), key))
            self._cursor = seq


def _connect(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    # isolation_level=None: autocommit; transactions are explicit.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        if not read_only:
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
