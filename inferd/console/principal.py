"""Who is signed in to the console, and what they may see and change.

A pure policy over a frozen principal: the operator (admin key) is a
superuser; a member has a role per project. Viewers see and change nothing
beyond reading; admins and developers change endpoints of their projects.
The server checks `can_change` on every change, whatever the page showed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

ROLES = ("admin", "developer", "viewer")
CHANGING_ROLES = frozenset({"admin", "developer"})
# Endpoints that belong to no project (created with the admin key before
# projects existed) are listed under this one.
DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class ConsolePrincipal:
    name: str
    superuser: bool = False
    # Project -> role ("admin", "developer", "viewer").
    roles: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def sees(self, project: str) -> bool:
        return self.superuser or project in self.roles

    def can_change(self, project: str) -> bool:
        return self.superuser or self.roles.get(project) in CHANGING_ROLES

    def projects(self, known: list[str]) -> list[str]:
        """The projects this principal may open, of those `known`."""
        return [p for p in known if self.sees(p)]


def operator() -> ConsolePrincipal:
    return ConsolePrincipal("operator", superuser=True)
