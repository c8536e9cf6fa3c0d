"""Prometheus metrics of one replica, on its own registry (never the global
one, so several replicas can live in one test process)."""

from __future__ import annotations

from typing import Any

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
        # Of the above, batch requests' (the batch store meters their usage).
        self.batch_requests = Counter(
            "inferd_batch_requests", "Batch requests answered with a 2xx status.", registry=r
        )
        self.batch_prompt_tokens = Counter(
            "inferd_batch_prompt_tokens", "Prompt tokens of batch requests.", registry=r
        )
        self.batch_generated_tokens = Counter(
            "inferd_batch_generated_tokens", "Completion tokens of batch requests.", registry=r
        )
        # Per LoRA adapter (a request naming the base model counts above only).
        self.adapter_requests = Counter(
            "inferd_adapter_requests",
            "Requests answered with a LoRA adapter, by adapter and HTTP status.",
            ["adapter", "status"],
            registry=r,
        )
        self.adapter_prompt_tokens = Counter(
            "inferd_adapter_prompt_tokens",
            "Prompt tokens processed with a LoRA adapter.",
            ["adapter"],
            registry=r,
        )
        self.adapter_generated_tokens = Counter(
            "inferd_adapter_generated_tokens",
            "Completion tokens generated with a LoRA adapter.",
            ["adapter"],
            registry=r,
        )
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
        kv_tokens = Gauge("inferd_kv_cache_tokens", "Tokens the KV cache holds.", registry=r)
        kv_tokens.set_function(lambda: engine.load().kv_cache_tokens or 0)
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

    def count(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        adapter: str | None = None,
        batch: bool = False,
    ) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(completion_tokens)
        if batch:
            self.batch_prompt_tokens.inc(prompt_tokens)
            self.batch_generated_tokens.inc(completion_tokens)
        if adapter is not None:
            self.adapter_prompt_tokens.labels(adapter).inc(prompt_tokens)
            self.adapter_generated_tokens.labels(adapter).inc(completion_tokens)

    def answered(
        self, route: str, status: int, seconds: float, adapter: str | None, batch: bool = False
    ) -> None:
        self.requests.labels(route, str(status)).inc()
        if batch and 200 <= status < 300:
            self.batch_requests.inc()
        self.latency.labels(route).observe(seconds)
        if adapter is not None:
            self.adapter_requests.labels(adapter, str(status)).inc()

    def adapter_usage(self) -> dict[str, dict[str, int]]:
        """Per adapter, cumulative since start: answered (2xx) requests and
        tokens (the control plane meters the differences)."""
        usage: dict[str, dict[str, int]] = {}

        def entry(adapter: str) -> dict[str, int]:
            return usage.setdefault(
                adapter, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
            )

        for counter, field in (
            (self.adapter_requests, "requests"),
            (self.adapter_prompt_tokens, "prompt_tokens"),
            (self.adapter_generated_tokens, "completion_tokens"),
        ):
            for family in counter.collect():
                for sample in family.samples:
                    if not sample.name.endswith("_total"):
                        continue
                    if field == "requests" and not sample.labels["status"].startswith("2"):
                        continue
                    entry(sample.labels["adapter"])[field] += int(sample.value)
        return {name: counts for name, counts in usage.items() if any(counts.values())}

    def usage(self) -> dict[str, Any]:
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
            "batch_requests": _total(self.batch_requests),
            "batch_prompt_tokens": _total(self.batch_prompt_tokens),
            "batch_completion_tokens": _total(self.batch_generated_tokens),
            "adapters": self.adapter_usage(),
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
