"""The accounts store port: what the service needs from a database.

Adapters: `memory` (tests, and the contract suite's reference), `sqlite`
(embedded), `postgres` (shared by several instances). Every method is a
committed transaction when it returns. Audit entries are only ever
appended; usage is only ever added to (so instances sharing one database
add up instead of overwriting each other).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol

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
from inferd.control.accounts.quota import EndpointShape, Quota


class AlreadyExists(Exception):
    """A project, user or key with this id (or name) exists already."""


class AccountStore(Protocol):
    # --- projects ------------------------------------------------------------------
    async def create_project(self, project: Project) -> None: ...
    async def get_project(self, project_id: str) -> Project | None: ...
    async def list_projects(self) -> list[Project]: ...
    async def set_quota(self, project_id: str, quota: Quota) -> bool: ...
    async def delete_project(self, project_id: str) -> bool:
        """The project and its memberships; its audit entries and usage stay."""
        ...

    async def set_quota_limit(self, project_id: str, limit: Quota) -> bool: ...

    # A quota check and the write it allows, serialised across every
    # instance on this store: under the lock the check reads the project's
    # endpoints from the store (`quota_shapes`), not from a cache that may
    # not have heard of another instance's create yet, and the write commits
    # before the lock is released.
    def quota_lock(self, project_id: str) -> AbstractAsyncContextManager[None]: ...
    async def quota_shapes(self, project_id: str) -> list[EndpointShape]: ...
    async def count_endpoints(self, project_id: str) -> int:
        """The project's endpoints, those being deleted included."""
        ...

    # --- users and memberships -----------------------------------------------------------
    async def create_user(self, user: User) -> None: ...
    async def get_user(self, user_id: str) -> User | None: ...
    async def list_users(self) -> list[User]: ...
    async def put_membership(self, membership: Membership) -> None: ...
    async def remove_membership(self, project_id: str, user_id: str) -> bool: ...
    async def members_of(
        self, project_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Membership]:
        """By user id; a keyset page: only user ids past `after`, at most `limit`."""
        ...

    async def memberships_of(self, user_id: str) -> list[Membership]: ...

    # --- management keys -----------------------------------------------------------
    async def add_key(self, key: UserKey) -> None: ...
    async def keys_of(
        self,
        user_id: str,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[UserKey]:
        """Oldest first (created at, then id); a keyset page: only keys past
        `after` (a key's created-at and id), at most `limit`."""
        ...

    async def key_by_hash(self, key_hash: bytes) -> UserKey | None: ...
    async def revoke_key(self, key_id: str, at: datetime) -> bool: ...
    async def touch_keys(self, last_used: Mapping[str, datetime]) -> None: ...

    # --- audit log ---------------------------------------------------------------------
    async def append_audit(self, entry: AuditEntry) -> AuditEntry: ...
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
        """Oldest first, at most `limit`, only entries whose id is past
        `after` (a keyset page: ids only grow)."""
        ...

    # --- usage -----------------------------------------------------------------------------
    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None: ...
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
        """By hour, endpoint, GPU type and count (`usage_order`); a keyset
        page: only rows past `after` in that order, at most `limit`."""
        ...

    async def usage_totals(
        self,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> UsageTotals:
        """The sums of every row `usage` would list (summed in the database)."""
        ...

    async def costs_since(self, since: datetime) -> dict[str, float]:
        """Endpoint id -> cost of its usage in the hours from `since` on."""
        ...
