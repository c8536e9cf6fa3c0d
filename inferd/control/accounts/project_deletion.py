"""Deleting a project: the operator's, and only of an empty one.

A project with endpoints (being deleted included) or registered models is
refused, under the same guard that endpoint creates take, so none can appear
meanwhile. Members lose the project at once; its audit entries and usage
stay in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferd.control.accounts.model import DEFAULT_PROJECT, AuditAction
from inferd.control.accounts.project_guard import ProjectGuard
from inferd.control.accounts.roles import Principal, require_operator
from inferd.control.accounts.service import AccountService, project_missing
from inferd.errors import Conflict


class ProjectDeletion:
    def __init__(
        self,
        accounts: AccountService,
        guard: ProjectGuard,
        models_of: Callable[[str], Sequence[str]],
    ) -> None:
        """`guard`: the one endpoint creates take (the same object: its
        in-process lock is half of the exclusion); `models_of`: the names of
        the models registered in a project."""
        self._accounts = accounts
        self._guard = guard
        self._models_of = models_of

    async def delete(self, principal: Principal, project_id: str) -> None:
        require_operator(principal, "delete projects")
        if project_id == DEFAULT_PROJECT:
            raise Conflict(
                "The default project cannot be deleted.", param="id", code="project_is_default"
            )
        await self._accounts.project(principal, project_id)
        store = self._guard.store
        async with self._guard.exclusive(project_id):
            endpoints = await store.count_endpoints(project_id)
            models = list(self._models_of(project_id))
            if endpoints or models:
                raise Conflict(
                    f"Project '{project_id}' still has {endpoints} endpoint(s) and "
                    f"{len(models)} registered model(s); delete them first.",
                    param="id",
                    code="project_not_empty",
                )
            if not await store.delete_project(project_id):
                raise project_missing(project_id)
        self._accounts.forget_quota(project_id)
        await self._accounts.audit_event(
            principal, AuditAction.PROJECT_DELETE, project_id, f"project:{project_id}"
        )
