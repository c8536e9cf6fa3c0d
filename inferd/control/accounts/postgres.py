"""Accounts in the PostgreSQL store: schema (one migration of the store's
list) and `PostgresAccounts`, the accounts half of the PostgreSQL adapter.

Same rules as the SQLite half (`inferd.control.accounts.sqlite`): the audit
log refuses UPDATE and DELETE by trigger; usage rows are only added to
(`INSERT ... ON CONFLICT DO UPDATE SET x = x + excluded.x`), so instances
sharing the database add up; account changes go to the change log, so
every instance drops what it cached.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, LiteralString

import psycopg

from inferd.control.accounts.model import (
    AuditAction,
    AuditEntry,
    Membership,
    Project,
    UsageDelta,
    UsageKey,
    UsageRow,
    UsageTotals,
    User,
    UserKey,
)
from inferd.control.accounts.ports import AlreadyExists
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Role
from inferd.control.accounts.sqlite import quota_from_json, quota_to_json
from inferd.control.model import ChangeKind

ACCOUNT_TABLES_POSTGRES: tuple[LiteralString, ...] = (
    """
    CREATE TABLE projects (
        id         TEXT PRIMARY KEY,
        created_at TIMESTAMPTZ NOT NULL,
        quota      JSONB NOT NULL DEFAULT '{}'
    )
    """,
    "INSERT INTO projects (id, created_at) VALUES ('default', now())",
    """
    CREATE TABLE users (
        id         TEXT PRIMARY KEY,
        created_at TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE memberships (
        project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
        user_id    TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        role       TEXT NOT NULL CHECK (role IN ('admin', 'developer', 'viewer')),
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (project_id, user_id)
    )
    """,
    "CREATE INDEX memberships_by_user ON memberships (user_id)",
    """
    CREATE TABLE user_keys (
        id           TEXT PRIMARY KEY,
        user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        name         TEXT NOT NULL,
        key_hash     BYTEA NOT NULL UNIQUE,
        hint         TEXT NOT NULL,
        created_at   TIMESTAMPTZ NOT NULL,
        last_used_at TIMESTAMPTZ,
        revoked_at   TIMESTAMPTZ
    )
    """,
    "CREATE INDEX user_keys_by_user ON user_keys (user_id)",
    """
    CREATE TABLE audit_log (
        id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at         TIMESTAMPTZ NOT NULL,
        project_id TEXT,
        actor      TEXT NOT NULL,
        action     TEXT NOT NULL,
        target     TEXT NOT NULL,
        detail     JSONB NOT NULL
    )
    """,
    "CREATE INDEX audit_log_by_project ON audit_log (project_id, at)",
    """
    CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$
    """,
    """
    CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()
    """,
    # No reference to endpoints: usage and its cost outlive a deleted endpoint.
    """
    CREATE TABLE usage_hourly (
        endpoint_id       TEXT NOT NULL,
        project_id        TEXT NOT NULL,
        hour              TIMESTAMPTZ NOT NULL,
        gpu_type          TEXT NOT NULL,
        gpu_count         BIGINT NOT NULL,
        replica_seconds   DOUBLE PRECISION NOT NULL DEFAULT 0,
        requests          BIGINT NOT NULL DEFAULT 0,
        prompt_tokens     BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        images            BIGINT NOT NULL DEFAULT 0,
        cost              DOUBLE PRECISION NOT NULL DEFAULT 0,
        PRIMARY KEY (endpoint_id, hour, gpu_type, gpu_count)
    )
    """,
    "CREATE INDEX usage_hourly_by_project ON usage_hourly (project_id, hour)",
    # Endpoint names are unique within a project.
    "ALTER TABLE endpoints DROP CONSTRAINT endpoints_name_key",
    "ALTER TABLE endpoints ADD CONSTRAINT endpoints_name_key UNIQUE (project_id, name)",
)

_KEY_COLUMNS: LiteralString = (
    "id, user_id, name, key_hash, hint, created_at, last_used_at, revoked_at, project_id"
)
_USAGE_COLUMNS: LiteralString = (
    "endpoint_id, project_id, hour, gpu_type, gpu_count, replica_seconds, requests,"
    " prompt_tokens, completion_tokens, images, cost"
)


_USAGE_WHERE: LiteralString = (
    "(%s::text IS NULL OR endpoint_id = %s)"
    " AND (%s::text IS NULL OR project_id = %s)"
    " AND (%s::timestamptz IS NULL OR hour >= %s)"
    " AND (%s::timestamptz IS NULL OR hour < %s)"
)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _key(row: Sequence[Any]) -> UserKey:
    return UserKey(
        id=row[0], user_id=row[1], name=row[2], key_hash=bytes(row[3]), hint=row[4],
        created_at=row[5].astimezone(UTC), last_used_at=_utc(row[6]), revoked_at=_utc(row[7]),
        project_id=row[8],
    )  # fmt: skip


def _usage(row: Sequence[Any]) -> UsageRow:
    return UsageRow(
        endpoint_id=row[0], project_id=row[1], hour=row[2].astimezone(UTC), gpu_type=row[3],
        gpu_count=int(row[4]), replica_seconds=float(row[5]), requests=int(row[6]),
        prompt_tokens=int(row[7]), completion_tokens=int(row[8]), images=int(row[9]),
        cost=float(row[10]),
    )  # fmt: skip


def _quota(value: Any) -> Quota:
    return quota_from_json(value if isinstance(value, str) else json.dumps(value or {}))


def _project(row: Any) -> Project:
    return Project(row[0], row[1].astimezone(UTC), _quota(row[2]), _quota(row[3]))


Conn = psycopg.Connection[Any]


class PostgresAccounts:
    """Needs the host store's `_run(fn(conn, *args), *args)` (one transaction
    on a pooled connection, in its worker threads) and `_log(conn, changes)`."""

    _run: Callable[..., Awaitable[Any]]
    _log: Callable[[Conn, list[tuple[ChangeKind, str]]], None]

    def _write(self, sql: LiteralString, params: tuple[Any, ...], change: str | None = None) -> Any:
        def write(conn: Conn) -> int:
            count = conn.execute(sql, params).rowcount
            if change is not None and count:
                self._log(conn, [(ChangeKind.ACCOUNT, change)])
            return count

        return write

    async def _rows(self, sql: LiteralString, params: tuple[Any, ...] = ()) -> list[Any]:
        def query(conn: Conn) -> list[Any]:
            return conn.execute(sql, params).fetchall()

        rows: list[Any] = await self._run(query)
        return rows

    # --- projects ---------------------------------------------------------------------

    async def create_project(self, project: Project) -> None:
        try:
            await self._run(self._write(
                "INSERT INTO projects (id, created_at, quota, quota_limit) VALUES (%s, %s, %s, %s)",
                (project.id, project.created_at, quota_to_json(project.quota),
                 quota_to_json(project.limit)),
            ))  # fmt: skip
        except psycopg.errors.UniqueViolation:
            raise AlreadyExists(project.id) from None

    async def get_project(self, project_id: str) -> Project | None:
        rows = await self._rows(
            "SELECT id, created_at, quota, quota_limit FROM projects WHERE id = %s", (project_id,)
        )
        return _project(rows[0]) if rows else None

    async def list_projects(self) -> list[Project]:
        rows = await self._rows(
            "SELECT id, created_at, quota, quota_limit FROM projects ORDER BY id"
        )
        return [_project(r) for r in rows]

    async def delete_project(self, project_id: str) -> bool:
        # Memberships go with it (ON DELETE CASCADE); audit and usage stay.
        count = await self._run(self._write(
            "DELETE FROM projects WHERE id = %s", (project_id,), f"project:{project_id}"
        ))  # fmt: skip
        return bool(count)

    async def set_quota(self, project_id: str, quota: Quota) -> bool:
        return await self._set_project(
            "UPDATE projects SET quota = %s WHERE id = %s", project_id, quota
        )

    async def set_quota_limit(self, project_id: str, limit: Quota) -> bool:
        return await self._set_project(
            "UPDATE projects SET quota_limit = %s WHERE id = %s", project_id, limit
        )

    async def _set_project(self, sql: LiteralString, project_id: str, quota: Quota) -> bool:
        params = (quota_to_json(quota), project_id)
        return bool(await self._run(self._write(sql, params, f"project:{project_id}")))

    # --- users and memberships ------------------------------------------------------------

    async def create_user(self, user: User) -> None:
        try:
            await self._run(self._write(
                "INSERT INTO users (id, created_at) VALUES (%s, %s)", (user.id, user.created_at)
            ))  # fmt: skip
        except psycopg.errors.UniqueViolation:
            raise AlreadyExists(user.id) from None

    async def get_user(self, user_id: str) -> User | None:
        rows = await self._rows("SELECT id, created_at FROM users WHERE id = %s", (user_id,))
        return User(rows[0][0], rows[0][1].astimezone(UTC)) if rows else None

    async def list_users(self) -> list[User]:
        rows = await self._rows("SELECT id, created_at FROM users ORDER BY id")
        return [User(r[0], r[1].astimezone(UTC)) for r in rows]

    async def put_membership(self, membership: Membership) -> None:
        m = membership
        try:
            await self._run(self._write(
                "INSERT INTO memberships (project_id, user_id, role, created_at)"
                " VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (project_id, user_id) DO UPDATE SET role = EXCLUDED.role",
                (m.project_id, m.user_id, m.role.value, m.created_at), f"user:{m.user_id}",
            ))  # fmt: skip
        except psycopg.errors.ForeignKeyViolation:
            raise KeyError((m.project_id, m.user_id)) from None

    async def remove_membership(self, project_id: str, user_id: str) -> bool:
        count = await self._run(self._write(
            "DELETE FROM memberships WHERE project_id = %s AND user_id = %s",
            (project_id, user_id), f"user:{user_id}",
        ))  # fmt: skip
        return bool(count)

    async def members_of(
        self, project_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Membership]:
        rows = await self._rows(
            "SELECT project_id, user_id, role, created_at FROM memberships"
            " WHERE project_id = %s AND (%s::text IS NULL OR user_id > %s)"
            " ORDER BY user_id LIMIT %s",
            (project_id, after, after, limit),
        )
        return [Membership(r[0], r[1], Role(r[2]), r[3].astimezone(UTC)) for r in rows]

    async def memberships_of(self, user_id: str) -> list[Membership]:
        rows = await self._rows(
            "SELECT project_id, user_id, role, created_at FROM memberships"
            " WHERE user_id = %s ORDER BY project_id",
            (user_id,),
        )
        return [Membership(r[0], r[1], Role(r[2]), r[3].astimezone(UTC)) for r in rows]

    # --- keys -------------------------------------------------------------------------------

    async def add_key(self, key: UserKey) -> None:
        try:
            await self._run(self._write(
                "INSERT INTO user_keys (" + _KEY_COLUMNS + ")"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (key.id, key.user_id, key.name, key.key_hash, key.hint, key.created_at,
                 key.last_used_at, key.revoked_at, key.project_id),
            ))  # fmt: skip
        except psycopg.errors.UniqueViolation:
            raise AlreadyExists(key.id) from None
        except psycopg.errors.ForeignKeyViolation:
            raise KeyError(key.user_id) from None

    async def keys_of(
        self,
        user_id: str,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[UserKey]:
        at, key_id = (None, None) if after is None else after
        rows = await self._rows(
            "SELECT " + _KEY_COLUMNS + " FROM user_keys WHERE user_id = %s"
            " AND (%s::timestamptz IS NULL OR (created_at, id) > (%s::timestamptz, %s))"
            " ORDER BY created_at, id LIMIT %s",
            (user_id, at, at, key_id, limit),
        )
        return [_key(r) for r in rows]

    async def key_by_hash(self, key_hash: bytes) -> UserKey | None:
        rows = await self._rows(
            "SELECT " + _KEY_COLUMNS + " FROM user_keys WHERE key_hash = %s", (key_hash,)
        )
        return _key(rows[0]) if rows else None

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        count = await self._run(self._write(
            "UPDATE user_keys SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL",
            (at, key_id), f"key:{key_id}",
        ))  # fmt: skip
        return bool(count)

    async def touch_keys(self, last_used: Mapping[str, datetime]) -> None:
        def touch(conn: Conn) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    "UPDATE user_keys SET last_used_at = GREATEST(COALESCE(last_used_at, %s), %s)"
                    " WHERE id = %s",
                    [(at, at, key_id) for key_id, at in last_used.items()],
                )

        if last_used:
            await self._run(touch)

    # --- audit log ---------------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        def insert(conn: Conn) -> int:
            row = conn.execute(
                "INSERT INTO audit_log (at, project_id, actor, action, target, detail)"
                " VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                (entry.at, entry.project_id, entry.actor, entry.action.value, entry.target,
                 json.dumps(dict(entry.detail), sort_keys=True)),
            ).fetchone()  # fmt: skip
            assert row is not None
            return int(row[0])

        entry_id = await self._run(insert)
        return AuditEntry(
            entry.at,
            entry.project_id,
            entry.actor,
            entry.action,
            entry.target,
            entry.detail,
            entry_id,
        )

    async def audit(
        self,
        project_id: str | None,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        actions: Sequence[AuditAction] = (),
        limit: int = 1000,
        after: int | None = None,
    ) -> list[AuditEntry]:
        rows = await self._rows(
            "SELECT id, at, project_id, actor, action, target, detail FROM audit_log"
            " WHERE (%s::text IS NULL OR project_id = %s)"
            " AND (%s::timestamptz IS NULL OR at >= %s)"
            " AND (%s::timestamptz IS NULL OR at < %s)"
            " AND (cardinality(%s::text[]) = 0 OR action = ANY(%s::text[]))"
            " AND id > %s"
            " ORDER BY id LIMIT %s",
            (project_id, project_id, since, since, until, until,
             [a.value for a in actions], [a.value for a in actions], after or 0, limit),
        )  # fmt: skip
        return [
            AuditEntry(
                id=int(r[0]),
                at=r[1].astimezone(UTC),
                project_id=r[2],
                actor=r[3],
                action=AuditAction(r[4]),
                target=r[5],
                detail=r[6] if isinstance(r[6], dict) else json.loads(r[6]),
            )
            for r in rows
        ]

    # --- usage ---------------------------------------------------------------------------------

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        def add(conn: Conn) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO usage_hourly (" + _USAGE_COLUMNS + ")"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (endpoint_id, hour, gpu_type, gpu_count) DO UPDATE SET"
                    " replica_seconds = usage_hourly.replica_seconds + EXCLUDED.replica_seconds,"
                    " requests = usage_hourly.requests + EXCLUDED.requests,"
                    " prompt_tokens = usage_hourly.prompt_tokens + EXCLUDED.prompt_tokens,"
                    " completion_tokens = usage_hourly.completion_tokens"
                    " + EXCLUDED.completion_tokens,"
                    " images = usage_hourly.images + EXCLUDED.images,"
                    " cost = usage_hourly.cost + EXCLUDED.cost",
                    [
                        (d.endpoint_id, d.project_id, d.hour, d.gpu_type, d.gpu_count,
                         d.replica_seconds, d.requests, d.prompt_tokens, d.completion_tokens,
                         d.images, d.cost)
                        for d in deltas
                    ],
                )  # fmt: skip

        if deltas:
            await self._run(add)

    async def usage(
        self,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: UsageKey | None = None,
        limit: int | None = None,
    ) -> list[UsageRow]:
        at, key_id, gpu_type, gpu_count = after if after is not None else (None, None, None, None)
        rows = await self._rows(
            "SELECT " + _USAGE_COLUMNS + " FROM usage_hourly WHERE " + _USAGE_WHERE
            + " AND (%s::timestamptz IS NULL"
            " OR (hour, endpoint_id, gpu_type, gpu_count) > (%s::timestamptz, %s, %s, %s))"
            " ORDER BY hour, endpoint_id, gpu_type, gpu_count LIMIT %s",
            (endpoint_id, endpoint_id, project_id, project_id, since, since, until, until,
             at, at, key_id, gpu_type, gpu_count, limit),
        )  # fmt: skip
        return [_usage(r) for r in rows]

    async def usage_totals(
        self,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> UsageTotals:
        rows = await self._rows(
            "SELECT COALESCE(SUM(replica_seconds), 0), COALESCE(SUM(requests), 0),"
            " COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),"
            " COALESCE(SUM(images), 0), COALESCE(SUM(cost), 0)"
            " FROM usage_hourly WHERE " + _USAGE_WHERE,
            (endpoint_id, endpoint_id, project_id, project_id, since, since, until, until),
        )
        r = rows[0]
        return UsageTotals(float(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]))

    async def costs_since(self, since: datetime) -> dict[str, float]:
        rows = await self._rows(
            "SELECT endpoint_id, SUM(cost) FROM usage_hourly WHERE hour >= %s GROUP BY endpoint_id",
            (since,),
        )
        return {r[0]: float(r[1]) for r in rows}
