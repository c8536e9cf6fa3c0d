"""The reconciler's one view of load: gateways' traffic merged with the
replicas' own reports.

A gateway knows what it forwarded and holds; with several gateways (control
plane instances) each sees a share. Samples from other instances arrive
through `publish` (a multi-instance deployment relays them, e.g. through the
database); this process's gateway is read directly. Replicas see every
gateway's requests, so a replica's reported in-flight count bounds each
gateway's sum from below: the merge takes the larger of the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from inferd.control.ports import EndpointLoad, LoadSample

# A remote sample older than this is ignored (its instance stopped publishing).
STALE_AFTER_S = 10.0


class LocalTraffic(Protocol):
    """This process's gateway (`inferd.gateway.traffic.TrafficSnapshot`)."""

    def traffic(self, endpoint_id: str) -> _Snapshot: ...


class _Snapshot(Protocol):
    @property
    def in_flight(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def in_flight_by_replica(self) -> Mapping[str, int]: ...
    @property
    def last_request_at(self) -> float | None: ...


@dataclass(frozen=True)
class ReplicaCount:
    replica_id: str
    in_flight: int


class ReplicaReports(Protocol):
    """In-flight counts the replicas of an endpoint last reported."""

    def reported_in_flight(self, endpoint_id: str) -> list[ReplicaCount]: ...


class MergedLoad:
    """`LoadObservations` over the local gateway, other instances' samples
    and the replicas' reports."""

    def __init__(
        self,
        local: LocalTraffic,
        replicas: ReplicaReports,
        *,
        clock: Callable[[], float],
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self._local = local
        self._replicas = replicas
        self._clock = clock
        self._stale_after = stale_after_s
        self._remote: dict[tuple[str, str], LoadSample] = {}  # (source, endpoint) -> sample

    def publish(self, sample: LoadSample) -> None:
        """Another gateway instance's view of one endpoint."""
        self._remote[(sample.source, sample.endpoint_id)] = sample

    def load(self, endpoint_id: str) -> EndpointLoad:
        local = self._local.traffic(endpoint_id)
        in_flight = local.in_flight
        held = local.held
        by_replica = dict(local.in_flight_by_replica)
        last = local.last_request_at
        now = self._clock()
        for (source, eid), sample in list(self._remote.items()):
            if eid != endpoint_id:
                continue
            if now - sample.at > self._stale_after:
                del self._remote[(source, eid)]
                continue
            in_flight += sample.in_flight
            held += sample.held
            for replica_id, count in sample.in_flight_by_replica.items():
                by_replica[replica_id] = by_replica.get(replica_id, 0) + count
            if sample.last_request_at is not None and (
                last is None or sample.last_request_at > last
            ):
                last = sample.last_request_at
        for reported in self._replicas.reported_in_flight(endpoint_id):
            seen = by_replica.get(reported.replica_id, 0)
            if reported.in_flight > seen:
                in_flight += reported.in_flight - seen
                by_replica[reported.replica_id] = reported.in_flight
        return EndpointLoad(
            endpoint_id=endpoint_id,
            in_flight=in_flight,
            held=held,
            in_flight_by_replica=MappingProxyType(by_replica),
            last_request_at=last,
        )

    def forget(self, endpoint_id: str) -> None:
        for key in [k for k in self._remote if k[1] == endpoint_id]:
            del self._remote[key]
