"""The registry with an injected clock: reports, sticky verdicts, liveness,
and the gateway's view."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferd.control.replicas.registry import (
    LOADING_SILENCE_FACTOR,
    Registry,
    Replica,
    ReportRejected,
    secret_digest,
)
from inferd.testing import replica_report
from inferd.vocab import ReplicaStatus as S


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock, **kwargs: Any) -> tuple[Registry, list[str]]:
    changes: list[str] = []
    kwargs = {"start_timeout_s": 60.0, **kwargs}
    registry = Registry(
        clock=clock, health_period_s=1.0, failure_periods=3, on_change=changes.append, **kwargs
    )
    return registry, changes


def replica(rid: str = "r1", endpoint: str = "e1") -> Replica:
    return Replica(rid, endpoint, 1, "cpu", 1, secret_digest(f"s-{rid}"))


def report(registry: Registry, status: str, rid: str = "r1", **extra: Any) -> None:
    payload = {"status": status, "url": "http://127.0.0.1:9", "load": {"inFlight": 2}, **extra}
    registry.report(rid, f"s-{rid}", replica_report(rid, payload))


def test_reports_move_a_replica_forward_and_into_routing() -> None:
    clock = Clock()
    registry, changes = make(clock)
    registry.add(replica())
    assert registry.ready_replicas("e1") == []
    report(registry, "loading")
    report(registry, "ready")
    (routable,) = registry.ready_replicas("e1")
    assert routable.replica_id == "r1" and routable.url == "http://127.0.0.1:9"
    assert registry.get("r1").load.in_flight == 2  # type: ignore[union-attr]
    assert changes.count("e1") >= 3  # added, loading, ready
    # A stale report cannot move it back.
    report(registry, "loading")
    assert registry.get("r1").status is S.READY  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "rid,secret,status",
    [("nobody", "s-nobody", 404), ("r1", "wrong", 401), ("r1", None, 401)],
)
def test_reports_are_authenticated(rid: str, secret: str | None, status: int) -> None:
    registry, _ = make(Clock())
    registry.add(replica())
    with pytest.raises(ReportRejected) as info:
        registry.report(rid, secret, replica_report(rid, {"status": "ready"}))
    assert info.value.status == status


def test_control_plane_verdicts_are_sticky() -> None:
    registry, _ = make(Clock())
    registry.add(replica())
    report(registry, "ready")
    registry.set_status("r1", S.DRAINING, "scaled down")
    report(registry, "ready")  # a report already on its way
    assert registry.get("r1").status is S.DRAINING  # type: ignore[union-attr]
    assert registry.ready_replicas("e1") == []
    report(registry, "stopped")
    assert registry.get("r1").status is S.STOPPED  # type: ignore[union-attr]
    registry.set_status("r1", S.READY)  # terminal: no way back
    assert registry.get("r1").status is S.STOPPED  # type: ignore[union-attr]


def test_a_failed_replica_is_told_it_is_gone() -> None:
    registry, _ = make(Clock())
    registry.add(replica())
    registry.set_status("r1", S.FAILED, "stopped reporting")
    with pytest.raises(ReportRejected) as info:
        report(registry, "ready")
    assert info.value.status == 410


def test_silence_makes_a_ready_replica_unresponsive_not_failed() -> None:
    """Silence past the failure periods: `unresponsive` (shown, counted),
    never failed by the registry; past the dead grace: overdue, still not
    failed here (the reconciler decides)."""
    clock = Clock()
    registry, changes = make(clock, dead_after_s=20.0)
    registry.add(replica())
    report(registry, "ready")
    clock.now += 2.9
    assert registry.check_liveness().overdue == []
    assert not registry.get("r1").unresponsive  # type: ignore[union-attr]
    clock.now += 0.2
    changes.clear()
    findings = registry.check_liveness()
    assert findings.failed == [] and findings.overdue == []
    silent = registry.get("r1")
    assert silent is not None and silent.unresponsive and silent.status is S.READY
    assert silent.unresponsive_since_wall
    assert changes == ["e1"]  # the record and the reconciler hear of it
    # The only replica of its endpoint: still routed to.
    assert [r.replica_id for r in registry.ready_replicas("e1")] == ["r1"]
    clock.now += 17.0  # 20.1 s silent
    (overdue,) = registry.check_liveness().overdue
    assert overdue.replica_id == "r1" and overdue.status is S.READY
    ended = registry.end_silent("r1")
    assert ended is not None and ended.status is S.FAILED
    assert "20s" in (ended.reason or "") and "health-probe" in (ended.reason or "")


def test_an_unresponsive_replica_is_routed_around_while_another_is_ready() -> None:
    clock = Clock()
    registry, _ = make(clock)
    registry.add(replica("r1"))
    registry.add(replica("r2"))
    report(registry, "ready", "r1")
    report(registry, "ready", "r2")
    clock.now += 3.5
    report(registry, "ready", "r2")
    registry.check_liveness()
    assert [r.replica_id for r in registry.ready_replicas("e1")] == ["r2"]
    # Both unresponsive: both routed to again (slow answers beat none).
    clock.now += 3.5
    registry.check_liveness()
    assert {r.replica_id for r in registry.ready_replicas("e1")} == {"r1", "r2"}


@pytest.mark.parametrize("how", ["report", "answer", "probe"])
def test_an_unresponsive_replica_comes_back_as_soon_as_it_is_heard(how: str) -> None:
    clock = Clock()
    registry, changes = make(clock)
    registry.add(replica("r1"))
    registry.add(replica("r2"))
    report(registry, "ready", "r1")
    report(registry, "ready", "r2")
    clock.now += 3.5
    report(registry, "ready", "r2")
    registry.check_liveness()
    assert registry.get("r1").unresponsive  # type: ignore[union-attr]
    changes.clear()
    if how == "report":
        report(registry, "ready", "r1")
    elif how == "answer":
        registry.report_answered("r1")
    else:
        registry.probe_answered("r1")
    assert not registry.get("r1").unresponsive  # type: ignore[union-attr]
    assert changes == ["e1"]
    assert {r.replica_id for r in registry.ready_replicas("e1")} == {"r1", "r2"}


def test_a_report_from_a_stalled_serving_loop_says_alive_not_serving() -> None:
    """Reports come from their own thread: one that says the serving loop
    has not answered for longer than the failure periods keeps the process
    known to live but does not count as serving."""
    clock = Clock()
    registry, _ = make(clock, dead_after_s=20.0)
    registry.add(replica())
    report(registry, "ready")
    for beat in range(1, 11):
        clock.now += 2.0
        report(registry, "ready", loopStalledS=2.0 * beat)
        registry.check_liveness()
    assert registry.get("r1").unresponsive  # type: ignore[union-attr]
    clock.now += 2.5  # 20.5 s since the last beat whose loop answered in time
    assert [r.replica_id for r in registry.check_liveness().overdue] == ["r1"]
    # A short stall (under the failure periods) is a late loop, not a hung one.
    report(registry, "ready", loopStalledS=0.5)
    assert not registry.get("r1").unresponsive  # type: ignore[union-attr]
    assert registry.check_liveness().overdue == []


def test_a_replica_that_answers_is_alive_though_its_reports_are_late() -> None:
    """Answers the gateway relayed count as signs of life."""
    clock = Clock()
    registry, _ = make(clock)
    registry.add(replica())
    report(registry, "ready")
    for _ in range(5):  # no report for 10 s, but an answer every 2 s
        clock.now += 2.0
        registry.report_answered("r1")
        registry.check_liveness()
        assert not registry.get("r1").unresponsive  # type: ignore[union-attr]
    registry.report_answered("gone-replica")  # an unknown id is not remembered
    assert "gone-replica" not in registry._answered_at


def test_quiet_replicas_are_the_ones_to_probe() -> None:
    clock = Clock()
    registry, _ = make(clock)
    registry.add(replica("r1"))
    registry.add(replica("r2"))
    registry.add(replica("r3"))  # no URL yet: nothing to probe
    report(registry, "ready", "r1")
    report(registry, "loading", "r2")
    clock.now += 1.5
    report(registry, "ready", "r1")
    assert [r.replica_id for r in registry.quiet()] == ["r2"]


def test_a_loading_replica_gets_the_start_timeout_only_while_it_reports() -> None:
    clock = Clock()
    registry, _ = make(clock)
    registry.add(replica())
    clock.now += 30  # no report yet: within the start timeout
    assert registry.check_liveness().failed == []
    report(registry, "loading")
    for _ in range(20):  # reporting while loading: fine until the start timeout
        clock.now += 1
        report(registry, "loading")
        findings = registry.check_liveness()
        assert findings.failed == [] and findings.overdue == []
    clock.now += 11
    (failed,) = registry.check_liveness().failed
    assert "not ready after 60s" in (failed.reason or "")


def test_a_loading_replica_is_overdue_only_later_than_a_ready_one() -> None:
    clock = Clock()
    registry, _ = make(clock, start_timeout_s=900.0, dead_after_s=20.0)
    registry.add(replica())
    report(registry, "loading")
    clock.now += 20.5  # would make a ready replica overdue
    assert registry.check_liveness().overdue == []
    assert not registry.get("r1").unresponsive  # type: ignore[union-attr]
    clock.now += 20 * LOADING_SILENCE_FACTOR - 20.5 - 0.2  # just short of the loading grace
    assert registry.check_liveness().overdue == []
    clock.now += 0.3
    (overdue,) = registry.check_liveness().overdue
    assert overdue.status is S.LOADING
    assert "while loading" in (registry.end_silent("r1").reason or "")  # type: ignore[union-attr]


def test_unreachable_leaves_routing_until_the_next_report() -> None:
    registry, _ = make(Clock())
    registry.add(replica())
    report(registry, "ready")
    registry.report_unreachable("r1", "connection refused")
    assert registry.ready_replicas("e1") == []
    report(registry, "ready")
    assert len(registry.ready_replicas("e1")) == 1


def test_wait_ready_wakes_when_a_replica_turns_ready() -> None:
    async def scenario() -> tuple[bool, bool]:
        registry, _ = make(Clock())
        registry.add(replica())
        timed_out = await registry.wait_ready("e1", 0.01)
        waiter = asyncio.ensure_future(registry.wait_ready("e1", 5))
        await asyncio.sleep(0)
        report(registry, "ready")
        return timed_out, await asyncio.wait_for(waiter, 1)

    assert asyncio.run(scenario()) == (False, True)


def test_a_report_older_than_one_applied_is_dropped() -> None:
    registry, _ = make(Clock())
    registry.add(replica())
    newer = replica_report("r1", {"status": "ready", "url": "http://127.0.0.1:9"})
    older = newer.model_copy(update={"seq": newer.seq - 1, "status": S.LOADING})
    assert registry.report("r1", "s-r1", newer) is True
    assert registry.report("r1", "s-r1", older) is False
    assert registry.get("r1").status is S.READY  # type: ignore[union-attr]


def test_a_report_for_another_replica_is_refused() -> None:
    registry, _ = make(Clock())
    registry.add(replica("r1"))
    with pytest.raises(ReportRejected) as info:
        registry.report("r1", "s-r1", replica_report("r2", {"status": "ready"}))
    assert info.value.status == 400


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"replicaId": "r1", "seq": 1}',  # no status
        b'{"replicaId": "r1", "seq": 1, "status": "dancing"}',
        b'{"replicaId": "r1", "seq": "1", "status": "ready"}',  # a string is not a number
        b'{"replicaId": "r1", "seq": 1, "status": "ready", "load": {"inFlight": "many"}}',
        b'{"replicaId": "r1", "seq": 1, "status": "ready", "load": {"inFlight": -1}}',
        b'{"replicaId": "r1", "seq": 1, "status": "ready", "load": []}',
    ],
)
def test_a_malformed_report_is_a_400_in_the_error_shape(body: bytes) -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from inferd.control.replicas.registry_api import REGISTRY_PATH, report_route
    from inferd.http_errors import EXCEPTION_HANDLERS

    registry, _ = make(Clock())
    registry.add(replica("r1"))
    app = Starlette(routes=[report_route(registry)], exception_handlers=EXCEPTION_HANDLERS)
    with TestClient(app) as client:
        response = client.post(
            f"{REGISTRY_PATH}/replicas/r1",
            content=body,
            headers={"Authorization": "Bearer s-r1", "Content-Type": "application/json"},
        )
    assert response.status_code == 400, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    ok = b'{"replicaId": "r1", "seq": 9, "status": "ready", "url": "http://127.0.0.1:9"}'
    with TestClient(app) as client:
        response = client.post(
            f"{REGISTRY_PATH}/replicas/r1", content=ok, headers={"Authorization": "Bearer s-r1"}
        )
    assert response.status_code == 204 and registry.ready_replicas("e1")


def test_a_report_without_the_secret_is_401_before_its_body_is_read() -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from inferd.control.replicas.registry_api import REGISTRY_PATH, report_route
    from inferd.http_errors import EXCEPTION_HANDLERS

    registry, _ = make(Clock())
    registry.add(replica("r1"))
    app = Starlette(routes=[report_route(registry)], exception_handlers=EXCEPTION_HANDLERS)
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = client.post(
                f"{REGISTRY_PATH}/replicas/r1", content=b"not json", headers=headers
            )
            assert response.status_code == 401, response.text
        unknown = client.post(
            f"{REGISTRY_PATH}/replicas/r9", content=b"{}", headers={"Authorization": "Bearer s-r1"}
        )
        assert unknown.status_code == 404, unknown.text


def test_engine_figures_reach_the_registry_routing_and_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from inferd.control.replicas.registry_api import ReplicaCollector

    registry, _ = make(Clock())
    registry.add(replica("r1"))
    registry.add(replica("r2"))
    load = {"waiting": 3, "kvCacheUsage": 0.5, "kvCacheTokens": 12288, "prefixCacheQueries": 1000,
            "prefixCacheHits": 750, "adapters": ["sql", "chat-fr"]}  # fmt: skip
    report(registry, "ready", "r1", load=load)
    report(registry, "ready", "r2", load={"prefixCacheQueries": 1000, "prefixCacheHits": 250})
    figures = registry.get("r1").load  # type: ignore[union-attr]
    assert (figures.prefix_cache_queries, figures.prefix_cache_hits) == (1000, 750)
    by_id = {r.replica_id: r for r in registry.ready_replicas("e1")}
    assert by_id["r1"].adapters == {"sql", "chat-fr"} and by_id["r1"].reported_waiting == 3
    assert by_id["r2"].adapters == frozenset()
    # The gateway places prompt prefixes by each replica's KV-cache size.
    assert (by_id["r1"].kv_cache_tokens, by_id["r2"].kv_cache_tokens) == (12288, None)
    metrics = CollectorRegistry()
    metrics.register(ReplicaCollector(registry))
    text = generate_latest(metrics).decode()
    assert 'inferd_endpoint_prefix_cache_hit_rate{endpoint="e1"} 0.5' in text
    assert 'inferd_endpoint_prefix_cache_queried_tokens{endpoint="e1"} 2000.0' in text
    assert 'inferd_endpoint_kv_cache_usage{endpoint="e1"} 0.5' in text
    assert 'inferd_endpoint_engine_waiting{endpoint="e1"} 3.0' in text


@pytest.mark.parametrize(
    "load",
    [
        {"prefixCacheHits": -1},
        {"prefixCacheQueries": "many"},
        {"adapters": "sql"},
        {"adapters": ["x" * 201]},
        {"adapters": [str(i) for i in range(257)]},
        {"kvCacheTokens": 0},
        {"kvCacheTokens": "lots"},
    ],
)
def test_bad_engine_figures_are_refused(load: dict[str, Any]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        replica_report("r1", {"status": "ready", "load": load})


def test_the_stage_of_a_replica_on_its_way_is_what_a_held_stream_is_told() -> None:
    registry, _ = make(Clock())
    assert registry.coming_stage("e1") is None  # nothing launched: scaled to zero
    registry.add(replica("r1"))
    registry.add(replica("r2"))
    assert registry.coming_stage("e1") == "starting"
    report(registry, "loading", "r1", reason="preparing m: building or downloading its weights")
    assert registry.coming_stage("e1") == "building weights"
    report(registry, "loading", "r2", reason="warming up: one request through the engine")
    assert registry.coming_stage("e1") == "warming up"  # the furthest one
    report(registry, "ready", "r2")
    assert registry.coming_stage("e1") == "building weights"  # r1 is still on its way
    report(registry, "ready", "r1")
    assert registry.coming_stage("e1") is None and registry.coming_stage("e2") is None
