"""Accounts in the SQLite store: schema (one migration of the store's list)
and `SqliteAccounts`, the accounts half of the SQLite adapter.

`SqliteAccounts` is a mixin over the store's own connection and transaction
helpers, so account writes share its file, lock, WAL and durability (every
write is committed and fsynced when it returns). The audit log refuses
UPDATE and DELETE with triggers: append-only is the database's rule, not
only the code's. Usage rows are added to with UPSERT, never overwritten.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

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
    rfc3339,
)
from inferd.control.accounts.ports import AlreadyExists
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Role
from inferd.control.model import ChangeKind

T = TypeVar("T")

ACCOUNT_TABLES_SQLITE: tuple[str, ...] = (
    """
    CREATE TABLE projects (
        id         TEXT PRIMARY KEY,
        created_at TEXT NOT NULL,
        -- {"endpoints": int|null, "replicas": int|null, "gpus": {type: int}}
        quota      TEXT NOT NULL DEFAULT '{}'
    ) STRICT
    """,
    """
    INSERT INTO projects (id, created_at)
    VALUES ('default', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
    """,
    """
    CREATE TABLE users (
        id         TEXT PRIMARY KEY,
        created_at TEXT NOT NULL
    ) STRICT
    """,
    """
    CREATE TABLE memberships (
        project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
        user_id    TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        role       TEXT NOT NULL CHECK (role IN ('admin', 'developer', 'viewer')),
        created_at TEXT NOT NULL,
        PRIMARY KEY (project_id, user_id)
    ) STRICT
    """,
    "CREATE INDEX memberships_by_user ON memberships (user_id)",
    """
    CREATE TABLE user_keys (
        id           TEXT PRIMARY KEY,
        user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        name         TEXT NOT NULL,
        key_hash     BLOB NOT NULL UNIQUE,
        hint         TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        last_used_at TEXT,
        revoked_at   TEXT
    ) STRICT
    """,
    "CREATE INDEX user_keys_by_user ON user_keys (user_id)",
    """
    CREATE TABLE audit_log (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         TEXT NOT NULL,
        project_id TEXT,
        actor      TEXT NOT NULL,
        action     TEXT NOT NULL,
        target     TEXT NOT NULL,
        detail     TEXT NOT NULL
    ) STRICT
    """,
    "CREATE INDEX audit_log_by_project ON audit_log (project_id, at)",
    """
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END
    """,
    """
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END
    """,
    # No reference to endpoints: usage and its cost outlive a deleted endpoint.
    """
    CREATE TABLE usage_hourly (
        endpoint_id       TEXT NOT NULL,
        project_id        TEXT NOT NULL,
        hour              TEXT NOT NULL,
        gpu_type          TEXT NOT NULL,
        gpu_count         INTEGER NOT NULL,
        replica_seconds   REAL NOT NULL DEFAULT 0,
        requests          INTEGER NOT NULL DEFAULT 0,
        prompt_tokens     INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0,
        images            INTEGER NOT NULL DEFAULT 0,
        cost              REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (endpoint_id, hour, gpu_type, gpu_count)
    ) STRICT
    """,
    "CREATE INDEX usage_hourly_by_project ON usage_hourly (project_id, hour)",
)


def _at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


def _at_required(value: str) -> datetime:
    at = _at(value)
    assert at is not None
    return at


def quota_to_json(quota: Quota) -> str:
    return json.dumps(quota.to_dict(), sort_keys=True)


def quota_from_json(text: str) -> Quota:
    data = json.loads(text or "{}")
    return Quota(
        endpoints=data.get("endpoints"),
        replicas=data.get("replicas"),
        gpus={str(k): int(v) for k, v in (data.get("gpus") or {}).items()},
    )


_PROJECT_COLUMNS = "id, created_at, quota, quota_limit"


def _project(row: Any) -> Project:
    return Project(row[0], _at_required(row[1]), quota_from_json(row[2]), quota_from_json(row[3]))


_KEY_COLUMNS = "id, user_id, name, key_hash, hint, created_at, last_used_at, revoked_at, project_id"
_USAGE_COLUMNS = (
    "endpoint_id, project_id, hour, gpu_type, gpu_count, replica_seconds, requests,"
    " prompt_tokens, completion_tokens, images, cost"
)


def _key(row: Sequence[Any]) -> UserKey:
    return UserKey(
        id=row[0],
        user_id=row[1],
        name=row[2],
        key_hash=bytes(row[3]),
        hint=row[4],
        created_at=_at_required(row[5]),
        last_used_at=_at(row[6]),
        revoked_at=_at(row[7]),
        project_id=row[8],
    )


def _usage(row: Sequence[Any]) -> UsageRow:
    return UsageRow(
        endpoint_id=row[0],
        project_id=row[1],
        hour=_at_required(row[2]),
        gpu_type=row[3],
        gpu_count=int(row[4]),
        replica_seconds=float(row[5]),
        requests=int(row[6]),
        prompt_tokens=int(row[7]),
        completion_tokens=int(row[8]),
        images=int(row[9]),
        cost=float(row[10]),
    )


def _audit(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(
        id=int(row[0]),
        at=_at_required(row[1]),
        project_id=row[2],
        actor=row[3],
        action=AuditAction(row[4]),
        target=row[5],
        detail=json.loads(row[6]),
    )


def _usage_where(
    endpoint_id: str | None,
    project_id: str | None,
    since: datetime | None,
    until: datetime | None,
) -> tuple[str, list[Any]]:
    where, params = "1 = 1", []
    for column, value in (("endpoint_id", endpoint_id), ("project_id", project_id)):
        if value is not None:
            where += f" AND {column} = ?"
            params.append(value)
    if since is not None:
        where += " AND hour >= ?"
        params.append(rfc3339(since))
    if until is not None:
        where += " AND hour < ?"
        params.append(rfc3339(until))
    return where, params


class SqliteAccounts:
    """Needs the host store's `_tx()` (an IMMEDIATE transaction), `_query`,
    `_run` (its database thread) and `_log` (its change log)."""

    _tx: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _query: Callable[..., list[tuple[Any, ...]]]
    _run: Callable[..., Awaitable[Any]]
    _log: Callable[[sqlite3.Connection, ChangeKind, str], None]

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        result: T = await self._run(fn, *args)
        return result

    def _write(self, sql: str, params: tuple[Any, ...], change: str | None = None) -> int:
        """One statement in a transaction; `change`: the account change other
        instances must hear of (their principal and quota caches)."""
        with self._tx() as conn:
            count = conn.execute(sql, params).rowcount
            if change is not None and count:
                self._log(conn, ChangeKind.ACCOUNT, change)
            return count

    # --- projects ------------------------------------------------------------------------

    async def create_project(self, project: Project) -> None:
        try:
            await self._in_thread(
                self._write,
                "INSERT INTO projects (id, created_at, quota, quota_limit) VALUES (?, ?, ?, ?)",
                (
                    project.id,
                    rfc3339(project.created_at),
                    quota_to_json(project.quota),
                    quota_to_json(project.limit),
                ),
            )
        except sqlite3.IntegrityError:
            raise AlreadyExists(project.id) from None

    async def get_project(self, project_id: str) -> Project | None:
        rows = await self._in_thread(
            self._query, f"SELECT {_PROJECT_COLUMNS} FROM projects WHERE id = ?", (project_id,)
        )
        return _project(rows[0]) if rows else None

    async def list_projects(self) -> list[Project]:
        rows = await self._in_thread(
            self._query, f"SELECT {_PROJECT_COLUMNS} FROM projects ORDER BY id"
        )
        return [_project(r) for r in rows]

    async def delete_project(self, project_id: str) -> bool:
        # Memberships go with it (ON DELETE CASCADE); audit and usage stay.
        count = await self._in_thread(
            self._write, "DELETE FROM projects WHERE id = ?", (project_id,), f"project:{project_id}"
        )
        return count > 0

    async def set_quota(self, project_id: str, quota: Quota) -> bool:
        return await self._set_project(
            "UPDATE projects SET quota = ? WHERE id = ?", project_id, quota
        )

    async def set_quota_limit(self, project_id: str, limit: Quota) -> bool:
        return await self._set_project(
            "UPDATE projects SET quota_limit = ? WHERE id = ?", project_id, limit
        )

    async def _set_project(self, sql: str, project_id: str, quota: Quota) -> bool:
        params = (quota_to_json(quota), project_id)
        count = await self._in_thread(self._write, sql, params, f"project:{project_id}")
        return count > 0

    # --- users and memberships ---------------------------------------------------------------

    async def create_user(self, user: User) -> None:
        try:
            await self._in_thread(
                self._write,
                "INSERT INTO users (id, created_at) VALUES (?, ?)",
                (user.id, rfc3339(user.created_at)),
            )
        except sqlite3.IntegrityError:
            raise AlreadyExists(user.id) from None

    async def get_user(self, user_id: str) -> User | None:
        rows = await self._in_thread(
            self._query, "SELECT id, created_at FROM users WHERE id = ?", (user_id,)
        )
        return User(rows[0][0], _at_required(rows[0][1])) if rows else None

    async def list_users(self) -> list[User]:
        rows = await self._in_thread(self._query, "SELECT id, created_at FROM users ORDER BY id")
        return [User(r[0], _at_required(r[1])) for r in rows]

    async def put_membership(self, membership: Membership) -> None:
        try:
            await self._in_thread(
                self._write,
                "INSERT INTO memberships (project_id, user_id, role, created_at)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (project_id, user_id) DO UPDATE SET role = excluded.role",
                (
                    membership.project_id,
                    membership.user_id,
                    membership.role.value,
                    rfc3339(membership.created_at),
                ),
                f"user:{membership.user_id}",
            )
        except sqlite3.IntegrityError:
            raise KeyError((membership.project_id, membership.user_id)) from None

    async def remove_membership(self, project_id: str, user_id: str) -> bool:
        count = await self._in_thread(
            self._write,
            "DELETE FROM memberships WHERE project_id = ? AND user_id = ?",
            (project_id, user_id),
            f"user:{user_id}",
        )
        return count > 0

    def _memberships(
        self, where: str, value: str, order: str, after: str | None = None, limit: int = -1
    ) -> list[Membership]:
        # `order` is the key of the page: the primary key's index serves it.
        rows = self._query(
            f"SELECT project_id, user_id, role, created_at FROM memberships WHERE {where} = ?"
            f" AND (? IS NULL OR {order} > ?) ORDER BY {order} LIMIT ?",
            (value, after, after, limit),
        )
        return [Membership(r[0], r[1], Role(r[2]), _at_required(r[3])) for r in rows]

    async def members_of(
        self, project_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Membership]:
        return await self._in_thread(
            self._memberships, "project_id", project_id, "user_id", after,
            -1 if limit is None else limit,
        )  # fmt: skip

    async def memberships_of(self, user_id: str) -> list[Membership]:
        return await self._in_thread(self._memberships, "user_id", user_id, "project_id")

    # --- keys ------------------------------------------------------------------------------

    async def add_key(self, key: UserKey) -> None:
        def insert() -> None:
            with self._tx() as conn:
                if (
                    conn.execute("SELECT 1 FROM users WHERE id = ?", (key.user_id,)).fetchone()
                    is None
                ):
                    raise KeyError(key.user_id)
                conn.execute(
                    f"INSERT INTO user_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        key.id, key.user_id, key.name, key.key_hash, key.hint,
                        rfc3339(key.created_at),
                        rfc3339(key.last_used_at) if key.last_used_at else None,
                        rfc3339(key.revoked_at) if key.revoked_at else None,
                        key.project_id,
                    ),
                )  # fmt: skip

        try:
            await self._in_thread(insert)
        except sqlite3.IntegrityError:
            raise AlreadyExists(key.id) from None

    async def keys_of(
        self,
        user_id: str,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[UserKey]:
        # Times are stored as fixed-width RFC 3339 text: text order is time order.
        at, key_id = (None, None) if after is None else (rfc3339(after[0]), after[1])
        rows = await self._in_thread(
            self._query,
            f"SELECT {_KEY_COLUMNS} FROM user_keys WHERE user_id = ?"
            " AND (? IS NULL OR (created_at, id) > (?, ?)) ORDER BY created_at, id LIMIT ?",
            (user_id, at, at, key_id, -1 if limit is None else limit),
        )
        return [_key(r) for r in rows]

    async def key_by_hash(self, key_hash: bytes) -> UserKey | None:
        rows = await self._in_thread(
            self._query, f"SELECT {_KEY_COLUMNS} FROM user_keys WHERE key_hash = ?", (key_hash,)
        )
        return _key(rows[0]) if rows else None

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        count = await self._in_thread(
            self._write,
            "UPDATE user_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (rfc3339(at), key_id),
            f"key:{key_id}",
        )
        return count > 0

    async def touch_keys(self, last_used: Mapping[str, datetime]) -> None:
        def touch() -> None:
            with self._tx() as conn:
                conn.executemany(
                    "UPDATE user_keys SET last_used_at = ?"
                    " WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)",
                    [(rfc3339(at), key_id, rfc3339(at)) for key_id, at in last_used.items()],
                )

        await self._in_thread(touch)

    # --- audit log --------------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        def insert() -> int:
            with self._tx() as conn:
                cur = conn.execute(
                    "INSERT INTO audit_log (at, project_id, actor, action, target, detail)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        rfc3339(entry.at), entry.project_id, entry.actor, entry.action.value,
                        entry.target, json.dumps(dict(entry.detail), sort_keys=True),
                    ),
                )  # fmt: skip
                return int(cur.lastrowid or 0)

        entry_id = await self._in_thread(insert)
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
        sql = "SELECT id, at, project_id, actor, action, target, detail FROM audit_log WHERE 1 = 1"
        params: list[Any] = []
        if project_id is not None:
            sql += " AND project_id = ?"
            params.append(project_id)
        if since is not None:
            sql += " AND at >= ?"
            params.append(rfc3339(since))
        if until is not None:
            sql += " AND at < ?"
            params.append(rfc3339(until))
        if actions:
            sql += f" AND action IN ({', '.join('?' for _ in actions)})"
            params.extend(a.value for a in actions)
        if after is not None:
            sql += " AND id > ?"
            params.append(after)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        rows = await self._in_thread(self._query, sql, tuple(params))
        return [_audit(r) for r in rows]

    # --- usage --------------------------------------------------------------------------------

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        def add() -> None:
            with self._tx() as conn:
                conn.executemany(
                    f"INSERT INTO usage_hourly ({_USAGE_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (endpoint_id, hour, gpu_type, gpu_count) DO UPDATE SET"
                    " replica_seconds = replica_seconds + excluded.replica_seconds,"
                    " requests = requests + excluded.requests,"
                    " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
                    " completion_tokens = completion_tokens + excluded.completion_tokens,"
                    " images = images + excluded.images,"
                    " cost = cost + excluded.cost",
                    [
                        (
                            d.endpoint_id, d.project_id, rfc3339(d.hour), d.gpu_type, d.gpu_count,
                            d.replica_seconds, d.requests, d.prompt_tokens, d.completion_tokens,
                            d.images, d.cost,
                        )
                        for d in deltas
                    ],
                )  # fmt: skip

        if deltas:
            await self._in_thread(add)

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
        where, params = _usage_where(endpoint_id, project_id, since, until)
        if after is not None:
            # Hours are fixed-width RFC 3339 text: text order is time order.
            where += " AND (hour, endpoint_id, gpu_type, gpu_count) > (?, ?, ?, ?)"
            params += [rfc3339(after[0]), *after[1:]]
        sql = (
            f"SELECT {_USAGE_COLUMNS} FROM usage_hourly WHERE {where}"
            " ORDER BY hour, endpoint_id, gpu_type, gpu_count LIMIT ?"
        )
        rows = await self._in_thread(self._query, sql, (*params, -1 if limit is None else limit))
        return [_usage(r) for r in rows]

    async def usage_totals(
        self,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> UsageTotals:
        where, params = _usage_where(endpoint_id, project_id, since, until)
        rows = await self._in_thread(
            self._query,
            "SELECT TOTAL(replica_seconds), TOTAL(requests), TOTAL(prompt_tokens),"
            " TOTAL(completion_tokens), TOTAL(images), TOTAL(cost)"
            f" FROM usage_hourly WHERE {where}",
            tuple(params),
        )
        r = rows[0]
        return UsageTotals(float(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]))

    async def costs_since(self, since: datetime) -> dict[str, float]:
        rows = await self._in_thread(
            self._query,
            "SELECT endpoint_id, SUM(cost) FROM usage_hourly WHERE hour >= ? GROUP BY endpoint_id",
            (rfc3339(since),),
        )
        return {r[0]: float(r[1]) for r in rows}
