"""The accounts part of the control plane, built in dependency order:
principal resolver, account service, usage meter, project-aware endpoints;
and its background work (last-used times and usage figures to the store)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime

from inferd.control.accounts.endpoints import EndpointLike, Endpoints, ProjectEndpoints
from inferd.control.accounts.metering import UsageMeter, month_of
from inferd.control.accounts.model import utc_now
from inferd.control.accounts.ports import AccountStore
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.quota import EndpointShape, cap_replicas, capped_reason
from inferd.control.accounts.service import AccountService
from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind

logger = logging.getLogger(__name__)

FLUSH_PERIOD_S = 5.0


@dataclass
class Accounts:
    store: AccountStore
    resolver: PrincipalResolver
    service: AccountService
    meter: UsageMeter
    endpoints: ProjectEndpoints
    clock: Callable[[], datetime] = utc_now
    flush_period_s: float = FLUSH_PERIOD_S
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        store: AccountStore,
        endpoints: Endpoints,
        is_operator_key: Callable[[str], bool],
        clock: Callable[[], datetime] = utc_now,
    ) -> Accounts:
        resolver = PrincipalResolver(store, is_operator_key)
        service = AccountService(store, resolver, clock)
        meter = UsageMeter()
        return cls(
            store,
            resolver,
            service,
            meter,
            ProjectEndpoints(endpoints, service, meter, clock),
            clock,
        )

    async def start(self) -> None:
        await self.service.ensure_default_project()
        await self.service.load_quotas()
        await self._load_month()
        self._task = asyncio.create_task(self._run(), name="accounts-flush")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Drop cached principals and re-read quotas on account changes made
        by any instance (this one drops its own before answering already)."""
        await follow(feed, self._apply, self.reload, what="accounts")

    async def _apply(self, change: Change) -> None:
        if change.kind is not ChangeKind.ACCOUNT:
            return
        kind, _, key = change.id.partition(":")
        if kind == "key":
            self.resolver.forget_key(key)
        elif kind == "user":
            self.resolver.forget_user(key)
        elif kind == "project":
            await self.service.load_quotas()

    async def reload(self) -> None:
        self.resolver.forget_all()
        await self.service.load_quotas()

    async def _load_month(self) -> None:
        month = month_of(self.clock())
        self.meter.set_month(month, await self.store.costs_since(month))

    async def flush(self) -> None:
        """Write pending last-used times and usage; re-read the month's costs
        (other instances add to them too)."""
        await self.resolver.flush_last_used()
        pending = self.meter.drain()
        try:
            await self.store.add_usage(pending)
        except BaseException:
            self.meter.restore(pending)
            raise
        await self._load_month()
        await self.service.load_quotas()

    def replica_cap(
        self, endpoint: EndpointLike, desired: int, live: Callable[[str], int]
    ) -> tuple[int, str | None]:
        """How many of `desired` replicas the endpoint's project quota allows,
        `live(endpoint id)` giving each endpoint's replicas now; and why fewer."""
        quota = self.service.quotas.get(endpoint.project_id)
        if quota is None or (quota.replicas is None and endpoint.gpu_type not in quota.gpus):
            return desired, None
        others = [
            EndpointShape(e.id, e.gpu_type, e.gpu_count, live(e.id))
            for e in self.endpoints.service.rows()
            if e.project_id == endpoint.project_id and e.id != endpoint.id
        ]
        me = EndpointShape(endpoint.id, endpoint.gpu_type, endpoint.gpu_count, live(endpoint.id))
        cap = cap_replicas(quota, others, me, desired)
        return cap.allowed, capped_reason(endpoint.project_id, cap)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_period_s)
            try:
                await self.flush()
            except Exception:
                logger.exception("writing usage and key use to the store failed; retrying")
