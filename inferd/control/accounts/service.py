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
from inferd.control.token_format import hash_token
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


# A project's own users are `<project>:<name>`: the namespace a project admin
# creates users in, so that no name says whether a user exists elsewhere.
LOCAL_SEP = ":"


def local_user_id(project_id: str, name: str) -> str:
    """The id of `name` in `project_id`'s own namespace (`name` may already
    carry the project's prefix); 400 for anything else."""
    prefix = project_id + LOCAL_SEP
    return prefix + _slug(name.removeprefix(prefix), "userId")


def _user_id(value: str) -> str:
    """A global user's id, or a project's own user's (`<project>:<name>`)."""
    project, sep, name = value.rpartition(LOCAL_SEP)
    if sep:
        _slug(project, "userId")
    _slug(name, "userId")
    return value


@dataclass(frozen=True)
class KeyScope:
    """The keys of one user a caller manages: all of them (`projects` None),
    or those limited to one of `projects`, and with `whole_user` also those
    for all of the user's projects (when every one of them is in `projects`:
    such a key acts nowhere else)."""

    projects: frozenset[str] | None
    whole_user: bool = False

    def covers(self, key: UserKey) -> bool:
        if self.projects is None or key.project_id in self.projects:
            return True
        return key.project_id is None and self.whole_user

    def project_for_new_key(self, asked: str | None, user_id: str) -> str | None:
        """The project a new key is limited to: what was asked, within this
        scope; unasked, the scope's only project (or none for a full scope)."""
        if self.projects is None:
            return asked
        if asked is not None:
            if asked not in self.projects:
                raise project_missing(asked)
            return asked
        if len(self.projects) == 1:
            return next(iter(self.projects))
        raise BadRequest(
            f"Name the project the key of '{user_id}' acts in ('projectId'): you manage "
            f"{len(self.projects)} of the user's projects.",
            param="projectId",
            code="project_required",
        )


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

    def forget_quota(self, project_id: str) -> None:
        """A deleted project's quota no longer caps anything."""
        self.quotas.pop(project_id, None)

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

    async def project(
        self, principal: Principal, project_id: str, action: Action = Action.READ
    ) -> Project:
        """The project, if `principal` may do `action` in it (another
        project is answered as one that does not exist)."""
        project = await self.store.get_project(project_id)
        if project is None:
            raise project_missing(project_id)
        authorize(principal, project_id, action, hidden=project_missing(project_id))
        return project

    def operator_only(self, principal: Principal, what: str) -> None:
        """403 unless the operator key acts (`what`: the refusal's words)."""
        require_operator(principal, what)

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

    async def member(self, principal: Principal, project_id: str, user_id: str) -> Membership:
        """One member's role, for anyone who may read the project."""
        await self.project(principal, project_id)
        for membership in await self.store.memberships_of(user_id):
            if membership.project_id == project_id:
                return membership
        raise NotFound(
            f"User '{user_id}' is not a member of '{project_id}'.",
            param="userId",
            code="member_not_found",
        )

    async def put_member(
        self, principal: Principal, project_id: str, user_id: str, role: Role
    ) -> tuple[Membership, CreatedKey | None]:
        """Add (or change the role of) a member; returns the first key of a
        user this call created, shown once.

        The operator adds any user (creating one not seen before). A project
        admin changes the roles of the project's members and adds new users
        of the project's own: `<project>:<name>`, whatever exists elsewhere,
        so that the answer says nothing about other projects' users and
        nobody is enrolled without their consent."""
        await self.project(principal, project_id)
        authorize(principal, project_id, Action.MANAGE, hidden=project_missing(project_id))
        members = {m.user_id: m for m in await self.store.members_of(project_id)}
        if not principal.operator and user_id not in members:
            user_id = local_user_id(project_id, user_id)
        else:
            _user_id(user_id)
        new_user = False
        if await self.store.get_user(user_id) is None:
            try:
                await self.store.create_user(User(user_id, self._clock()))
            except AlreadyExists:
                pass
            else:
                new_user = True
                await self.audit_event(
                    principal, AuditAction.USER_CREATE, project_id, f"user:{user_id}"
                )
        old = members.get(user_id)
        membership = Membership(project_id, user_id, role, self._clock())
        await self.store.put_membership(membership)
        self.resolver.forget_user(user_id)
        action = AuditAction.MEMBER_ADD if old is None else AuditAction.MEMBER_CHANGE
        await self.audit_event(
            principal, action, project_id, f"member:{user_id}",
            role=role.value, **({"previousRole": old.role.value} if old else {}),
        )  # fmt: skip
        created: CreatedKey | None = None
        if new_user:
            # After the membership, so that the key's event is in the log of
            # the project it acts in. Operator-made users get a key for all
            # their projects; a project's own user, one for the project.
            scope = None if principal.operator else project_id
            created = await self._new_key(principal, user_id, "first key", scope)
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

    async def user_scope(self, principal: Principal, user_id: str) -> KeyScope:
        """Which of `user_id`'s keys the caller manages; 404 when none.

        The operator and the user (through a key for all their projects)
        manage every key of the user. A key limited to one project, and an
        admin of a project the user is a member of, manage only the user's
        keys that act nowhere but there: nobody mints, lists or revokes a
        key that acts where they could not act themselves."""
        if principal.operator or (principal.id == user_id and principal.scope is None):
            if await self.store.get_user(user_id) is None:
                raise _user_missing(user_id)
            return KeyScope(None)
        memberships = {m.project_id for m in await self.store.memberships_of(user_id)}
        if principal.id == user_id:
            # The user through a key of one project: that project's keys.
            assert principal.scope is not None
            managed = frozenset({principal.scope})
        else:
            managed = frozenset(p for p in memberships if principal.may(Action.MANAGE, p))
            if not managed:
                raise _user_missing(user_id)
        return KeyScope(managed, whole_user=managed == memberships)

    async def keys(
        self,
        principal: Principal,
        user_id: str,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> tuple[list[UserKey], UserKey | None]:
        """The keys of `user_id` the caller manages, from a keyset page of at
        most `limit` (some may be left out: those the caller does not manage),
        and the page's last key when more may follow."""
        scope = await self.user_scope(principal, user_id)
        read_limit = None if limit is None else limit + 1
        found = await self.store.keys_of(user_id, after=after, limit=read_limit)
        last = found[limit - 1] if limit is not None and len(found) > limit else None
        found = found if limit is None else found[:limit]
        return [k for k in found if scope.covers(k)], last

    async def create_key(
        self, principal: Principal, user_id: str, name: str, project_id: str | None = None
    ) -> CreatedKey:
        """A new key of `user_id`, acting in `project_id` only (None: in every
        project of the user, for the operator and the user themself; a
        project admin's key acts in that project, which need not be named
        when it is the only one the admin shares with the user)."""
        scope = await self.user_scope(principal, user_id)
        key_project = scope.project_for_new_key(project_id, user_id)
        # A key limited to a project acts there only through a membership.
        if (
            scope.projects is None
            and key_project is not None
            and key_project not in {m.project_id for m in await self.store.memberships_of(user_id)}
        ):
            raise project_missing(key_project)
        active = [k for k in await self.store.keys_of(user_id) if k.revoked_at is None]
        if len(active) >= MAX_KEYS_PER_USER:
            raise Conflict(
                f"User '{user_id}' has {len(active)} active keys, the most allowed; "
                "revoke one first.",
                code="key_limit_reached",
            )
        return await self._new_key(principal, user_id, name, key_project)

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
            project_id=project_id,
        )
        await self.store.add_key(key)
        await self._audit_key(principal, AuditAction.KEY_CREATE, key, name=name)
        return CreatedKey(key, plaintext)

    async def revoke_key(self, principal: Principal, user_id: str, key_id: str) -> None:
        scope = await self.user_scope(principal, user_id)
        key = next((k for k in await self.store.keys_of(user_id) if k.id == key_id), None)
        if key is None or not scope.covers(key):
            raise NotFound(f"No key '{key_id}'.", param="keyId", code="key_not_found")
        await self.store.revoke_key(key_id, self._clock())
        # Before the answer: the key fails from the next request on.
        self.resolver.forget_key(key_id)
        await self._audit_key(principal, AuditAction.KEY_REVOKE, key)

    async def _audit_key(
        self, principal: Principal, action: AuditAction, key: UserKey, **detail: object
    ) -> None:
        """A key event goes to the log of every project the key acts in (of
        none: the operator's log), naming who did it."""
        if key.project_id is not None:
            projects: list[str | None] = [key.project_id]
        else:
            projects = [m.project_id for m in await self.store.memberships_of(key.user_id)]
        for project_id in projects or [None]:
            await self.audit_event(
                principal, action, project_id, f"key:{key.id}",
                user=key.user_id, scope=key.project_id, **detail,
            )  # fmt: skip

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
        "projectId": key.project_id,
        "createdAt": rfc3339(key.created_at),
        "lastUsedAt": rfc3339(last_used) if last_used else None,
        "revokedAt": rfc3339(key.revoked_at) if key.revoked_at else None,
    }
