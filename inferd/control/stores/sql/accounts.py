"""Projects, users and their memberships, management keys, the audit log and
usage (`AccountStore`).

The audit log refuses UPDATE and DELETE by trigger (append-only is the
database's rule, not only the code's). Usage rows are only added to
(`ON CONFLICT DO UPDATE SET x = x + excluded.x`), so instances sharing the
database add up. Account changes go to the change log (`ChangeKind.ACCOUNT`),
so every instance drops what it cached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

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
from inferd.control.model import ChangeKind
from inferd.control.stores.sql.database import Tx, Violation
from inferd.control.stores.sql.repository import Repository, Where
from inferd.control.stores.sql.tables import (
    AUDIT_LOG,
    MEMBERSHIPS,
    PROJECTS,
    USAGE,
    USER_KEYS,
    USERS,
)

_SUMMED = ("replica_seconds", "requests", "prompt_tokens", "completion_tokens", "images", "cost")
# One delta added to its hourly row (made when absent).
ADD_USAGE = USAGE.upsert(added=_SUMMED)
_PUT_MEMBERSHIP = MEMBERSHIPS.upsert(replaced=("role",))
_BY_HOUR = "hour, endpoint_id, gpu_type, gpu_count"  # a usage key (`UsageKey`), the order of pages


class Accounts(Repository):
    async def _account_write(self, statement: str, params: Sequence[Any], change: str) -> int:
        """One statement; `change`: what other instances must drop from their
        principal and quota caches."""
        return await self._change(statement, params, ChangeKind.ACCOUNT, change)

    # --- projects ------------------------------------------------------------------------

    async def create_project(self, project: Project) -> None:
        await self._add(PROJECTS, project, None, duplicate=AlreadyExists(project.id))

    async def get_project(self, project_id: str) -> Project | None:
        return await self._get(PROJECTS, project_id)

    async def list_projects(self) -> list[Project]:
        return await self._find(PROJECTS, order="id")

    async def delete_project(self, project_id: str) -> bool:
        # Memberships go with it (ON DELETE CASCADE); audit and usage stay.
        change = f"project:{project_id}"
        return await self._delete(PROJECTS, project_id, kind=ChangeKind.ACCOUNT, change=change)

    async def set_quota(self, project_id: str, quota: Quota) -> bool:
        return await self._set_project("quota", project_id, quota)

    async def set_quota_limit(self, project_id: str, limit: Quota) -> bool:
        return await self._set_project("quota_limit", project_id, limit)

    async def _set_project(self, column: str, project_id: str, quota: Quota) -> bool:
        params = (PROJECTS.encode(self._dialect, column, quota), project_id)
        statement = f"UPDATE projects SET {column} = ? WHERE id = ?"
        return await self._account_write(statement, params, f"project:{project_id}") > 0

    def quota_lock(self, project_id: str) -> AbstractAsyncContextManager[None]:
        return self._dialect.quota_lock(project_id)

    # --- users and memberships ---------------------------------------------------------------

    async def create_user(self, user: User) -> None:
        await self._add(USERS, user, None, duplicate=AlreadyExists(user.id))

    async def get_user(self, user_id: str) -> User | None:
        return await self._get(USERS, user_id)

    async def list_users(self) -> list[User]:
        return await self._find(USERS, order="id")

    async def put_membership(self, membership: Membership) -> None:
        values = MEMBERSHIPS.values(self._dialect, membership)
        try:
            await self._account_write(_PUT_MEMBERSHIP, values, f"user:{membership.user_id}")
        except Violation:
            raise KeyError((membership.project_id, membership.user_id)) from None

    async def remove_membership(self, project_id: str, user_id: str) -> bool:
        return await self._delete(
            MEMBERSHIPS, project_id, user_id, kind=ChangeKind.ACCOUNT, change=f"user:{user_id}"
        )

    async def members_of(
        self, project_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Membership]:
        # By user id: the primary key's index serves the page.
        where = Where("project_id = ?", project_id).add("user_id > ?", after)
        return await self._find(MEMBERSHIPS, where, order="user_id", limit=limit)

    async def memberships_of(self, user_id: str) -> list[Membership]:
        return await self._find(MEMBERSHIPS, Where("user_id = ?", user_id), order="project_id")

    # --- keys ------------------------------------------------------------------------------

    async def add_key(self, key: UserKey) -> None:
        def check(tx: Tx) -> None:
            if tx.one("SELECT 1 FROM users WHERE id = ?", (key.user_id,)) is None:
                raise KeyError(key.user_id)

        try:
            await self._add(USER_KEYS, key, None, duplicate=AlreadyExists(key.id), check=check)
        except Violation:
            raise KeyError(key.user_id) from None

    async def keys_of(
        self, user_id: str, *, after: tuple[datetime, str] | None = None, limit: int | None = None
    ) -> list[UserKey]:
        where = Where("user_id = ?", user_id)
        if after is not None:
            at, key_id = self._time(after[0]), after[1]
            where.add("(created_at > ? OR (created_at = ? AND id > ?))", at, at, key_id)
        return await self._find(USER_KEYS, where, order="created_at, id", limit=limit)

    async def key_by_hash(self, key_hash: bytes) -> UserKey | None:
        keys = await self._find(USER_KEYS, Where("key_hash = ?", key_hash), order="id")
        return keys[0] if keys else None

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        statement = "UPDATE user_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
        return await self._account_write(statement, (self._time(at), key_id), f"key:{key_id}") > 0

    async def touch_keys(self, last_used: Mapping[str, datetime]) -> None:
        await self._touch(USER_KEYS, {(key_id,): at for key_id, at in last_used.items()})

    # --- audit log --------------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        values = AUDIT_LOG.values(self._dialect, entry)

        def write(tx: Tx) -> int:
            row = tx.one(AUDIT_LOG.insert + " RETURNING id", values)
            assert row is not None
            return int(row[0])

        return replace(entry, id=await self._db.write(write))

    async def audit(
        self, project_id: str | None, *, since: datetime | None = None,
        until: datetime | None = None, actions: Sequence[AuditAction] = (), limit: int = 1000,
        after: int | None = None,
    ) -> list[AuditEntry]:  # fmt: skip
        where = self._between("at", since, until).add("project_id = ?", project_id)
        if actions:
            where.among("action", [a.value for a in actions])
        where.add("id > ?", after)
        return await self._find(AUDIT_LOG, where, order="id", limit=limit)

    def _between(self, column: str, since: datetime | None, until: datetime | None) -> Where:
        where = Where(f"{column} >= ?", self._time(since))
        return where.add(f"{column} < ?", self._time(until))

    # --- usage --------------------------------------------------------------------------------

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        if deltas:
            values = [USAGE.values(self._dialect, d) for d in deltas]
            await self._db.write(lambda tx: tx.many(ADD_USAGE, values))

    def _usage_where(
        self, endpoint_id: str | None, project_id: str | None,
        since: datetime | None, until: datetime | None,
    ) -> Where:  # fmt: skip
        where = self._between("hour", since, until).add("endpoint_id = ?", endpoint_id)
        return where.add("project_id = ?", project_id)

    async def usage(
        self, *, endpoint_id: str | None = None, project_id: str | None = None,
        since: datetime | None = None, until: datetime | None = None,
        after: UsageKey | None = None, limit: int | None = None,
    ) -> list[UsageRow]:  # fmt: skip
        where = self._usage_where(endpoint_id, project_id, since, until)
        if after is not None:
            where.add(f"({_BY_HOUR}) > (?, ?, ?, ?)", self._time(after[0]), *after[1:])
        return await self._find(USAGE, where, order=_BY_HOUR, limit=limit)

    async def usage_totals(
        self, *, endpoint_id: str | None = None, project_id: str | None = None,
        since: datetime | None = None, until: datetime | None = None,
    ) -> UsageTotals:  # fmt: skip
        where = self._usage_where(endpoint_id, project_id, since, until)
        sums = ", ".join(f"COALESCE(SUM({c}), 0)" for c in _SUMMED)
        r = (await self._db.rows(f"SELECT {sums} FROM usage_hourly{where}", where.params))[0]
        return UsageTotals(float(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]))

    async def costs_since(self, since: datetime) -> dict[str, float]:
        rows = await self._db.rows(
            "SELECT endpoint_id, SUM(cost) FROM usage_hourly WHERE hour >= ? GROUP BY endpoint_id",
            (self._time(since),),
        )
        return {r[0]: float(r[1]) for r in rows}
