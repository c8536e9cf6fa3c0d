"""The feeds of the per-minute series: the gateway's answered requests at
wall time, and the periodic sample of held requests, live replicas and the
replicas' running totals (clock passed in, no sleeps)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferd.control.metrics.series_feed import AnsweredRequests, SeriesSampler
from inferd.control.metrics.timeseries import EndpointSeries
from inferd.control.replicas.registry import Registry, Replica, ReplicaLoad, secret_digest
from inferd.vocab import ReplicaStatus

NOW = 1_800_000_000.0  # a multiple of 60


@dataclass(frozen=True)
class Held:
    held: int


class Traffic:
    def __init__(self, held: dict[str, int]) -> None:
        self.held = held

    def traffic(self, endpoint_id: str) -> Held:
        return Held(self.held.get(endpoint_id, 0))


def registry_with(*replicas: Replica) -> Registry:
    registry = Registry(clock=lambda: 0.0, health_period_s=1.0, failure_periods=3)
    for r in replicas:
        registry.add(r)
    return registry


def replica(rid: str, endpoint: str, status: ReplicaStatus, tokens: int = 0) -> Replica:
    r = Replica(rid, endpoint, 1, "cpu", 1, secret_digest(rid))
    return replace(r, status=status, load=ReplicaLoad(generated_tokens=tokens))


def test_answered_requests_land_in_the_minute_of_the_wall_clock() -> None:
    series = EndpointSeries()
    observe = AnsweredRequests(series, wall_clock=lambda: NOW + 5)
    observe("e1", 200, 0.25)
    observe("e1", 503, 1.0)
    (point,) = series.points("e1", 60, 60, NOW + 5)
    assert (point.start, point.requests, point.errors) == (int(NOW), 2, 1)
    assert point.p50 == 0.25 and point.p99 == 1.0


def test_a_sample_counts_held_requests_live_replicas_and_new_tokens() -> None:
    series = EndpointSeries()
    registry = registry_with(
        replica("a", "e1", ReplicaStatus.READY, tokens=100),
        replica("b", "e1", ReplicaStatus.STOPPED, tokens=999),
    )
    sampler = SeriesSampler(series, registry, Traffic({"e1": 3}), lambda: ["e1"])
    sampler.sample(NOW)
    (point,) = series.points("e1", 60, 60, NOW)
    # The stopped replica is neither counted nor its tokens added.
    assert (point.held, point.replicas) == (3, 1)
    assert series.totals("e1").tokens == 100


def test_a_sample_forgets_the_series_of_endpoints_no_longer_known() -> None:
    series = EndpointSeries()
    series.observe_request("gone", 0.1, 200, NOW)
    sampler = SeriesSampler(series, registry_with(), Traffic({}), lambda: ["e1"])
    sampler.sample(NOW)
    assert series.endpoint_ids() == ["e1"]
