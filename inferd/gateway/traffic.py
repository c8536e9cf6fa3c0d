"""Per-endpoint traffic as the gateway sees it, and the snapshot the
autoscaler reads.

`EndpointTraffic` is the gateway's mutable accounting for one endpoint (only
the event loop thread touches it); `TrafficSnapshot` is the frozen copy handed
out. Times are values of the gateway's injected monotonic clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.gateway.routing import Reason


@dataclass(frozen=True)
class TrafficSnapshot:
    endpoint_id: str
    # What the autoscaler reads as the endpoint's load. Background requests
    # (`Claim.background`: a `running` batch's) are not in it: they run on
    # replicas that are up anyway and must not keep one up.
    # Requests forwarded and not yet finished, background ones left out.
    in_flight: int
    # Per replica id, every request (background ones too): what a replica's
    # own report of its in-flight requests is compared with.
    in_flight_by_replica: Mapping[str, int]
    # Requests waiting in the gateway for a replica (scale from zero or
    # busy), background ones left out.
    held: int
    # Clock value of the last authenticated request's arrival, or of its end
    # once answered (whichever is later), background ones left out; None if
    # none arrived since the gateway started.
    last_request_at: float | None
    # Recent times from forwarding to the last byte, oldest first (seconds).
    service_times: tuple[float, ...]
    requests_total: int


class EndpointTraffic:
    """What one endpoint's requests did: arrivals, slots taken on replicas,
    service times. Accounting only: held requests belong to the hold
    machinery (`inferd.gateway.hold`), which reports their count."""

    __slots__ = (
        "background_held",
        "background_in_flight",
        "endpoint_id",
        "held",
        "held_bytes",
        "in_flight",
        "in_flight_total",
        "last_request_at",
        "refused",
        "requests_total",
        "routed",
        "service_times",
    )

    def __init__(self, endpoint_id: str, window: int) -> None:
        self.endpoint_id = endpoint_id
        self.in_flight: dict[str, int] = {}
        self.in_flight_total = 0
        # Requests held waiting for a replica: a count the hold machinery
        # keeps current (it owns the requests themselves).
        self.held = 0
        # Of the held and the in-flight ones, how many are background
        # requests (in the counts above; left out of the snapshot's load).
        self.background_held = 0
        self.background_in_flight = 0
        # What they hold (bodies plus a fixed cost each), against the bound.
        self.held_bytes = 0
        self.last_request_at: float | None = None
        self.requests_total = 0
        self.service_times: deque[float] = deque(maxlen=window)
        # Requests forwarded, by why the routing choice went where it did
        # (`routing.Reason` values).
        self.routed: dict[str, int] = {}
        # Requests the hold queue refused (429/503), by the error code the
        # client got (overloaded, scaling_up, hold_timeout).
        self.refused: dict[str, int] = {}

    def arrived(self, now: float, background: bool = False) -> None:
        # A background request is no activity: it must not keep a replica
        # past the retention period.
        if not background:
            self.last_request_at = now
        self.requests_total += 1

    def ended(self, now: float, background: bool = False) -> None:
        # Idle counts from the end of the last request: one that was held
        # while a replica loaded, or that streamed for minutes, must not
        # leave its replica past retention the moment it ends.
        if not background:
            self.last_request_at = now

    def reserve(self, replica_id: str, background: bool = False) -> None:
        self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1
        self.in_flight_total += 1
        self.background_in_flight += background

    def unreserve(self, replica_id: str, background: bool = False) -> None:
        left = self.in_flight.get(replica_id, 0) - 1
        if left > 0:
            self.in_flight[replica_id] = left
        else:
            self.in_flight.pop(replica_id, None)
        self.in_flight_total -= 1
        self.background_in_flight -= background

    def routed_by(self, reason: Reason | None) -> None:
        if reason is not None:
            key = reason.value
            self.routed[key] = self.routed.get(key, 0) + 1

    def finished(self, service_s: float) -> None:
        self.service_times.append(service_s)

    def mean_service_time(self) -> float | None:
        times = self.service_times
        return sum(times) / len(times) if times else None

    def idle(self) -> bool:
        return not self.in_flight_total and not self.held

    def snapshot(self) -> TrafficSnapshot:
        return TrafficSnapshot(
            endpoint_id=self.endpoint_id,
            in_flight=self.in_flight_total - self.background_in_flight,
            in_flight_by_replica=MappingProxyType(dict(self.in_flight)),
            held=self.held - self.background_held,
            last_request_at=self.last_request_at,
            service_times=tuple(self.service_times),
            requests_total=self.requests_total,
        )


class TrafficBook:
    """Every endpoint's `EndpointTraffic` in one gateway: written by the
    request path, read by the control plane's load observations and by
    `/metrics`. Built before the gateway and handed to it, so that what reads
    it need not know the gateway."""

    def __init__(self, window: int = 50) -> None:
        self._window = window
        self._endpoints: dict[str, EndpointTraffic] = {}

    def endpoint(self, endpoint_id: str) -> EndpointTraffic:
        ep = self._endpoints.get(endpoint_id)
        if ep is None:
            ep = self._endpoints[endpoint_id] = EndpointTraffic(endpoint_id, self._window)
        return ep

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        ep = self._endpoints.get(endpoint_id)
        return (ep or EndpointTraffic(endpoint_id, 1)).snapshot()

    def all(self) -> list[EndpointTraffic]:
        return list(self._endpoints.values())

    def forget(self, endpoint_id: str) -> bool:
        """Drop an idle endpoint's accounting (it was deleted); True if dropped."""
        ep = self._endpoints.get(endpoint_id)
        if ep is not None and ep.idle():
            del self._endpoints[endpoint_id]
            return True
        return False
