"""The console's wiring: its sources, all from the built server (the same
service layer as the API, the replicas, the scale journal, the series, the
replicas' logs)."""

from __future__ import annotations

from collections.abc import Sequence

from inferd.console.app import Console
from inferd.console.sources import BATCHES_SHOWN, AdapterLine, ConsoleSources, ReplicaLine
from inferd.control.accounts.adapter_metering import AdapterMeter
from inferd.control.batches.model import Batch
from inferd.control.batches.service import BatchService
from inferd.control.endpoints.adapters import AdapterService
from inferd.control.replicas.registry import Registry
from inferd.server.compose import Server


class ReplicaLines:
    """An endpoint's replicas as the endpoint page lists them."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __call__(self, endpoint_id: str) -> Sequence[ReplicaLine]:
        return [
            ReplicaLine(
                r.replica_id,
                r.status.value,
                r.status_since_wall or r.created_wall,
                r.reason,
                node=r.handle.node if r.handle is not None else None,
                waiting=r.load.waiting,
                kv_cache_usage=r.load.kv_cache_usage,
                prefix_cache_queries=r.load.prefix_cache_queries,
                prefix_cache_hits=r.load.prefix_cache_hits,
                unresponsive_since=r.unresponsive_since_wall,
            )
            for r in self._registry.of_endpoint(endpoint_id)
        ]


class AdapterLines:
    """An endpoint's LoRA adapters as the endpoint page lists them."""

    def __init__(self, adapters: AdapterService, registry: Registry, meter: AdapterMeter) -> None:
        self._adapters = adapters
        self._registry = registry
        self._meter = meter

    def __call__(self, endpoint_id: str) -> Sequence[AdapterLine]:
        replicas = self._registry.of_endpoint(endpoint_id)
        totals = self._meter.totals()
        return [
            AdapterLine(
                a.name,
                a.rank,
                a.source,
                held_by=tuple(r.replica_id for r in replicas if a.name in r.load.adapters),
                requests=(c.requests if (c := totals.get((endpoint_id, a.name))) else 0),
            )
            for a in self._adapters.of(endpoint_id).values()
        ]


class BatchLines:
    """An endpoint's newest batches, through the Batch API's service."""

    def __init__(self, batches: BatchService) -> None:
        self._batches = batches

    async def __call__(self, endpoint_id: str) -> Sequence[Batch]:
        batches, _ = await self._batches.page(endpoint_id, None, BATCHES_SHOWN)
        return batches


def console_sources(server: Server) -> ConsoleSources:
    accounts = server.accounts
    settings = server.settings
    return ConsoleSources(
        endpoints=server.service,
        endpoint_commands=server.endpoint_commands,
        default_location=settings.default_location,
        client_tokens=server.client_tokens,
        usage=accounts.usage,
        accounts=accounts.service,
        catalog=server.catalog,
        # The same resolver as the management API: operator key or user key.
        resolve=accounts.resolver.resolve,
        public_url=settings.public_url,
        cost_so_far=accounts.meter.cost_so_far,
        model_owner=server.models.owner_of,
        # The API's recommendation service: measured profiles and engine
        # settings included, held to the same machines.
        recommender=server.recommendations.estimate,
        capacity=server.recommendations.totals,
        series=server.series,
        scale_events=server.journal.of_endpoint,
        replicas=ReplicaLines(server.registry),
        adapters=AdapterLines(server.adapters, server.registry, accounts.adapters),
        batches=BatchLines(server.batches),
        # Read where each replica runs (this machine, or its Ray node).
        replica_log=server.launcher.log_tail,
    )


def build_console(server: Server) -> Console:
    return Console(console_sources(server))
