"""Usage and cost as a principal may read them: an endpoint's (if it may read
the endpoint) or a project's (if it is a member), hourly, the figures not
written to the store yet included."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from inferd.control.accounts.metering import UsageMeter, merge_usage
from inferd.control.accounts.model import (
    AuditAction,
    UsageKey,
    UsageRow,
    UsageTotals,
    hour_of,
    usage_order,
)
from inferd.control.accounts.roles import Action, Principal
from inferd.control.accounts.service import AccountService


class EndpointAccess(Protocol):
    """The endpoint service's check: the endpoint, if the principal may do
    the action on it (else the 404 or 403 it answers)."""

    def endpoint(self, principal: Principal, endpoint_id: str, action: Action) -> object: ...


class UsageReads:
    def __init__(self, endpoints: EndpointAccess, accounts: AccountService, meter: UsageMeter):
        self.endpoints = endpoints
        self.accounts = accounts
        self.meter = meter

    async def usage_page(
        self,
        principal: Principal,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None,
        until: datetime | None,
        after: UsageKey | None,
        limit: int,
    ) -> tuple[list[UsageRow], UsageKey | None, UsageTotals]:
        """A keyset page of hourly usage of an endpoint or a project, current
        to the last sample, where the next page starts, and the totals of the
        whole window (every page)."""
        if endpoint_id is not None:
            self.endpoints.endpoint(principal, endpoint_id, Action.READ)
        else:
            assert project_id is not None
            await self.accounts.project(principal, project_id)
        since = hour_of(since) if since else None
        store = self.accounts.store
        scope = {"endpoint_id": endpoint_id, "project_id": project_id}
        stored = await store.usage(**scope, since=since, until=until, after=after,
                                   limit=limit + 1)  # fmt: skip
        more = len(stored) > limit
        stored = stored[:limit]
        # Figures not written yet join the page whose span holds their row:
        # past `after`, up to the last stored row's key when more follow.
        upper = usage_order(stored[-1]) if more else None
        pending = [
            d for d in self.meter.pending(**scope)
            if (after is None or usage_order(d) > after)
            and (upper is None or usage_order(d) <= upper)
        ]  # fmt: skip
        rows = merge_usage(stored, pending, since, until)
        if len(rows) > limit:
            rows, upper = rows[:limit], usage_order(rows[limit - 1])
        # `upper` is None only on the last page.
        in_window = merge_usage((), self.meter.pending(**scope), since, until)
        totals = (await store.usage_totals(**scope, since=since, until=until)).plus(in_window)
        return rows, upper, totals

    async def project_usage(
        self, principal: Principal, project_id: str, since: datetime | None, until: datetime | None
    ) -> list[UsageRow]:
        await self.accounts.project(principal, project_id)
        since = hour_of(since) if since else None
        stored = await self.accounts.store.usage(project_id=project_id, since=since, until=until)
        return merge_usage(stored, self.meter.pending(project_id=project_id), since, until)

    async def names_of_deleted(
        self, principal: Principal, project_id: str, endpoint_ids: Sequence[str]
    ) -> dict[str, str]:
        """The names deleted endpoints of the project had (their usage
        outlives them), from the audit log's create and delete entries."""
        await self.accounts.project(principal, project_id)
        wanted = {f"endpoint:{i}": i for i in endpoint_ids}
        names: dict[str, str] = {}
        after: int | None = None
        while wanted:
            entries = await self.accounts.store.audit(
                project_id,
                actions=(AuditAction.ENDPOINT_CREATE, AuditAction.ENDPOINT_DELETE),
                limit=1000,
                after=after,
            )
            for e in entries:
                name = e.detail.get("name")
                if e.target in wanted and isinstance(name, str):
                    names[wanted[e.target]] = name
            if len(entries) < 1000:
                break
            after = entries[-1].id
        return names
