"""Feeds the usage meter from the registry: the replicas holding their GPUs
(sampled every second) and the usage counters each replica reports."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from inferd.api.replica import ReplicaReport, ReplicaUsageReport
from inferd.control.accounts.adapter_metering import AdapterMeter
from inferd.control.accounts.metering import (
    EndpointPricing,
    LiveReplica,
    ReplicaCounters,
    UsageMeter,
)
from inferd.control.accounts.model import utc_now

if TYPE_CHECKING:  # the replicas package is above accounts; only its types are named here
    from inferd.control.replicas.registry import Registry, Replica

SAMPLE_PERIOD_S = 1.0


def _live(replica: Replica) -> LiveReplica:
    return LiveReplica(
        replica.replica_id,
        replica.endpoint_id,
        replica.gpu_type,
        replica.gpu_count,
        replica.created_at,
    )


def counters_of(usage: ReplicaUsageReport) -> ReplicaCounters:
    """What the endpoint meters from a replica's report: all but batch
    requests, whose usage the batch store adds once per request when its
    result is recorded (one run again after a failover is not counted twice)."""
    return ReplicaCounters(
        max(0, usage.requests - usage.batch_requests),
        max(0, usage.prompt_tokens - usage.batch_prompt_tokens),
        max(0, usage.completion_tokens - usage.batch_completion_tokens),
        usage.images,
    )


class MeterFeed:
    def __init__(
        self,
        meter: UsageMeter,
        registry: Registry,
        pricing: Callable[[], Mapping[str, EndpointPricing]],
        *,
        adapters: AdapterMeter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
        period_s: float = SAMPLE_PERIOD_S,
    ) -> None:
        self.meter = meter
        self.adapters = adapters
        self.registry = registry
        self.pricing = pricing
        self.clock = clock
        self.wall = wall
        self.period_s = period_s
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        live = [_live(r) for r in self.registry.all() if r.live]
        self.meter.sample(live, self.pricing(), self.clock(), self.wall())

    def reported(self, replica_id: str, report: ReplicaReport) -> None:
        """A report the registry accepted: add the usage it shows."""
        replica = self.registry.get(replica_id)
        if report.usage is None or replica is None:
            return
        price = self.pricing().get(replica.endpoint_id)
        if price is not None:
            counters = counters_of(report.usage)
            self.meter.count(_live(replica), price.project_id, counters, self.wall())
        if self.adapters is not None and report.usage.adapters:
            self.adapters.count(replica_id, replica.endpoint_id, report.usage.adapters, self.wall())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-meter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sample()  # the seconds up to now

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            self.sample()
