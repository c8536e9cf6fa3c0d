"""Writes that must not interleave with another check of the same project:
a quota check and the create or change it allows, and a project's deletion
and any create in it.

The check reads the store, not this instance's copy (which may not have
heard of another instance's create yet), under the store's per-project lock,
so that it holds across instances too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from inferd.control.accounts.ports import AccountStore
from inferd.control.accounts.quota import UNLIMITED, EndpointShape, check_settings
from inferd.control.accounts.service import project_missing


class ProjectGuard:
    def __init__(self, store: AccountStore) -> None:
        self.store = store
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def exclusive(self, project_id: str) -> AsyncIterator[None]:
        """No other guarded write of this project runs meanwhile, on this
        instance or another."""
        async with self._lock, self.store.quota_lock(project_id):
            yield

    async def check_quota(
        self, project_id: str, changed: EndpointShape, max_replicas: int, *, new_endpoint: bool
    ) -> None:
        """Refuse (409) a create or change that breaks the project's quota;
        call it within `exclusive(project_id)`."""
        # Read under the lock: a project deleted meanwhile takes nothing.
        project = await self.store.get_project(project_id)
        if project is None:
            raise project_missing(project_id)
        quota = project.quota_in_force
        if quota == UNLIMITED:
            return
        others = await self.store.quota_shapes(project_id)
        exceeded = check_settings(quota, others, changed, max_replicas, new_endpoint=new_endpoint)
        if exceeded is not None:
            raise exceeded.error(project_id)
