"""The gateway's Prometheus metrics, on a registry of their own that the
server exposes next to its other metrics.

Counts and latencies are updated per request; in-flight and held numbers are
read from the traffic bookkeeping at scrape time (no per-request gauge
updates). The `endpoint` label is only ever an authenticated endpoint's id,
so requests with made-up ids cannot grow the label set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from inferd.gateway.traffic import EndpointTraffic

UNAUTHENTICATED = "unauthenticated"
# The `client` label of requests made with the endpoint owner's token.
OWNER_LABEL = "owner"
# The hold queue's refusals, by the error code the client gets.
REFUSAL_REASONS = (
    "overloaded",
    "scaling_up",
    "hold_timeout",
    "hold_share_exceeded",
    "no_ready_replica",
)

# Called with (endpoint, status, seconds) for every answered request of an
# authenticated endpoint.
AnswerObserver = Callable[[str, int, float], None]
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
)  # fmt: skip
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _TrafficCollector(Collector):
    def __init__(self, endpoints: Callable[[], Iterable[EndpointTraffic]]) -> None:
        self._endpoints = endpoints

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        in_flight = GaugeMetricFamily(
            "inferd_gateway_in_flight_requests",
            "Requests forwarded to a replica and not finished, per endpoint.",
            labels=["endpoint"],
        )
        held = GaugeMetricFamily(
            "inferd_gateway_held_requests",
            "Requests held by the gateway waiting for a replica, per endpoint.",
            labels=["endpoint"],
        )
        held_bytes = GaugeMetricFamily(
            "inferd_gateway_held_bytes",
            "Bytes the held requests hold (bodies plus a fixed cost each), per endpoint: "
            "the hold queue is bounded by these.",
            labels=["endpoint"],
        )
        routed = CounterMetricFamily(
            "inferd_gateway_routed_requests",
            "Requests forwarded, by why the replica was chosen: cached (this gateway "
            "sent the prefix there before), home (first in the prefix's rendezvous "
            "order), spilled (home was over the load bound), least_loaded.",
            labels=["endpoint", "reason"],
        )
        refused = CounterMetricFamily(
            "inferd_gateway_refused_requests",
            "Requests the hold queue refused, by the error code the client got: "
            "overloaded (429: at capacity, queue full), scaling_up (503: starting a "
            "replica, queue full), hold_timeout (503: no replica in time), "
            "hold_share_exceeded (429: queue full and the client holds more than its share), "
            "no_ready_replica (503: a batch that does not wake the endpoint, with no "
            "replica ready).",
            labels=["endpoint", "reason"],
        )
        for ep in list(self._endpoints()):
            in_flight.add_metric([ep.endpoint_id], ep.in_flight_total)
            # Every reason from zero, so that rate() and alerts see the
            # series before the first refusal.
            for reason in {**dict.fromkeys(REFUSAL_REASONS, 0), **ep.refused}:
                refused.add_metric([ep.endpoint_id, reason], ep.refused.get(reason, 0))
            held.add_metric([ep.endpoint_id], ep.held)
            held_bytes.add_metric([ep.endpoint_id], ep.held_bytes)
            for reason, count in list(ep.routed.items()):
                routed.add_metric([ep.endpoint_id, reason], count)
        yield in_flight
        yield held
        yield held_bytes
        yield routed
        yield refused

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


class _PlacementCollector(Collector):
    """The split of the live prompt prefixes over the replicas, read at
    scrape time: the first thing to look at when prefix-cache hit rates
    disappoint (an uneven split, or prefixes moving)."""

    def __init__(self, placements: Callable[[], Mapping[str, PlacementView]]) -> None:
        self._placements = placements

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        prefixes = GaugeMetricFamily(
            "inferd_gateway_placed_prefixes",
            "Live prompt prefixes placed on each replica, per endpoint.",
            labels=["endpoint", "replica"],
        )
        blocks = GaugeMetricFamily(
            "inferd_gateway_placed_prefix_blocks",
            "Size of the live prompt prefixes placed on each replica (512-byte blocks, "
            "each prefix rounded up to a power of two), per endpoint.",
            labels=["endpoint", "replica"],
        )
        moves = CounterMetricFamily(
            "inferd_gateway_prefix_moves",
            "Live prompt prefixes moved to another replica (theirs left, was left crowded, "
            "or another gateway instance placed them first), per endpoint.",
            labels=["endpoint"],
        )
        for endpoint_id, placement in list(self._placements().items()):
            sizes = placement.working_sets()
            for rid, count in placement.counts().items():
                prefixes.add_metric([endpoint_id, rid], count)
                blocks.add_metric([endpoint_id, rid], sizes.get(rid, 0))
            moves.add_metric([endpoint_id], placement.moves)
        yield prefixes
        yield blocks
        yield moves

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


class PlacementView(Protocol):
    moves: int

    def counts(self) -> dict[str, int]: ...

    def working_sets(self) -> dict[str, int]: ...


class GatewayMetrics:
    def __init__(
        self,
        endpoints: Callable[[], Iterable[EndpointTraffic]],
        observers: Sequence[AnswerObserver] = (),
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "inferd_gateway_requests",
            "Requests answered by the gateway, by endpoint, route and HTTP status "
            "(499: the client went away).",
            ["endpoint", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "inferd_gateway_request_duration_seconds",
            "Time from request to last byte, holding included.",
            ["endpoint", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.hold = Histogram(
            "inferd_gateway_hold_duration_seconds",
            "Time requests spent held before being forwarded or refused.",
            ["endpoint"],
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "inferd_gateway_retries",
            "Forward attempts retried on another replica, by reason "
            "(unreachable, connection, draining).",
            ["endpoint", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "inferd_gateway_upstream_errors",
            "Failures talking to replicas, by kind (unreachable, connection, draining, "
            "broken_stream).",
            ["endpoint", "kind"],
            registry=r,
        )
        self.migrations = Counter(
            "inferd_gateway_migrations",
            "Streams continued on another replica after theirs was lost mid-answer, by "
            "what was lost (connection_lost: the replica or its node; engine_failed: its "
            "engine).",
            ["endpoint", "reason"],
            registry=r,
        )
        self.migrations_refused = Counter(
            "inferd_gateway_migrations_refused",
            "Streams whose replica was lost mid-answer and that could not be continued "
            "faithfully elsewhere, by why (n, structured_output, logprobs, seed, ..., off, "
            "cap, no_replica).",
            ["endpoint", "reason"],
            registry=r,
        )
        # Per client token ("owner": the endpoint owner's token). Bounded:
        # an endpoint has at most a few hundred client tokens.
        self.client_requests = Counter(
            "inferd_gateway_client_requests",
            "Requests answered, by endpoint, client token name ('owner': the endpoint's "
            "own token) and HTTP status (429: its rate limit).",
            ["endpoint", "client", "status"],
            registry=r,
        )
        self.client_tokens = Counter(
            "inferd_gateway_client_tokens",
            "Tokens served, by endpoint, client token name and kind (prompt, completion), "
            "as the answers' usage said them (a stream without usage: its events).",
            ["endpoint", "client", "kind"],
            registry=r,
        )
        r.register(_TrafficCollector(endpoints))
        # Labelled children by (endpoint, route, status): `labels()` takes a
        # lock and builds a key on every call; this is one dict lookup.
        self._answered: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._by_client: dict[tuple[str, str, int], tuple[Any, Any, Any]] = {}
        # The control plane's per-minute series, fed without a scrape.
        self._observers = tuple(observers)

    def watch_placements(self, placements: Callable[[], Mapping[str, PlacementView]]) -> None:
        """Expose the prefix placements' split (`inferd.gateway.placement`)."""
        self.registry.register(_PlacementCollector(placements))

    def answered(self, endpoint: str, route: str, status: int, seconds: float) -> None:
        key = (endpoint, route, status)
        children = self._answered.get(key)
        if children is None:
            children = (
                self.requests.labels(endpoint, route, str(status)),
                self.latency.labels(endpoint, route),
            )
            self._answered[key] = children
        children[0].inc()
        children[1].observe(seconds)
        if endpoint != UNAUTHENTICATED:
            for observer in self._observers:
                observer(endpoint, status, seconds)

    def client_answered(
        self,
        endpoint: str,
        client: str,
        status: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        key = (endpoint, client, status)
        children = self._by_client.get(key)
        if children is None:
            name = client or OWNER_LABEL
            children = (
                self.client_requests.labels(endpoint, name, str(status)),
                self.client_tokens.labels(endpoint, name, "prompt"),
                self.client_tokens.labels(endpoint, name, "completion"),
            )
            self._by_client[key] = children
        children[0].inc()
        if prompt_tokens:
            children[1].inc(prompt_tokens)
        if completion_tokens:
            children[2].inc(completion_tokens)

    def forget(self, endpoint: str) -> None:
        """Drop the series of a deleted endpoint."""
        for key in [k for k in self._answered if k[0] == endpoint]:
            del self._answered[key]
        for client_key in [k for k in self._by_client if k[0] == endpoint]:
            del self._by_client[client_key]
        for metric in (
            self.requests,
            self.latency,
            self.hold,
            self.retries,
            self.upstream_errors,
            self.migrations,
            self.migrations_refused,
            self.client_requests,
            self.client_tokens,
        ):
            for labels in list(metric._metrics):  # no public way to list a metric's children
                if labels[0] == endpoint:
                    metric.remove(*labels)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
