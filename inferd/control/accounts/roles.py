"""Who may do what: roles, actions, the principal behind a request, and the check.

A principal is the operator (the superuser key printed at first start) or a
user acting through one of their management keys. A user reaches a project
only through a membership, and the role of that membership decides which
actions are allowed there.

`authorize` answers 404 when the principal has no role in the project at all
(existence of another project's things is not revealed) and 403 when it has
a role that may not do the action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from inferd.control.model import DEFAULT_PROJECT
from inferd.errors import BadRequest, Forbidden, NotFound


class Role(str, Enum):
    ADMIN = "admin"
    DEVELOPER = "developer"
    VIEWER = "viewer"


class Action(str, Enum):
    READ = "read"  # endpoints, usage, the project itself
    WRITE = "write"  # create, change, delete endpoints; re-issue access tokens
    MANAGE = "manage"  # members, quotas, the audit log


ROLE_ACTIONS: Mapping[Role, frozenset[Action]] = {
    Role.VIEWER: frozenset({Action.READ}),
    Role.DEVELOPER: frozenset({Action.READ, Action.WRITE}),
    Role.ADMIN: frozenset({Action.READ, Action.WRITE, Action.MANAGE}),
}


def role_allows(role: Role, action: Action) -> bool:
    return action in ROLE_ACTIONS[role]


@dataclass(frozen=True)
class Principal:
    """The caller of a management request, resolved from its bearer key."""

    # "operator" for the superuser key, else the user's id.
    id: str
    name: str
    operator: bool = False
    # project id -> role, for a user; empty for the operator (it needs none).
    roles: Mapping[str, Role] = field(default_factory=dict)
    # The management key used, for last-used bookkeeping and the audit log.
    key_id: str | None = None
    # The project the key is limited to (`roles` then holds at most that one).
    scope: str | None = None

    @property
    def label(self) -> str:
        """How the audit log names the actor."""
        return "operator" if self.operator else f"user:{self.name}"

    def role_in(self, project_id: str) -> Role | None:
        return self.roles.get(project_id)

    def sees(self, project_id: str) -> bool:
        return self.operator or project_id in self.roles

    def may(self, action: Action, project_id: str) -> bool:
        if self.operator:
            return True
        role = self.roles.get(project_id)
        return role is not None and role_allows(role, action)


OPERATOR = Principal(id="operator", name="operator", operator=True)


def authorize(principal: Principal, project_id: str, action: Action, *, hidden: NotFound) -> None:
    """Raise `hidden` (a 404 about the thing asked for) when the principal has
    no role in `project_id`, 403 when its role may not do `action`."""
    if principal.operator:
        return
    role = principal.roles.get(project_id)
    if role is None:
        raise hidden
    if not role_allows(role, action):
        raise Forbidden(
            f"Your role '{role.value}' in project '{project_id}' may not {_VERBS[action]}.",
            code="insufficient_role",
        )


def project_to_write(principal: Principal, project_id: str | None) -> str:
    """The project a create names, or the only one the principal may
    create in (the operator's default: the default project)."""
    if project_id is not None:
        return project_id
    if principal.operator:
        return DEFAULT_PROJECT
    writable = [p for p in principal.roles if principal.may(Action.WRITE, p)]
    if len(writable) == 1:
        return writable[0]
    raise BadRequest(
        "Name the project to create the endpoint in ('projectId'): "
        f"you may create endpoints in {len(writable)} projects.",
        param="projectId",
        code="project_required",
    )


def require_operator(principal: Principal, what: str) -> None:
    if not principal.operator:
        raise Forbidden(f"Only the operator key may {what}.", code="operator_only")


_VERBS = {
    Action.READ: "read it",
    Action.WRITE: "create, change or delete endpoints",
    Action.MANAGE: "manage members, keys and quotas",
}
