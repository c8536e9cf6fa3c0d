"""PostgreSQL store of the control plane: several control planes, one database.

psycopg 3 with a `psycopg_pool` connection pool; every call runs on the
store's own worker threads, so callers just `await` (as with SQLite). Each
write is one transaction committed before its coroutine returns. A write
that cannot reach the database raises `StoreUnavailable` (an HTTP 503 with
Retry-After); the pool checks each connection before lending it and opens
new ones by itself, so the store recovers when the server is back.

Change feed: each write appends (kind, id) to the `changes` table under one
transaction-scoped advisory lock (so sequence order is commit order) and
NOTIFYs `inferd_changes`. A watcher thread LISTENs, and on every
notification, and every POLL_INTERVAL_S in any case, reads the log past
the last sequence number it saw. NOTIFY has no replay; the log does, so
nothing is missed across a lost connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from inferd.api.engine_settings import EngineSettings
from inferd.catalog.registered import DuplicateModel, MeasuredProfile, RegisteredModel
from inferd.control.accounts.postgres import PostgresAccounts
from inferd.control.accounts.quota import EndpointShape
from inferd.control.cluster.postgres import check_term_sync
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
    StoreUnavailable,
)
from inferd.control.paging import EndpointFilter, Page, page_of
from inferd.control.stores.feed import ChangeHub
from inferd.control.stores.postgres.migrations import migrate

logger = logging.getLogger(__name__)

T = TypeVar("T")

CHANNEL = "inferd_changes"
# pg_advisory_xact_lock key taken by every write just before it appends to
# the change log: writers commit in the order of their sequence numbers.
CHANGES_LOCK = 0x1F_E7D0_0002
KEEP_CHANGES = 10_000
POLL_INTERVAL_S = 0.5
CONNECT_TIMEOUT_S = 3
# How long a call waits for a pooled connection before answering 503.
ACQUIRE_TIMEOUT_S = 3.0
POOL_SIZE = 4
# How long a quota check waits for another instance's before answering 503.
QUOTA_LOCK_TIMEOUT: LiteralString = "SET LOCAL lock_timeout = '10s'"


def _quota_lock_key(project_id: str) -> int:
    """The advisory lock key of a project's quota checks (a signed 64-bit
    digest, apart from CHANGES_LOCK's by its prefix)."""
    digest = hashlib.blake2b(f"inferd-quota:{project_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


UNIQUE_VIOLATION = "23505"
FOREIGN_KEY_VIOLATION = "23503"

_ENDPOINT_COLUMNS = (
    "id", "name", "model_name", "model_kind", "gpu_type", "gpu_count", "location_name",
    "min_replicas", "max_replicas", "retention_seconds", "hourly_price", "currency",
    "created_at", "updated_at", "deleting_at", "generation", "project_id", "engine_settings",
)  # fmt: skip
_REPLICA_COLUMNS = (
    "id", "endpoint_id", "generation", "gpu_type", "gpu_count", "secret_hash", "status",
    "created_at", "updated_at", "node", "placement", "reason", "url",
)  # fmt: skip
_UPDATABLE = frozenset(
    {
        "min_replicas", "max_replicas", "retention_seconds", "gpu_type", "gpu_count",
        "hourly_price", "currency", "generation", "updated_at", "engine_settings",
    }
)  # fmt: skip
_ENDPOINT_LIST = sql.SQL(", ").join(map(sql.Identifier, _ENDPOINT_COLUMNS))
_REPLICA_LIST = sql.SQL(", ").join(map(sql.Identifier, _REPLICA_COLUMNS))
_SELECT_ENDPOINT = sql.SQL("SELECT {} FROM endpoints").format(_ENDPOINT_LIST)
_ACTIVE_TOKENS: LiteralString = (
    "SELECT t.endpoint_id, t.token_hash FROM endpoint_tokens t"
    " JOIN endpoints e ON e.id = t.endpoint_id"
    " WHERE t.revoked_at IS NULL AND e.deleting_at IS NULL"
)


def _endpoint_conditions(
    where: EndpointFilter, after: int | None
) -> tuple[list[sql.Composable], list[Any]]:
    """The WHERE clauses (and their parameters) of a page of endpoints; the
    identity `seq` is the position (indexed by `endpoints_by_seq`)."""
    conditions: list[sql.Composable] = []
    params: list[Any] = []
    if after is not None:
        conditions.append(sql.SQL("seq > %s"))
        params.append(after)
    if where.project_ids is not None:
        conditions.append(sql.SQL("project_id = ANY(%s)"))
        params.append(sorted(where.project_ids))
    if where.model_name is not None:
        conditions.append(sql.SQL("model_name = %s"))
        params.append(where.model_name)
    if where.location_name is not None:
        conditions.append(sql.SQL("location_name = %s"))
        params.append(where.location_name)
    if where.name_prefix is not None:
        # Not LIKE: % and _ in a prefix are plain characters.
        conditions.append(sql.SQL("starts_with(name, %s)"))
        params.append(where.name_prefix)
    return conditions, params


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _endpoint(row: tuple[Any, ...]) -> Endpoint:
    values = dict(zip(_ENDPOINT_COLUMNS, row, strict=True))
    for key in ("created_at", "updated_at", "deleting_at"):
        values[key] = _utc(values[key])
    values["engine_settings"] = EngineSettings.from_json(values["engine_settings"])
    return Endpoint(**values)


def _column_value(value: Any) -> Any:
    return value.to_json() if isinstance(value, EngineSettings) else value


def _fence(conn: psycopg.Connection, term: int | None) -> None:
    """Raises `Deposed` when `term` is no longer the leader's (None: a write
    that is not the leader's). Holds the leader row FOR SHARE until commit,
    so a new leader's term cannot be issued while the write is under way."""
    if term is not None:
        check_term_sync(conn, term)


def _replica(row: tuple[Any, ...]) -> ReplicaRecord:
    values = dict(zip(_REPLICA_COLUMNS, row, strict=True))
    values["secret_hash"] = bytes(values["secret_hash"])
    values["created_at"] = _utc(values["created_at"])
    values["updated_at"] = _utc(values["updated_at"])
    values["placement"] = {str(k): str(v) for k, v in values["placement"].items()}
    return ReplicaRecord(**values)


def _redacted(url: str) -> str:
    from inferd.redact import redact_url

    return redact_url(url)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresStore(PostgresAccounts):
    def __init__(self, url: str, pool: ConnectionPool) -> None:
        self._url = url
        self._pool = pool
        self._executor = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="inferd-pg")
        self._hub = ChangeHub()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None
        self._cursor = self._call(self._last_seq)

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    def open(cls, url: str) -> PostgresStore:
        """Connect, migrate (under the migration lock) and open the pool.
        `StoreUnavailable` if the server cannot be reached."""
        try:
            with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                migrate(conn)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot reach PostgreSQL at {_redacted(url)}: {_first_line(exc)}"
            ) from exc
        pool = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S},
            # A connection the server dropped (restart, failover) is found
            # and replaced before it is lent, not by a failed write.
            check=ConnectionPool.check_connection,
            timeout=ACQUIRE_TIMEOUT_S,
            name="inferd",
        )
        try:
            pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        except PoolTimeout as exc:
            pool.close()
            raise StoreUnavailable(f"cannot reach PostgreSQL at {_redacted(url)}") from exc
        return cls(url, pool)

    def describe(self) -> str:
        return _redacted(self._url)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        self._closed.set()
        self._hub.close()
        if self._watcher is not None:
            self._watcher.join(POLL_INTERVAL_S * 4)
        self._executor.shutdown(wait=True)
        self._pool.close()

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in one transaction on a pooled connection."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                return fn(conn, *args)
        except PoolTimeout as exc:
            raise StoreUnavailable("no database connection") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # Connection lost mid-call (server restart, network): the
            # transaction did not commit.
            raise StoreUnavailable(_first_line(exc)) from exc

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._call, fn, *args))

    @staticmethod
    def _log(conn: psycopg.Connection, changes: list[tuple[ChangeKind, str]]) -> None:
        """Append to the change log, last thing before the commit."""
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (CHANGES_LOCK,))
        last = 0
        for kind, key in changes:
            row = conn.execute(
                "INSERT INTO changes (kind, key) VALUES (%s, %s) RETURNING seq", (kind.value, key)
            ).fetchone()
            assert row is not None
            last = int(row[0])
            if last % 1000 == 0:
                conn.execute("DELETE FROM changes WHERE seq <= %s", (last - KEEP_CHANGES,))
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(last)))

    async def schema_version(self) -> int:
        def query(conn: psycopg.Connection) -> int:
            row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
            return int(row[0] or 0) if row else 0

        return await self._run(query)

    # --- endpoints -------------------------------------------------------------------

    async def insert_endpoint(self, endpoint: Endpoint, token_hash: bytes) -> None:
        await self._run(self._insert_endpoint, endpoint, token_hash)

    def _insert_endpoint(self, conn: psycopg.Connection, endpoint: Endpoint, digest: bytes) -> None:
        statement = sql.SQL("INSERT INTO endpoints ({}) VALUES ({})").format(
            _ENDPOINT_LIST, sql.SQL(", ").join(sql.Placeholder() * len(_ENDPOINT_COLUMNS))
        )
        try:
            with conn.transaction():  # a savepoint: the error leaves the outer one usable
                conn.execute(
                    statement, tuple(_column_value(getattr(endpoint, c)) for c in _ENDPOINT_COLUMNS)
                )
        except psycopg.errors.UniqueViolation as exc:
            if (
                exc.sqlstate == UNIQUE_VIOLATION
                and exc.diag.constraint_name == "endpoints_name_key"
            ):
                raise DuplicateName(endpoint.name) from None
            raise
        conn.execute(
            "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at) VALUES (%s, %s, %s)",
            (endpoint.id, digest, endpoint.created_at),
        )
        self._log(conn, [(ChangeKind.ENDPOINT, endpoint.id), (ChangeKind.TOKEN, endpoint.id)])

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        def query(conn: psycopg.Connection) -> Endpoint | None:
            row = conn.execute(
                sql.SQL("{} WHERE id = %s").format(_SELECT_ENDPOINT), (endpoint_id,)
            ).fetchone()
            return _endpoint(row) if row else None

        return await self._run(query)

    async def list_endpoints(self) -> list[Endpoint]:
        def query(conn: psycopg.Connection) -> list[Endpoint]:
            rows = conn.execute(sql.SQL("{} ORDER BY seq").format(_SELECT_ENDPOINT)).fetchall()
            return [_endpoint(r) for r in rows]

        return await self._run(query)

    async def page_endpoint_ids(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[str]:
        if where.selects_nothing():
            return Page([], None)
        conditions, params = _endpoint_conditions(where, after)
        statement = sql.SQL("SELECT seq, id FROM endpoints {} ORDER BY seq LIMIT %s").format(
            sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL(""),
        )

        def query(conn: psycopg.Connection) -> Page[str]:
            rows = conn.execute(statement, (*params, limit + 1)).fetchall()
            return page_of([(int(r[0]), str(r[1])) for r in rows], limit)

        return await self._run(query)

    @contextlib.asynccontextmanager
    async def quota_lock(self, project_id: str) -> AsyncIterator[None]:
        """A session advisory lock per project, on a connection held from the
        check to the end of the write (the write commits on another one). A
        holder whose connection dies loses the lock with it."""
        key = _quota_lock_key(project_id)
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(self._executor, self._hold_lock, key)
        try:
            yield
        finally:
            await loop.run_in_executor(self._executor, self._release_lock, conn, key)

    def _hold_lock(self, key: int) -> psycopg.Connection:
        try:
            conn = self._pool.getconn(timeout=ACQUIRE_TIMEOUT_S)
        except PoolTimeout as exc:
            raise StoreUnavailable("no database connection") from exc
        try:
            with conn.transaction():
                conn.execute(QUOTA_LOCK_TIMEOUT)
                conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.Error as exc:
            self._pool.putconn(conn)
            raise StoreUnavailable(_first_line(exc)) from exc
        return conn

    def _release_lock(self, conn: psycopg.Connection, key: int) -> None:
        try:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            conn.commit()
        except psycopg.Error:
            pass  # the connection is gone, and the server let the lock go with it
        finally:
            self._pool.putconn(conn)

    async def count_endpoints(self, project_id: str) -> int:
        def query(conn: psycopg.Connection) -> int:
            row = conn.execute(
                "SELECT count(*) FROM endpoints WHERE project_id = %s", (project_id,)
            ).fetchone()
            return int(row[0]) if row else 0

        return await self._run(query)

    async def quota_shapes(self, project_id: str) -> list[EndpointShape]:
        def query(conn: psycopg.Connection) -> list[EndpointShape]:
            rows = conn.execute(
                "SELECT id, gpu_type, gpu_count, min_replicas FROM endpoints"
                " WHERE project_id = %s AND deleting_at IS NULL",
                (project_id,),
            ).fetchall()
            return [EndpointShape(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

        return await self._run(query)

    async def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> Endpoint:
        def write(conn: psycopg.Connection) -> Endpoint:
            values: dict[str, Any] = {
                **{k: _column_value(v) for k, v in changes.settings().items()},
                "updated_at": changes.updated_at,
            }
            assert set(values) <= _UPDATABLE
            statement = sql.SQL("UPDATE endpoints SET {} WHERE id = %s RETURNING {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{} = %s").format(sql.Identifier(column)) for column in values
                ),
                _ENDPOINT_LIST,
            )
            row = conn.execute(statement, (*values.values(), endpoint_id)).fetchone()
            if row is None:
                raise EndpointGone(endpoint_id)
            self._log(conn, [(ChangeKind.ENDPOINT, endpoint_id)])
            return _endpoint(row)

        return await self._run(write)

    async def mark_deleting(self, endpoint_id: str, at: datetime) -> Endpoint:
        def write(conn: psycopg.Connection) -> Endpoint:
            statement = sql.SQL(
                "UPDATE endpoints SET deleting_at = COALESCE(deleting_at, %s), updated_at = %s"
                " WHERE id = %s RETURNING {}"
            ).format(_ENDPOINT_LIST)
            row = conn.execute(statement, (at, at, endpoint_id)).fetchone()
            if row is None:
                raise EndpointGone(endpoint_id)
            self._log(conn, [(ChangeKind.ENDPOINT, endpoint_id), (ChangeKind.TOKEN, endpoint_id)])
            return _endpoint(row)

        return await self._run(write)

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        def write(conn: psycopg.Connection) -> bool:
            replicas = conn.execute(
                "SELECT id FROM replicas WHERE endpoint_id = %s", (endpoint_id,)
            ).fetchall()
            # Tokens and replicas go by cascade.
            cur = conn.execute("DELETE FROM endpoints WHERE id = %s", (endpoint_id,))
            if cur.rowcount == 0:
                return False
            self._log(
                conn,
                [(ChangeKind.REPLICA, r[0]) for r in replicas]
                + [(ChangeKind.ENDPOINT, endpoint_id), (ChangeKind.TOKEN, endpoint_id)],
            )
            return True

        return await self._run(write)

    # --- endpoint tokens ---------------------------------------------------------------

    async def replace_token(self, endpoint_id: str, token_hash: bytes, at: datetime) -> None:
        def write(conn: psycopg.Connection) -> None:
            exists = conn.execute(
                "SELECT 1 FROM endpoints WHERE id = %s AND deleting_at IS NULL FOR UPDATE",
                (endpoint_id,),
            ).fetchone()
            if exists is None:
                raise EndpointGone(endpoint_id)
            conn.execute(
                "UPDATE endpoint_tokens SET revoked_at = %s"
                " WHERE endpoint_id = %s AND revoked_at IS NULL",
                (at, endpoint_id),
            )
            conn.execute(
                "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at)"
                " VALUES (%s, %s, %s)",
                (endpoint_id, token_hash, at),
            )
            self._log(conn, [(ChangeKind.TOKEN, endpoint_id)])

        await self._run(write)

    async def active_token_hashes(self) -> dict[str, bytes]:
        def query(conn: psycopg.Connection) -> dict[str, bytes]:
            return {r[0]: bytes(r[1]) for r in conn.execute(_ACTIVE_TOKENS).fetchall()}

        return await self._run(query)

    async def active_token_hash(self, endpoint_id: str) -> bytes | None:
        def query(conn: psycopg.Connection) -> bytes | None:
            row = conn.execute(
                _ACTIVE_TOKENS + " AND t.endpoint_id = %s", (endpoint_id,)
            ).fetchone()
            return bytes(row[1]) if row else None

        return await self._run(query)

    # --- admin keys --------------------------------------------------------------------

    async def admin_key_hashes(self) -> list[bytes]:
        def query(conn: psycopg.Connection) -> list[bytes]:
            rows = conn.execute(
                "SELECT key_hash FROM admin_keys WHERE revoked_at IS NULL ORDER BY id"
            ).fetchall()
            return [bytes(r[0]) for r in rows]

        return await self._run(query)

    async def add_admin_key(
        self, key_hash: bytes, at: datetime, *, revoke_others: bool = False
    ) -> None:
        def write(conn: psycopg.Connection) -> None:
            if revoke_others:
                conn.execute(
                    "UPDATE admin_keys SET revoked_at = %s WHERE revoked_at IS NULL", (at,)
                )
            conn.execute(
                "INSERT INTO admin_keys (key_hash, created_at) VALUES (%s, %s)", (key_hash, at)
            )
            self._log(conn, [(ChangeKind.ADMIN_KEY, "")])

        await self._run(write)

    # --- LoRA adapters ----------------------------------------------------------------

    async def add_adapter(self, adapter: Adapter) -> None:
        def write(conn: psycopg.Connection) -> None:
            row = conn.execute(
                "SELECT deleting_at FROM endpoints WHERE id = %s FOR SHARE", (adapter.endpoint_id,)
            ).fetchone()
            if row is None or row[0] is not None:
                raise EndpointGone(adapter.endpoint_id)
            try:
                with conn.transaction():  # a savepoint, as in _insert_endpoint
                    conn.execute(
                        "INSERT INTO endpoint_adapters"
                        " (endpoint_id, name, source, rank, base_model, created_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s)",
                        (adapter.endpoint_id, adapter.name, adapter.source, adapter.rank,
                         adapter.base_model, adapter.created_at),
                    )  # fmt: skip
            except psycopg.errors.UniqueViolation:
                raise DuplicateAdapter(adapter.name) from None
            self._log(conn, [(ChangeKind.ADAPTER, adapter.endpoint_id)])

        await self._run(write)

    async def list_adapters(self, endpoint_id: str | None = None) -> list[Adapter]:
        def query(conn: psycopg.Connection) -> list[Adapter]:
            rows = conn.execute(
                "SELECT endpoint_id, name, source, rank, base_model, created_at"
                " FROM endpoint_adapters WHERE %s::text IS NULL OR endpoint_id = %s"
                " ORDER BY seq",
                (endpoint_id, endpoint_id),
            ).fetchall()
            return [
                Adapter(r[0], r[1], r[2], int(r[3]), r[5].astimezone(UTC), base_model=r[4])
                for r in rows
            ]

        return await self._run(query)

    async def delete_adapter(self, endpoint_id: str, name: str) -> bool:
        def write(conn: psycopg.Connection) -> bool:
            cursor = conn.execute(
                "DELETE FROM endpoint_adapters WHERE endpoint_id = %s AND name = %s",
                (endpoint_id, name),
            )
            if cursor.rowcount > 0:
                self._log(conn, [(ChangeKind.ADAPTER, endpoint_id)])
            return cursor.rowcount > 0

        return await self._run(write)

    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None:
        def write(conn: psycopg.Connection) -> None:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO adapter_usage_hourly (endpoint_id, adapter, hour, requests,"
                    " prompt_tokens, completion_tokens) VALUES (%s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (endpoint_id, adapter, hour) DO UPDATE SET"
                    " requests = adapter_usage_hourly.requests + excluded.requests,"
                    " prompt_tokens = adapter_usage_hourly.prompt_tokens + excluded.prompt_tokens,"
                    " completion_tokens ="
                    " adapter_usage_hourly.completion_tokens + excluded.completion_tokens",
                    [(r.endpoint_id, r.adapter, r.hour, r.requests, r.prompt_tokens,
                      r.completion_tokens) for r in rows],
                )  # fmt: skip

        if rows:
            await self._run(write)

    async def adapter_usage(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        def query(conn: psycopg.Connection) -> list[AdapterUsage]:
            rows = conn.execute(
                "SELECT hour, requests, prompt_tokens, completion_tokens"
                " FROM adapter_usage_hourly WHERE endpoint_id = %s AND adapter = %s ORDER BY hour",
                (endpoint_id, adapter),
            ).fetchall()
            return [
                AdapterUsage(
                    endpoint_id, adapter, r[0].astimezone(UTC), int(r[1]), int(r[2]), int(r[3])
                )
                for r in rows
            ]

        return await self._run(query)

    # --- registered models and measured profiles -------------------------------------

    async def add_model(self, model: RegisteredModel) -> None:
        def write(conn: psycopg.Connection) -> None:
            try:
                with conn.transaction():  # a savepoint, as in _insert_endpoint
                    conn.execute(
                        "INSERT INTO registered_models (name, project_id, document, created_at)"
                        " VALUES (%s, %s, %s, %s)",
                        (model.name, model.project_id, Jsonb(model.to_dict()), model.created_at),
                    )
            except psycopg.errors.UniqueViolation:
                raise DuplicateModel(model.name) from None
            self._log(conn, [(ChangeKind.MODEL, model.name)])

        await self._run(write)

    async def get_model(self, name: str) -> RegisteredModel | None:
        def query(conn: psycopg.Connection) -> RegisteredModel | None:
            row = conn.execute(
                "SELECT document FROM registered_models WHERE name = %s", (name,)
            ).fetchone()
            return RegisteredModel.from_dict(row[0]) if row else None

        return await self._run(query)

    async def list_models(self) -> list[RegisteredModel]:
        def query(conn: psycopg.Connection) -> list[RegisteredModel]:
            rows = conn.execute("SELECT document FROM registered_models ORDER BY seq").fetchall()
            return [RegisteredModel.from_dict(r[0]) for r in rows]

        return await self._run(query)

    async def delete_model(self, name: str) -> bool:
        def write(conn: psycopg.Connection) -> bool:
            cursor = conn.execute("DELETE FROM registered_models WHERE name = %s", (name,))
            if cursor.rowcount > 0:
                self._log(conn, [(ChangeKind.MODEL, name)])
            return cursor.rowcount > 0

        return await self._run(write)

    async def put_profile(self, profile: MeasuredProfile) -> None:
        def write(conn: psycopg.Connection) -> None:
            conn.execute(
                "INSERT INTO model_profiles"
                " (model_name, gpu_type, gpu_count, document, measured_at)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (model_name, gpu_type, gpu_count)"
                " DO UPDATE SET document = excluded.document, measured_at = excluded.measured_at",
                (profile.model_name, profile.gpu_type, profile.gpu_count,
                 Jsonb(profile.to_dict()), profile.measured_at),
            )  # fmt: skip
            self._log(conn, [(ChangeKind.MODEL, "")])

        await self._run(write)

    async def list_profiles(self) -> list[MeasuredProfile]:
        def query(conn: psycopg.Connection) -> list[MeasuredProfile]:
            rows = conn.execute(
                "SELECT document FROM model_profiles ORDER BY model_name, gpu_type, gpu_count"
            ).fetchall()
            return [MeasuredProfile.from_dict(r[0]) for r in rows]

        return await self._run(query)

    # --- replicas -------------------------------------------------------------------------

    # The leader's writes carry its term: checked first, in the write's own
    # transaction (`_call`), so a deposed leader's late write changes nothing.

    async def insert_replica(self, record: ReplicaRecord, *, term: int | None = None) -> None:
        def write(conn: psycopg.Connection) -> None:
            _fence(conn, term)
            values = [getattr(record, c) for c in _REPLICA_COLUMNS]
            values[_REPLICA_COLUMNS.index("placement")] = Jsonb(dict(record.placement))
            statement = sql.SQL("INSERT INTO replicas ({}) VALUES ({})").format(
                _REPLICA_LIST, sql.SQL(", ").join(sql.Placeholder() * len(_REPLICA_COLUMNS))
            )
            try:
                with conn.transaction():
                    conn.execute(statement, values)
            except psycopg.errors.ForeignKeyViolation as exc:
                if exc.sqlstate == FOREIGN_KEY_VIOLATION:
                    raise EndpointGone(record.endpoint_id) from None
                raise
            self._log(conn, [(ChangeKind.REPLICA, record.id)])

        await self._run(write)

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
        def write(conn: psycopg.Connection) -> None:
            _fence(conn, term)
            cur = conn.execute(
                "UPDATE replicas SET status = %s, reason = %s, url = %s, updated_at = %s"
                " WHERE id = %s",
                (status, reason, url, at, replica_id),
            )
            if cur.rowcount:
                self._log(conn, [(ChangeKind.REPLICA, replica_id)])

        await self._run(write)

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        def write(conn: psycopg.Connection) -> None:
            _fence(conn, term)
            cur = conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,))
            if cur.rowcount:
                self._log(conn, [(ChangeKind.REPLICA, replica_id)])

        await self._run(write)

    async def confirm_term(self, term: int) -> None:
        await self._run(check_term_sync, term)

    async def list_replicas(self) -> list[ReplicaRecord]:
        def query(conn: psycopg.Connection) -> list[ReplicaRecord]:
            statement = sql.SQL("SELECT {} FROM replicas ORDER BY seq").format(_REPLICA_LIST)
            return [_replica(r) for r in conn.execute(statement).fetchall()]

        return await self._run(query)

    # --- change feed -----------------------------------------------------------------------

    def changes(self) -> AsyncIterator[Change]:
        subscription = self._hub.subscribe()
        with self._lock:
            if self._watcher is None and not self._closed.is_set():
                self._watcher = threading.Thread(
                    target=self._watch, name="inferd-pg-changes", daemon=True
                )
                self._watcher.start()
        return subscription

    @staticmethod
    def _last_seq(conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()
        return int(row[0]) if row else 0

    def _watch(self) -> None:
        conn: psycopg.Connection | None = None
        backoff = POLL_INTERVAL_S
        while not self._closed.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(
                        self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                    )
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    if backoff > POLL_INTERVAL_S:
                        logger.info("change feed: reconnected to PostgreSQL")
                    backoff = POLL_INTERVAL_S
                # Read first: what was committed before LISTEN took effect,
                # or while the connection was down, is in the log.
                self._publish_new(conn)
                for _ in conn.notifies(timeout=POLL_INTERVAL_S, stop_after=1):
                    pass
            except psycopg.Error as exc:
                if conn is not None:
                    conn.close()
                    conn = None
                    logger.warning("change feed: lost PostgreSQL (%s); polling", _first_line(exc))
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if conn is not None:
            conn.close()

    def _publish_new(self, conn: psycopg.Connection) -> None:
        rows = conn.execute(
            "SELECT seq, kind, key FROM changes WHERE seq > %s ORDER BY seq", (self._cursor,)
        ).fetchall()
        if not rows:
            return
        if rows[0][0] > self._cursor + 1 and not self._continuous(conn):
            self._hub.publish(Change(ChangeKind.RESYNC))
        for seq, kind, key in rows:
            self._hub.publish(Change(ChangeKind(kind), key))
            self._cursor = int(seq)

    def _continuous(self, conn: psycopg.Connection) -> bool:
        """A gap in sequence numbers is normal (a rolled-back write used one);
        changes were lost only if the log was pruned past our cursor."""
        row = conn.execute("SELECT MIN(seq) FROM changes").fetchone()
        oldest = int(row[0]) if row and row[0] is not None else 0
        return oldest <= self._cursor + 1 or self._cursor == 0
