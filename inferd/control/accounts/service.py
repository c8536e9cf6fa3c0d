"""Accounts as a service: projects, members, management keys, quotas, the
audit log and usage queries. Every method takes the acting `Principal` and
checks it, so HTTP routes, the CLI's server side and the console all call
the same checks.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inferd.control.accounts.keys import key_hint, new_key_id, new_user_key
from inferd.control.accounts.model import (
    DEFAULT_PROJECT,
    AuditAction,
    AuditEntry,
    Membership,
    Project,
    User,
    UserKey,
    rfc3339,
)
from inferd.control.accounts.ports import AccountStore, AlreadyExists
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.quota import Quota, above_limit
from inferd.control.accounts.roles import Action, Principal, Role, authorize, require_operator
from inferd.control.tokens import hash_token
from inferd.errors import BadRequest, Conflict, Forbidden, NotFound

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_KEYS_PER_USER = 50


def _slug(value: str, what: str) -> str:
    if not SLUG.match(value):
        raise BadRequest(
            f"Invalid {what} '{value}': lowercase letters, digits and '-', 1-63 characters.",
            param=what,
            code="invalid_name",
        )
    return value


def project_missing(project_id: str) -> NotFound:
    return NotFound(f"No project '{project_id}'.", param="id", code="project_not_found")


def _user_missing(user_id: str) -> NotFound:
    return NotFound(f"No user '{user_id}'.", param="userId", code="user_not_found")


@dataclass(frozen=True)
class CreatedKey:
    key: UserKey
    plaintext: str  # shown once, never stored


class AccountService:
    def __init__(
        self,
        store: AccountStore,
        resolver: PrincipalResolver,
        clock: Callable[[], datetime],
    ) -> None:
        self.store = store
        self.resolver = resolver
        self._clock = clock
        # Every project's quota in force, for the autoscaler's synchronous cap: set
        # here after each change, re-read periodically for other instances'.
        self.quotas: dict[str, Quota] = {}

    async def load_quotas(self) -> None:
        self.quotas = {p.id: p.quota_in_force for p in await self.store.list_projects()}

    async def ensure_default_project(self) -> None:
        if await self.store.get_project(DEFAULT_PROJECT) is None:
            # Another instance may make it first.
            with contextlib.suppress(AlreadyExists):
                await self.store.create_project(Project(DEFAULT_PROJECT, self._clock()))

    async def audit_event(
        self,
        principal: Principal,
        action: AuditAction,
        project_id: str | None,
        target: str,
        **detail: object,
    ) -> None:
        await self.store.append_audit(
            AuditEntry(self._clock(), project_id, principal.label, action, target, detail)
        )

    # --- projects ----------------------------------------------------------------------

    async def project(self, principal: Principal, project_id: str) -> Project:
        project = await self.store.get_project(project_id)
        if project is None:
            raise project_missing(project_id)
        authorize(principal, project_id, Action.READ, hidden=project_missing(project_id))
        return project

    async def projects(self, principal: Principal) -> list[Project]:
        return [p for p in await self.store.list_projects() if principal.sees(p.id)]

    async def create_project(
        self,
        principal: Principal,
        project_id: str,
        quota: Quota | None = None,
        limit: Quota | None = None,
    ) -> Project:
        require_operator(principal, "create projects")
        project = Project(
            _slug(project_id, "id"), self._clock(), quota or Quota(), limit or Quota()
        )
        try:
            await self.store.create_project(project)
        except AlreadyExists:
            raise Conflict(
                f"A project '{project_id}' exists already.", param="id", code="project_exists"
            ) from None
        await self.audit_event(
            principal, AuditAction.PROJECT_CREATE, project.id, f"project:{project.id}"
        )
        return project

    async def set_quota(self, principal: Principal, project_id: str, quota: Quota) -> Project:
        """The project's own quota, set by its admins (or the operator). An
        admin may not go above the operator's limit: a quota the team could
        raise past it would limit nothing."""
        project = await self.project(principal, project_id)
        authorize(principal, project_id, Action.MANAGE, hidden=project_missing(project_id))
        above = above_limit(quota, project.limit)
        if above is not None and not principal.operator:
            raise Forbidden(above.message(project_id), param=above.quota, code="above_quota_limit")
        await self.store.set_quota(project_id, quota)
        await self.audit_event(
            principal, AuditAction.QUOTA_CHANGE, project_id, f"project:{project_id}",
            quota=quota.to_dict(),
        )  # fmt: skip
        return await self._quota_changed(principal, project_id)

    async def set_quota_limit(self, principal: Principal, project_id: str, limit: Quota) -> Project:
        """The operator's limit on what the project may hold, whatever its
        admins set; lowering it under current use stops growth, evicts nothing."""
        await self.project(principal, project_id)
        require_operator(principal, "change a project's quota limit")
        await self.store.set_quota_limit(project_id, limit)
        await self.audit_event(
            principal, AuditAction.QUOTA_CHANGE, project_id, f"project:{project_id}",
            limit=limit.to_dict(),
        )  # fmt: skip
        return await self._quota_changed(principal, project_id)

    async def _quota_changed(self, principal: Principal, project_id: str) -> Project:
        project = await self.project(principal, project_id)
        self.quotas[project_id] = project.quota_in_force
        return project

    # --- members ----------------------------------------------------------------------

    async def members(
        self,
        principal: Principal,
        project_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Membership]:
        await self.project(principal, project_id)
        return await self.store.members_of(project_id, after=after, limit=limit)

    async def put_member(
        self, principal: Principal, project_id: str, user_id: str, role: Role
    ) -> tuple[Membership, CreatedKey | None]:
        """Add (or change the role of) a member. A user name not seen before
        creates the user and a first key for them, returned once."""
        await self.project(principal, project_id)
        authorize(principal, project_id, Action.MANAGE, hidden=project_missing(project_id))
        _slug(user_id, "userId")
        created: CreatedKey | None = None
        if await self.store.get_user(user_id) is None:
            try:
                await self.store.create_user(User(user_id, self._clock()))
                await self.audit_event(
                    principal, AuditAction.USER_CREATE, project_id, f"user:{user_id}"
                )
                created = await self._new_key(principal, user_id, "first key", project_id)
            except AlreadyExists:
                pass
        old = {m.user_id: m for m in await self.store.members_of(project_id)}.get(user_id)
        membership = Membership(project_id, user_id, role, self._clock())
        await self.store.put_membership(membership)
        self.resolver.forget_user(user_id)
        action = AuditAction.MEMBER_ADD if old is None else AuditAction.MEMBER_CHANGE
        await self.audit_event(
            principal, action, project_id, f"member:{user_id}",
            role=role.value, **({"previousRole": old.role.value} if old else {}),
        )  # fmt: skip
        if old is not None:
            membership = Membership(project_id, user_id, role, old.created_at)
        return membership, created

    async def remove_member(self, principal: Principal, project_id: str, user_id: str) -> None:
        await self.project(principal, project_id)
        authorize(principal, project_id, Action.MANAGE, hidden=project_missing(project_id))
        if not await self.store.remove_membership(project_id, user_id):
            raise NotFound(
                f"User '{user_id}' is not a member of '{project_id}'.",
                param="userId",
                code="member_not_found",
            )
        self.resolver.forget_user(user_id)
        await self.audit_event(
            principal, AuditAction.MEMBER_REMOVE, project_id, f"member:{user_id}"
        )

    # --- users and keys -------------------------------------------------------------------

    async def users(self, principal: Principal) -> list[User]:
        require_operator(principal, "list users")
        return await self.store.list_users()

    async def create_user(self, principal: Principal, user_id: str) -> tuple[User, CreatedKey]:
        require_operator(principal, "create users outside a project")
        user = User(_slug(user_id, "id"), self._clock())
        try:
            await self.store.create_user(user)
        except AlreadyExists:
            raise Conflict(
                f"A user '{user_id}' exists already.", param="id", code="user_exists"
            ) from None
        await self.audit_event(principal, AuditAction.USER_CREATE, None, f"user:{user_id}")
        return user, await self._new_key(principal, user_id, "first key", None)

    async def user_scope(self, principal: Principal, user_id: str) -> str | None:
        """The project the caller manages `user_id`'s keys through (None: self
        or operator); 404 when the caller may not see the user at all."""
        if principal.operator or principal.id == user_id:
            if await self.store.get_user(user_id) is None:
                raise _user_missing(user_id)
            return None
        for m in await self.store.memberships_of(user_id):
            if principal.may(Action.MANAGE, m.project_id):
                return m.project_id
        raise _user_missing(user_id)

    async def keys(self, principal: Principal, user_id: str) -> list[UserKey]:
        await self.user_scope(principal, user_id)
        return await self.store.keys_of(user_id)

    async def create_key(self, principal: Principal, user_id: str, name: str) -> CreatedKey:
        project_id = await self.user_scope(principal, user_id)
        active = [k for k in await self.store.keys_of(user_id) if k.revoked_at is None]
        if len(active) >= MAX_KEYS_PER_USER:
            raise Conflict(
                f"User '{user_id}' has {len(active)} active keys, the most allowed; "
                "revoke one first.",
                code="key_limit_reached",
            )
        return await self._new_key(principal, user_id, name, project_id)

    async def _new_key(
        self, principal: Principal, user_id: str, name: str, project_id: str | None
    ) -> CreatedKey:
        plaintext = new_user_key()
        key = UserKey(
            id=new_key_id(),
            user_id=user_id,
            name=name,
            key_hash=hash_token(plaintext),
            hint=key_hint(plaintext),
            created_at=self._clock(),
        )
        await self.store.add_key(key)
        await self.audit_event(
            principal, AuditAction.KEY_CREATE, project_id, f"key:{key.id}", user=user_id, name=name
        )
        return CreatedKey(key, plaintext)

    async def revoke_key(self, principal: Principal, user_id: str, key_id: str) -> None:
        project_id = await self.user_scope(principal, user_id)
        if not any(k.id == key_id for k in await self.store.keys_of(user_id)):
            raise NotFound(f"No key '{key_id}'.", param="keyId", code="key_not_found")
        await self.store.revoke_key(key_id, self._clock())
        # Before the answer: the key fails from the next request on.
        self.resolver.forget_key(key_id)
        await self.audit_event(
            principal, AuditAction.KEY_REVOKE, project_id, f"key:{key_id}", user=user_id
        )

    # --- audit and usage -------------------------------------------------------------------

    async def audit(
        self,
        principal: Principal,
        project_id: str,
        *,
        since: datetime | None,
        until: datetime | None,
        actions: Sequence[AuditAction],
        limit: int,
        after: int | None = None,
    ) -> list[AuditEntry]:
        await self.project(principal, project_id)
        authorize(principal, project_id, Action.MANAGE, hidden=project_missing(project_id))
        return await self.store.audit(
            project_id, since=since, until=until, actions=actions, limit=limit, after=after
        )


def key_info(key: UserKey, pending_last_used: datetime | None = None) -> dict[str, Any]:
    last_used = key.last_used_at
    if pending_last_used is not None and (last_used is None or pending_last_used > last_used):
        last_used = pending_last_used
    return {
        "id": key.id,
        "userId": key.user_id,
        "name": key.name,
        "hint": key.hint,
        "createdAt": rfc3339(key.created_at),
        "lastUsedAt": rfc3339(last_used) if last_used else None,
        "revokedAt": rfc3339(key.revoked_at) if key.revoked_at else None,
    }
