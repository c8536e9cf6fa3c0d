"""Prometheus metrics of one replica, on its own registry (never the global
one, so several replicas can live in one test process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inferd.engines.base import Engine
from inferd.replica.state import ReplicaState

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ReplicaMetrics:
    def __init__(self, engine: Engine, state: ReplicaState) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "inferd_requests",
            "Requests answered, by route and HTTP status.",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "inferd_request_duration_seconds",
            "Time from request to last byte.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "inferd_time_to_first_token_seconds",
            "Time from request to first generated token.",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("inferd_prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generated_tokens = Counter(
            "inferd_generated_tokens", "Completion tokens generated.", registry=r
        )
        self.images = Counter("inferd_generated_images", "Images generated.", registry=r)
        in_flight = Gauge(
            "inferd_requests_in_flight", "Requests admitted and not yet finished.", registry=r
        )
        in_flight.set_function(lambda: state.in_flight)
        running = Gauge("inferd_engine_running", "Requests running in the engine.", registry=r)
        running.set_function(lambda: engine.load().running)
        waiting = Gauge("inferd_engine_waiting", "Requests queued in the engine.", registry=r)
        waiting.set_function(lambda: engine.load().waiting)
        kv = Gauge("inferd_kv_cache_usage", "Fraction of the KV cache in use.", registry=r)
        kv.set_function(lambda: engine.load().kv_cache_usage or 0.0)
        queried = Gauge(
            "inferd_prefix_cache_queried_tokens",
            "Prompt tokens looked up in the prefix cache since start.",
            registry=r,
        )
        queried.set_function(lambda: engine.load().prefix_cache_queries)
        hits = Gauge(
            "inferd_prefix_cache_hit_tokens",
            "Prompt tokens found in the prefix cache since start.",
            registry=r,
        )
        hits.set_function(lambda: engine.load().prefix_cache_hits)
        ready = Gauge("inferd_replica_ready", "1 when the replica takes requests.", registry=r)
        ready.set_function(lambda: 1.0 if state.status.value == "ready" else 0.0)

    def usage(self) -> dict[str, int]:
        """Cumulative counts since the replica started, for its reports (the
        control plane meters usage from their differences). Requests: the
        answered ones with a 2xx status."""
        requests = 0
        for family in self.requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("status", "").startswith(
                    "2"
                ):
                    requests += int(sample.value)
        return {
            "requests": requests,
            "prompt_tokens": _total(self.prompt_tokens),
            "completion_tokens": _total(self.generated_tokens),
            "images": _total(self.images),
        }

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def _total(counter: Counter) -> int:
    return sum(
        int(sample.value)
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
