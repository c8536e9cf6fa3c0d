"""Per-endpoint traffic as the gateway sees it, and the snapshot the
autoscaler reads.

`EndpointTraffic` is the gateway's mutable bookkeeping for one endpoint (only
the event loop thread touches it); `TrafficSnapshot` is the frozen copy handed
out. Times are values of the gateway's injected monotonic clock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.gateway.hold import Waiter


@dataclass(frozen=True)
class TrafficSnapshot:
    endpoint_id: str
    # Requests forwarded and not yet finished, in all and per replica id.
    in_flight: int
    in_flight_by_replica: Mapping[str, int]
    # Requests waiting in the gateway for a replica (scale from zero or busy).
    held: int
    # Clock value of the last authenticated request's arrival, or of its end
    # once answered (whichever is later); None if none arrived since the
    # gateway started.
    last_request_at: float | None
    # Recent times from forwarding to the last byte, oldest first (seconds).
    service_times: tuple[float, ...]
    requests_total: int

    @property
    def waiting_or_running(self) -> int:
        return self.in_flight + self.held

    @property
    def mean_service_time(self) -> float | None:
        if not self.service_times:
            return None
        return sum(self.service_times) / len(self.service_times)


class EndpointTraffic:
    __slots__ = (
        "cold_start_s",
        "endpoint_id",
        "in_flight",
        "in_flight_total",
        "last_request_at",
        "queue",
        "requests_total",
        "scale_requested_at",
        "service_times",
        "turn",
        "watcher",
    )

    def __init__(self, endpoint_id: str, window: int) -> None:
        self.endpoint_id = endpoint_id
        self.in_flight: dict[str, int] = {}
        self.in_flight_total = 0
        self.turn = 0
        self.last_request_at: float | None = None
        self.requests_total = 0
        self.service_times: deque[float] = deque(maxlen=window)
        # Held requests in arrival order.
        self.queue: deque[Waiter] = deque()
        # Scale from zero: when capacity was first asked for, and how long the
        # last cold start took (for an honest Retry-After).
        self.scale_requested_at: float | None = None
        self.cold_start_s: float | None = None
        self.watcher: asyncio.Task[None] | None = None

    def reserve(self, replica_id: str) -> None:
        self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1
        self.in_flight_total += 1

    def unreserve(self, replica_id: str) -> None:
        left = self.in_flight.get(replica_id, 0) - 1
        if left > 0:
            self.in_flight[replica_id] = left
        else:
            self.in_flight.pop(replica_id, None)
        self.in_flight_total -= 1

    def mean_service_time(self) -> float | None:
        times = self.service_times
        return sum(times) / len(times) if times else None

    def idle(self) -> bool:
        return not self.in_flight_total and not self.queue and self.watcher is None

    def snapshot(self) -> TrafficSnapshot:
        return TrafficSnapshot(
            endpoint_id=self.endpoint_id,
            in_flight=self.in_flight_total,
            in_flight_by_replica=MappingProxyType(dict(self.in_flight)),
            held=len(self.queue),
            last_request_at=self.last_request_at,
            service_times=tuple(self.service_times),
            requests_total=self.requests_total,
        )
