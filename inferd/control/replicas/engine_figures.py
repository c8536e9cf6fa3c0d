"""What an endpoint's engines say about themselves, summed over its ready
replicas: the prefix cache's hit rate, KV cache use and the engine queue.

Read by `/metrics` (per endpoint) and by the console's endpoint page. The
hit rate is over the prompt tokens the replicas up now have looked up since
they started (cumulative reports): a replica replaced takes its history
with it, which is what a cache does too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

from inferd.control.replicas.registry import ReplicaLoad


@dataclass
class EndpointEngines:
    replicas: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    waiting: int = 0
    kv_reports: int = 0
    kv_cache_usage_sum: float = 0.0

    def add(self, load: ReplicaLoad) -> None:
        self.replicas += 1
        self.prefix_cache_queries += load.prefix_cache_queries
        self.prefix_cache_hits += load.prefix_cache_hits
        self.waiting += load.waiting
        if load.kv_cache_usage is not None:
            self.kv_reports += 1
            self.kv_cache_usage_sum += load.kv_cache_usage

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hits over lookups; None before any prompt was looked up."""
        if not self.prefix_cache_queries:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def kv_cache_usage(self) -> float | None:
        """Mean over the replicas that report one; None where none does."""
        return self.kv_cache_usage_sum / self.kv_reports if self.kv_reports else None


def engine_families(engines: Mapping[str, EndpointEngines]) -> Iterator[GaugeMetricFamily]:
    rate = GaugeMetricFamily(
        "inferd_endpoint_prefix_cache_hit_rate",
        "Prompt tokens found in the engines' prefix cache over those looked up, "
        "over the ready replicas' lifetimes, per endpoint.",
        labels=["endpoint"],
    )
    queried = GaugeMetricFamily(
        "inferd_endpoint_prefix_cache_queried_tokens",
        "Prompt tokens the ready replicas looked up in their prefix cache since they started.",
        labels=["endpoint"],
    )
    hits = GaugeMetricFamily(
        "inferd_endpoint_prefix_cache_hit_tokens",
        "Prompt tokens the ready replicas found in their prefix cache since they started.",
        labels=["endpoint"],
    )
    kv = GaugeMetricFamily(
        "inferd_endpoint_kv_cache_usage",
        "Mean fraction of the KV cache in use over the ready replicas, per endpoint.",
        labels=["endpoint"],
    )
    waiting = GaugeMetricFamily(
        "inferd_endpoint_engine_waiting",
        "Requests queued inside the ready replicas' engines, per endpoint.",
        labels=["endpoint"],
    )
    for endpoint, e in sorted(engines.items()):
        queried.add_metric([endpoint], e.prefix_cache_queries)
        hits.add_metric([endpoint], e.prefix_cache_hits)
        waiting.add_metric([endpoint], e.waiting)
        if e.prefix_cache_hit_rate is not None:
            rate.add_metric([endpoint], e.prefix_cache_hit_rate)
        if e.kv_cache_usage is not None:
            kv.add_metric([endpoint], e.kv_cache_usage)
    yield from (rate, queried, hits, kv, waiting)
