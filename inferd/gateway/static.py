"""An in-memory `ReplicaDirectory` (and capacity signal sink): for tests,
benchmarks and a gateway in front of fixed replicas. Safe to change from another thread than the
gateway's event loop (tests drive it from theirs)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from inferd.aio import wait_event
from inferd.gateway.directory import EndpointRoute, RoutableReplica


class StaticDirectory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[str, EndpointRoute] = {}
        self._ready: dict[str, tuple[RoutableReplica, ...]] = {}
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        # endpoint id -> the stage its coming replica is at (set by tests).
        self._coming: dict[str, str] = {}
        # What the gateway told the directory, in order.
        self.capacity_requests: list[str] = []
        self.unreachable: list[tuple[str, str]] = []

    # -- test side ----------------------------------------------------------

    def add_endpoint(self, route: EndpointRoute, replicas: Sequence[RoutableReplica] = ()) -> None:
        with self._lock:
            self._endpoints[route.endpoint_id] = route
        self.set_ready(route.endpoint_id, replicas)

    def remove_endpoint(self, endpoint_id: str) -> None:
        with self._lock:
            self._endpoints.pop(endpoint_id, None)
            self._ready.pop(endpoint_id, None)

    def set_route(self, route: EndpointRoute) -> None:
        with self._lock:
            self._endpoints[route.endpoint_id] = route

    def set_ready(self, endpoint_id: str, replicas: Sequence[RoutableReplica]) -> None:
        with self._lock:
            self._ready[endpoint_id] = tuple(replicas)
            waiters = list(self._waiters.get(endpoint_id, ())) if replicas else []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def set_coming(self, endpoint_id: str, stage: str | None) -> None:
        """A replica of the endpoint on its way to ready, at `stage` (None: none)."""
        if stage is None:
            self._coming.pop(endpoint_id, None)
        else:
            self._coming[endpoint_id] = stage

    # -- ReplicaDirectory ---------------------------------------------------

    def endpoint(self, endpoint_id: str) -> EndpointRoute | None:
        return self._endpoints.get(endpoint_id)

    def ready_replicas(self, endpoint_id: str) -> Sequence[RoutableReplica]:
        return self._ready.get(endpoint_id, ())

    def coming_stage(self, endpoint_id: str) -> str | None:
        return self._coming.get(endpoint_id)

    # -- CapacitySignal (what the control plane's ScaleSignals receive) -------

    def capacity_wanted(self, endpoint_id: str) -> None:
        self.capacity_requests.append(endpoint_id)

    def report_answered(self, replica_id: str) -> None:
        return None  # static replicas are not watched for silence

    def report_unreachable(self, replica_id: str, reason: str) -> None:
        # As the registry does: stop routing to it until it reports again.
        self.unreachable.append((replica_id, reason))
        with self._lock:
            for eid, replicas in self._ready.items():
                self._ready[eid] = tuple(r for r in replicas if r.replica_id != replica_id)

    async def wait_ready(self, endpoint_id: str, timeout: float) -> bool:
        if self._ready.get(endpoint_id):
            return True
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.setdefault(endpoint_id, set()).add(waiter)
        try:
            if self._ready.get(endpoint_id):
                return True
            return await wait_event(waiter[1], timeout)
        finally:
            with self._lock:
                self._waiters.get(endpoint_id, set()).discard(waiter)
