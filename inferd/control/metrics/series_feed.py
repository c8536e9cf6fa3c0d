"""What feeds the per-minute endpoint series (`inferd.control.metrics.timeseries`).

Two feeds, built at different points of the composition: `AnsweredRequests`
before the gateway's state (its metrics tell it of every answered request),
`SeriesSampler` once the endpoint service exists (it samples every known
endpoint's held requests, live replicas and the replicas' running totals).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from inferd.control.metrics.timeseries import EndpointSeries, ReplicaTotals
from inferd.control.replicas.registry import Registry

logger = logging.getLogger(__name__)

# How often held requests, replicas and the replicas' running totals are
# sampled: often enough for a per-minute maximum, cheap for 1,000 endpoints.
SAMPLE_PERIOD_S = 2.0


class AnsweredRequests:
    """The gateway metrics' observer: each answered request, at wall time."""

    def __init__(self, series: EndpointSeries, wall_clock: Callable[[], float] = time.time):
        self._series = series
        self._wall_clock = wall_clock

    def __call__(self, endpoint_id: str, status: int, seconds: float) -> None:
        self._series.observe_request(endpoint_id, seconds, status, self._wall_clock())


class _Held(Protocol):
    @property
    def held(self) -> int: ...


class HeldRequests(Protocol):
    """The gateway's traffic book (requests waiting for a replica)."""

    def traffic(self, endpoint_id: str) -> _Held: ...


class SeriesSampler:
    """Samples every endpoint the service knows every `period_s` and drops
    the series of endpoints it no longer knows."""

    def __init__(
        self,
        series: EndpointSeries,
        registry: Registry,
        traffic: HeldRequests,
        endpoint_ids: Callable[[], Iterable[str]],
        *,
        period_s: float = SAMPLE_PERIOD_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._series = series
        self._registry = registry
        self._traffic = traffic
        self._endpoint_ids = endpoint_ids
        self._period_s = period_s
        self._wall_clock = wall_clock
        self._task: asyncio.Task[None] | None = None

    def sample(self, now: float) -> None:
        """One sample of every known endpoint."""
        known = list(self._endpoint_ids())
        for endpoint_id in known:
            replicas = [r for r in self._registry.of_endpoint(endpoint_id) if r.live]
            self._series.sample(
                endpoint_id,
                held=self._traffic.traffic(endpoint_id).held,
                replicas=len(replicas),
                totals=[
                    ReplicaTotals(r.replica_id, r.load.generated_tokens, r.load.images)
                    for r in replicas
                ],
                now=now,
            )
        for endpoint_id in set(self._series.endpoint_ids()) - set(known):
            self._series.forget(endpoint_id)

    async def _run(self) -> None:
        while True:
            try:
                self.sample(self._wall_clock())
            except Exception:  # one bad sample must not end the series
                logger.exception("sampling the endpoint series failed")
            await asyncio.sleep(self._period_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
