"""Which silent replicas the control plane may end, and the health probe
that tells a slow replica from a dead one.

Report silence alone is weak evidence: a replica whose engine saturates its
machine reports late, and ending it turns a peak into an outage. So a
replica silent past the registry's grace (`overdue`) is ended only

- while it still does not answer a direct probe of its `/health`,
- if it is not its endpoint's last ready replica (a replacement is launched
  beside it, and it is ended once the replacement is ready), and
- within a bounded share of the endpoint's replicas per window, as Envoy's
  outlier detection bounds ejections with `max_ejection_percent`: a signal
  that is wrong for every replica at once (an overloaded node, a control
  plane that cannot keep up) ends a few of them, never all.

A process that exited, or an engine that reports itself dead, is not judged
here: the launcher and the replica say so at once, and those end at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from inferd.control.replicas.registry import Registry, Replica
from inferd.vocab import ReplicaStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndingBounds:
    # At most this share of an endpoint's live replicas (and always at
    # least one) ended for silence per window.
    max_share: float = 0.34
    window_s: float = 300.0


class EndingBudget:
    """Per endpoint, the replicas ended for silence within the window."""

    def __init__(self, bounds: EndingBounds, clock: Callable[[], float]) -> None:
        self._bounds = bounds
        self._clock = clock
        self._ended: dict[str, deque[float]] = {}

    def allowed(self, endpoint_id: str, live: int) -> int:
        """How many more may be ended now, of an endpoint with `live` replicas."""
        now = self._clock()
        ended = self._ended.setdefault(endpoint_id, deque())
        while ended and now - ended[0] >= self._bounds.window_s:
            ended.popleft()
        cap = max(1, math.floor(self._bounds.max_share * live))
        return max(0, cap - len(ended))

    def spend(self, endpoint_id: str) -> None:
        self._ended.setdefault(endpoint_id, deque()).append(self._clock())

    def forget(self, endpoint_id: str) -> None:
        self._ended.pop(endpoint_id, None)


def choose_endings(
    overdue: Sequence[Replica], registry: Registry, budget: EndingBudget
) -> tuple[list[Replica], list[tuple[Replica, str]]]:
    """(to end now, kept with why) among the overdue replicas: per
    endpoint, the longest silent first, within the budget, never leaving
    the endpoint without a ready replica."""
    end: list[Replica] = []
    kept: list[tuple[Replica, str]] = []
    by_endpoint: dict[str, list[Replica]] = {}
    for replica in overdue:
        by_endpoint.setdefault(replica.endpoint_id, []).append(replica)
    for endpoint_id, silent in by_endpoint.items():
        replicas = [r for r in registry.of_endpoint(endpoint_id) if r.live]
        ready = {r.replica_id for r in replicas if r.status is ReplicaStatus.READY}
        allowed = budget.allowed(endpoint_id, len(replicas))
        for replica in sorted(silent, key=registry.silence, reverse=True):
            if replica.status is ReplicaStatus.READY and ready == {replica.replica_id}:
                kept.append((replica, "its endpoint's last ready replica"))
            elif allowed <= 0:
                kept.append((replica, "the share of replicas that may be ended at once is spent"))
            else:
                end.append(replica)
                ready.discard(replica.replica_id)
                allowed -= 1
                budget.spend(endpoint_id)
    return end, kept


class HealthProbe(Protocol):
    async def __call__(self, replica: Replica) -> bool:
        """True if the replica answered (whatever it said: a process that
        answers is alive)."""
        ...


class HttpHealthProbe:
    """GET `/health` on the replica itself (an open path: no key needed)."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self._client = httpx.AsyncClient(timeout=timeout_s)

    async def __call__(self, replica: Replica) -> bool:
        if not replica.url:
            return False
        try:
            await self._client.get(replica.url.rstrip("/") + "/health")
        except httpx.HTTPError:
            return False
        return True

    async def aclose(self) -> None:
        await self._client.aclose()


class Prober:
    """Probes the replicas the registry has not heard from lately, each at
    most once at a time, in the background (a probe that waits for its
    timeout must not hold up a reconcile pass)."""

    def __init__(self, registry: Registry, probe: HealthProbe) -> None:
        self._registry = registry
        self._probe = probe
        self._running: dict[str, asyncio.Task[None]] = {}

    def probe_quiet(self) -> None:
        for replica in self._registry.quiet():
            if replica.replica_id not in self._running:
                task = asyncio.ensure_future(self._one(replica))
                self._running[replica.replica_id] = task

    async def _one(self, replica: Replica) -> None:
        try:
            if await self._probe(replica):
                self._registry.probe_answered(replica.replica_id)
        except Exception:  # a probe that fails proves nothing either way
            logger.debug("probing replica %s failed", replica.replica_id, exc_info=True)
        finally:
            self._running.pop(replica.replica_id, None)

    async def settle(self) -> None:
        """Wait for the probes in flight (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._running.clear()  # the probe's client stays: a leader may lead again
