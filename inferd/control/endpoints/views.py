"""What the control plane shows of itself: to the endpoint records (the
replicas and why none is coming up) and to the gateway (endpoints and their
ready replicas). Adapters over parts built before them, so the service and
the gateway each get one plain object at construction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from inferd.control.endpoints.records import EndpointRuntime, ReplicaView
from inferd.control.model import Endpoint, ReplicaFailure
from inferd.control.replicas.registry import Registry
from inferd.gateway.directory import NO_ADAPTERS, EndpointRoute, RoutableReplica


class CapacityReasons(Protocol):
    def capacity_reason(self, endpoint_id: str) -> str | None: ...

    def last_failure(self, endpoint_id: str) -> ReplicaFailure | None: ...

    def replacing(self, endpoint_id: str) -> str | None: ...


class ReplicaViews:
    """An endpoint's replicas as its record shows them (the service's
    `runtime_of`)."""

    def __init__(self, registry: Registry, capacity: CapacityReasons) -> None:
        self._registry = registry
        self._capacity = capacity

    def __call__(self, endpoint_id: str) -> EndpointRuntime:
        views = tuple(
            ReplicaView(
                gpus=r.gpu_count,
                status=r.status,
                generation=r.generation,
                reason=r.reason,
                replica_id=r.replica_id,
                since=r.status_since_wall or None,
                engine=r.engine,
                node=r.handle.node if r.handle is not None else None,
                adapters=tuple(sorted(r.load.adapters)),
                unresponsive_since=r.unresponsive_since_wall,
            )
            for r in self._registry.of_endpoint(endpoint_id)
        )
        return EndpointRuntime(
            views,
            self._capacity.capacity_reason(endpoint_id),
            self._capacity.last_failure(endpoint_id),
            self._capacity.replacing(endpoint_id),
        )


class EndpointLookup(Protocol):
    def find(self, endpoint_id: str) -> Endpoint | None: ...


class Placeability(Protocol):
    def unplaceable(self, endpoint_id: str) -> str | None: ...


class AdapterSources(Protocol):
    def sources(self, endpoint_id: str) -> Mapping[str, str]: ...


class _NoAdapters:
    def sources(self, endpoint_id: str) -> Mapping[str, str]:
        return NO_ADAPTERS


class _Placeable:
    def unplaceable(self, endpoint_id: str) -> str | None:
        return None


class EndpointDirectory:
    """The gateway's `ReplicaDirectory`: endpoints from the service's
    in-memory copy (routable the moment one is created), replicas from the
    registry."""

    def __init__(
        self,
        endpoints: EndpointLookup,
        registry: Registry,
        placeability: Placeability | None = None,
        adapters: AdapterSources | None = None,
    ) -> None:
        """`placeability`: the reconciler (which knows when an endpoint's
        replica fits nowhere); an instance that does not lead never knows."""
        self._endpoints = endpoints
        self._registry = registry
        self._placeability = placeability or _Placeable()
        self._adapters = adapters or _NoAdapters()

    def endpoint(self, endpoint_id: str) -> EndpointRoute | None:
        row = self._endpoints.find(endpoint_id)
        if row is None:
            return None
        return EndpointRoute(
            row.id,
            row.model_kind,
            row.model_name,
            deleting=row.deleting_at is not None,
            unplaceable=self._placeability.unplaceable(row.id),
            adapters=self._adapters.sources(row.id),
            max_model_len=row.engine_settings.maxModelLen,
        )

    def ready_replicas(self, endpoint_id: str) -> Sequence[RoutableReplica]:
        return self._registry.ready_replicas(endpoint_id)

    def report_unreachable(self, replica_id: str, reason: str) -> None:
        self._registry.report_unreachable(replica_id, reason)

    def report_answered(self, replica_id: str) -> None:
        self._registry.report_answered(replica_id)

    def coming_stage(self, endpoint_id: str) -> str | None:
        return self._registry.coming_stage(endpoint_id)

    async def wait_ready(self, endpoint_id: str, timeout: float) -> bool:
        return await self._registry.wait_ready(endpoint_id, timeout)
