"""In-memory accounts store: tests, and the reference the contract suite
holds the database adapters to."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from inferd.control.accounts.model import (
    DEFAULT_PROJECT,
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
    usage_order,
    utc_now,
)
from inferd.control.accounts.ports import AlreadyExists
from inferd.control.accounts.quota import Quota


def add_to(row: UsageRow, delta: UsageDelta) -> UsageRow:
    return dataclasses.replace(
        row,
        replica_seconds=row.replica_seconds + delta.replica_seconds,
        requests=row.requests + delta.requests,
        prompt_tokens=row.prompt_tokens + delta.prompt_tokens,
        completion_tokens=row.completion_tokens + delta.completion_tokens,
        images=row.images + delta.images,
        cost=row.cost + delta.cost,
    )


class MemoryAccountStore:
    """Also the accounts half of `inferd.control.stores.memory.MemoryStore`,
    which publishes `_account_changed` on its change feed."""

    def _account_changed(self, key: str) -> None:
        return None

    def __init__(self) -> None:
        # As the databases' migrations do: the default project exists.
        self._projects: dict[str, Project] = {DEFAULT_PROJECT: Project(DEFAULT_PROJECT, utc_now())}
        self._users: dict[str, User] = {}
        self._members: dict[tuple[str, str], Membership] = {}
        self._keys: dict[str, UserKey] = {}
        self._audit: list[AuditEntry] = []
        self._usage: dict[tuple[str, datetime, str, int], UsageRow] = {}

    async def create_project(self, project: Project) -> None:
        if project.id in self._projects:
            raise AlreadyExists(project.id)
        self._projects[project.id] = project

    async def get_project(self, project_id: str) -> Project | None:
        return self._projects.get(project_id)

    async def list_projects(self) -> list[Project]:
        return sorted(self._projects.values(), key=lambda p: p.id)

    async def delete_project(self, project_id: str) -> bool:
        if self._projects.pop(project_id, None) is None:
            return False
        for key in [k for k in self._members if k[0] == project_id]:
            del self._members[key]
        self._account_changed(f"project:{project_id}")
        return True

    async def set_quota(self, project_id: str, quota: Quota) -> bool:
        return self._change_project(project_id, quota=quota)

    async def set_quota_limit(self, project_id: str, limit: Quota) -> bool:
        return self._change_project(project_id, limit=limit)

    def _change_project(
        self, project_id: str, *, quota: Quota | None = None, limit: Quota | None = None
    ) -> bool:
        project = self._projects.get(project_id)
        if project is None:
            return False
        self._projects[project_id] = dataclasses.replace(
            project, quota=quota or project.quota, limit=limit or project.limit
        )
        self._account_changed(f"project:{project_id}")
        return True

    async def create_user(self, user: User) -> None:
        if user.id in self._users:
            raise AlreadyExists(user.id)
        self._users[user.id] = user

    async def get_user(self, user_id: str) -> User | None:
        return self._users.get(user_id)

    async def list_users(self) -> list[User]:
        return sorted(self._users.values(), key=lambda u: u.id)

    async def put_membership(self, membership: Membership) -> None:
        if membership.project_id not in self._projects or membership.user_id not in self._users:
            raise KeyError((membership.project_id, membership.user_id))
        key = (membership.project_id, membership.user_id)
        old = self._members.get(key)
        if old is not None:
            membership = dataclasses.replace(membership, created_at=old.created_at)
        self._members[key] = membership
        self._account_changed(f"user:{membership.user_id}")

    async def remove_membership(self, project_id: str, user_id: str) -> bool:
        removed = self._members.pop((project_id, user_id), None) is not None
        if removed:
            self._account_changed(f"user:{user_id}")
        return removed

    async def members_of(
        self, project_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Membership]:
        found = sorted(
            (m for m in self._members.values()
             if m.project_id == project_id and (after is None or m.user_id > after)),
            key=lambda m: m.user_id,
        )  # fmt: skip
        return found if limit is None else found[:limit]

    async def memberships_of(self, user_id: str) -> list[Membership]:
        return sorted(
            (m for m in self._members.values() if m.user_id == user_id),
            key=lambda m: m.project_id,
        )

    async def add_key(self, key: UserKey) -> None:
        if key.id in self._keys or any(k.key_hash == key.key_hash for k in self._keys.values()):
            raise AlreadyExists(key.id)
        if key.user_id not in self._users:
            raise KeyError(key.user_id)
        self._keys[key.id] = key

    async def keys_of(
        self,
        user_id: str,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[UserKey]:
        found = sorted(
            (k for k in self._keys.values()
             if k.user_id == user_id and (after is None or (k.created_at, k.id) > after)),
            key=lambda k: (k.created_at, k.id),
        )  # fmt: skip
        return found if limit is None else found[:limit]

    async def key_by_hash(self, key_hash: bytes) -> UserKey | None:
        for key in self._keys.values():
            if key.key_hash == key_hash:
                return key
        return None

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        key = self._keys.get(key_id)
        if key is None or key.revoked_at is not None:
            return False
        self._keys[key_id] = dataclasses.replace(key, revoked_at=at)
        self._account_changed(f"key:{key_id}")
        return True

    async def touch_keys(self, last_used: Mapping[str, datetime]) -> None:
        for key_id, at in last_used.items():
            key = self._keys.get(key_id)
            if key is not None and (key.last_used_at is None or key.last_used_at < at):
                self._keys[key_id] = dataclasses.replace(key, last_used_at=at)

    async def append_audit(self, entry: AuditEntry) -> AuditEntry:
        entry = dataclasses.replace(entry, id=len(self._audit) + 1)
        self._audit.append(entry)
        return entry

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
        found = [
            e
            for e in self._audit
            if (project_id is None or e.project_id == project_id)
            and (since is None or e.at >= since)
            and (until is None or e.at < until)
            and (not actions or e.action in actions)
            and (after is None or e.id > after)
        ]
        return found[:limit]

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        for delta in deltas:
            row = self._usage.get(delta.key())
            self._usage[delta.key()] = delta if row is None else add_to(row, delta)

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
        rows = [
            r
            for r in self._usage.values()
            if (endpoint_id is None or r.endpoint_id == endpoint_id)
            and (project_id is None or r.project_id == project_id)
            and (since is None or r.hour >= since)
            and (until is None or r.hour < until)
            and (after is None or usage_order(r) > after)
        ]
        rows.sort(key=usage_order)
        return rows if limit is None else rows[:limit]

    async def usage_totals(
        self,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> UsageTotals:
        rows = await self.usage(
            endpoint_id=endpoint_id, project_id=project_id, since=since, until=until
        )
        return UsageTotals().plus(rows)

    async def costs_since(self, since: datetime) -> dict[str, float]:
        costs: dict[str, float] = {}
        for r in self._usage.values():
            if r.hour >= since:
                costs[r.endpoint_id] = costs.get(r.endpoint_id, 0.0) + r.cost
        return costs
