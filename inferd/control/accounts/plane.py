"""The accounts part of the control plane (built by `inferd.server.compose`
in dependency order: principal resolver, account service, usage meter and
the reconciler's quota cap before the endpoint service, the usage reads
after it), and its background work (last-used times and usage
figures to the store)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from inferd.control.accounts.adapter_metering import AdapterMeter
from inferd.control.accounts.metering import EndpointPricing, UsageMeter, month_of
from inferd.control.accounts.model import utc_now
from inferd.control.accounts.ports import AccountStore
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.quota import EndpointShape, cap_replicas, capped_reason
from inferd.control.accounts.service import AccountService
from inferd.control.accounts.usage_reads import UsageReads
from inferd.control.follow import follow
from inferd.control.model import AdapterUsage, Change, ChangeKind, Endpoint

if TYPE_CHECKING:  # the replicas package is above accounts; only its types are named here
    from inferd.control.replicas.registry import Replica

logger = logging.getLogger(__name__)


class AdapterUsageStore(Protocol):
    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None: ...


class LastUses(Protocol):
    """Last-used times kept in memory by someone else (endpoints' client tokens)."""

    async def flush_last_used(self) -> None: ...


FLUSH_PERIOD_S = 5.0


@dataclass
class Accounts:
    store: AccountStore
    resolver: PrincipalResolver
    service: AccountService
    meter: UsageMeter
    usage: UsageReads
    clock: Callable[[], datetime] = utc_now
    flush_period_s: float = FLUSH_PERIOD_S
    # Usage per LoRA adapter, and where it is added up (None: kept nowhere).
    adapters: AdapterMeter = field(default_factory=AdapterMeter)
    adapter_usage_store: AdapterUsageStore | None = None
    token_uses: LastUses | None = None
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

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
        what, _, key = change.id.partition(":")
        if what == "key":
            self.resolver.forget_key(key)
        elif what == "user":
            self.resolver.forget_user(key)
        elif what == "project":
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
        if self.token_uses is not None:
            await self.token_uses.flush_last_used()
        pending = self.meter.drain()
        try:
            await self.store.add_usage(pending)
        except BaseException:
            self.meter.restore(pending)
            raise
        if self.adapter_usage_store is not None:
            by_adapter = self.adapters.drain()
            try:
                await self.adapter_usage_store.add_adapter_usage(by_adapter)
            except BaseException:
                self.adapters.restore(by_adapter)
                raise
        await self._load_month()
        await self.service.load_quotas()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_period_s)
            try:
                await self.flush()
            except Exception:
                logger.exception("writing usage and key use to the store failed; retrying")


class EndpointLike(Protocol):
    """What the quota cap reads of an endpoint."""

    @property
    def id(self) -> str: ...
    @property
    def project_id(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...


class LiveReplicas(Protocol):
    def of_endpoint(self, endpoint_id: str) -> Sequence[Replica]: ...


class ProjectQuotaCap:
    """The reconciler's replica cap: how many of the replicas the autoscaler
    wants the endpoint's project quota allows, and why fewer. Uses the
    endpoints of the reconciler's pass (the stored ones) and the live
    replicas, so it needs nothing built after the reconciler."""

    def __init__(self, accounts: AccountService, replicas: LiveReplicas) -> None:
        self.accounts = accounts
        self.replicas = replicas

    def live(self, endpoint_id: str) -> int:
        return sum(1 for r in self.replicas.of_endpoint(endpoint_id) if r.live)

    def __call__(
        self, endpoint: EndpointLike, desired: int, endpoints: Sequence[EndpointLike]
    ) -> tuple[int, str | None]:
        quota = self.accounts.quotas.get(endpoint.project_id)
        if quota is None or (quota.replicas is None and endpoint.gpu_type not in quota.gpus):
            return desired, None
        others = [
            EndpointShape(e.id, e.gpu_type, e.gpu_count, self.live(e.id))
            for e in endpoints
            if e.project_id == endpoint.project_id and e.id != endpoint.id
        ]
        me = EndpointShape(
            endpoint.id, endpoint.gpu_type, endpoint.gpu_count, self.live(endpoint.id)
        )
        cap = cap_replicas(quota, others, me, desired)
        return cap.allowed, capped_reason(endpoint.project_id, cap)


class EndpointRows(Protocol):
    def rows(self) -> Sequence[Endpoint]: ...


class EndpointPrices:
    """Each endpoint's project and hourly price, for the usage meter."""

    def __init__(self, endpoints: EndpointRows) -> None:
        self.endpoints = endpoints

    def __call__(self) -> dict[str, EndpointPricing]:
        return {
            row.id: EndpointPricing(row.project_id, row.hourly_price)
            for row in self.endpoints.rows()
        }
