"""The control plane's own series on /metrics (what the shipped alerts and
dashboard read), the store probe, and the request-id and tracing helpers."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferd.control.endpoints.records import EndpointRuntime, ReplicaView
from inferd.control.metrics.plane import EndpointTokens, PlaneCollector, StoreProbe
from inferd.control.replicas.registry import Registry, Replica, secret_digest
from inferd.testing import replica_report
from inferd.tracing import Tracer, TracingSettings, request_id_from, traceparent_of
from inferd.vocab import ReplicaStatus
from tests.records import endpoint_row

EP = endpoint_row(1, name="demo", min_replicas=2, max_replicas=3, hourly_price=2.5)


def registered(registry: Registry, rid: str) -> None:
    registry.add(Replica(rid, EP.id, 1, "cpu", 1, secret_digest(f"s-{rid}")))


def report(registry: Registry, rid: str, **usage: int) -> None:
    payload = {
        "status": "ready",
        "url": "http://127.0.0.1:9",
        "usage": {"requests": 1, **usage},
    }
    registry.report(rid, f"s-{rid}", replica_report(rid, payload))


def views(registry: Registry):  # type: ignore[no-untyped-def]
    def runtime(endpoint_id: str) -> EndpointRuntime:
        return EndpointRuntime(
            tuple(
                ReplicaView(gpus=1, status=r.status, generation=1, reason=r.reason)
                for r in registry.of_endpoint(endpoint_id)
            )
        )

    return runtime


def scrape(collector: PlaneCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics = CollectorRegistry()
    metrics.register(collector)
    text = generate_latest(metrics).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_tokens_add_up_across_replicas_and_restarts() -> None:
    registry = Registry()
    tokens = EndpointTokens(registry)
    registered(registry, "r1")
    registered(registry, "r2")
    for rid, prompt, completion in [
        ("r1", 10, 5),
        ("r2", 7, 3),
        ("r1", 30, 15),  # +20, +10
        ("r1", 4, 2),  # the replica process restarted: counts anew
    ]:
        tokens.reported(rid, replica_report(rid, {"status": "ready", "usage": {
            "requests": 1, "promptTokens": prompt, "completionTokens": completion}}))  # fmt: skip
    total = tokens.totals[EP.id]
    assert (total.prompt_tokens, total.completion_tokens) == (10 + 7 + 20 + 4, 5 + 3 + 10 + 2)
    tokens.forget([], [])
    assert tokens.totals == {}


def test_the_collector_shows_bounds_status_cost_failures_leader_and_store() -> None:
    registry = Registry()
    registered(registry, "r1")
    registered(registry, "r2")
    report(registry, "r1")

    async def answers() -> None:
        return None

    probe = StoreProbe(answers, period_s=60)
    leading = [True]
    collector = PlaneCollector(
        lambda: [EP], views(registry), registry, EndpointTokens(registry), probe, lambda: leading[0]
    )
    seen = scrape(collector)
    ep = (("endpoint", EP.id),)
    assert seen[("inferd_endpoint_min_replicas", ep)] == 2
    assert seen[("inferd_endpoint_max_replicas", ep)] == 3
    assert seen[("inferd_endpoint_ready_replicas", ep)] == 1
    assert seen[("inferd_endpoint_cost_per_hour", (("currency", "USD"), *ep))] == 2 * 2.5
    assert seen[("inferd_replica_failures_total", ep)] == 0
    assert seen[("inferd_endpoint_completion_tokens_total", ep)] == 0
    status = {
        dict(labels)["status"]: value
        for (name, labels), value in seen.items()
        if name == "inferd_endpoint_status"
    }
    assert status["running"] == 1 and sum(status.values()) == 1
    assert seen[("inferd_leader", ())] == 1
    # No store answer yet: no sample rather than a wrong one.
    assert not any(name == "inferd_store_up" for name, _ in seen)

    registry.set_status("r2", ReplicaStatus.FAILED, "exited")
    registry.set_status("r2", ReplicaStatus.FAILED, "exited again")  # the same failure
    leading[0] = False
    assert asyncio.run(probe.probe()) is True
    seen = scrape(collector)
    assert seen[("inferd_replica_failures_total", ep)] == 1
    assert seen[("inferd_leader", ())] == 0
    assert seen[("inferd_store_up", ())] == 1


def test_the_store_probe_says_down_when_the_store_fails_or_hangs() -> None:
    async def broken() -> None:
        raise OSError("connection refused")

    async def hangs() -> None:
        await asyncio.sleep(60)

    failing = StoreProbe(broken)
    assert asyncio.run(failing.probe()) is False and failing.up is False
    hanging = StoreProbe(hangs, timeout_s=0.05)
    assert asyncio.run(hanging.probe()) is False and hanging.up is False


def test_request_ids_are_kept_when_plain_and_made_otherwise() -> None:
    assert request_id_from(b"req-123.abc:9") == b"req-123.abc:9"
    for odd in (None, b"", b"a b", b"x" * 129, "é".encode(), b"a\nb"):
        made = request_id_from(odd)
        assert len(made) == 32 and made != odd


def test_tracing_is_off_without_an_endpoint_and_names_the_http_path() -> None:
    off = Tracer(TracingSettings(), "inferd-test")
    assert not off.enabled and off.start("x", []) is None
    assert TracingSettings("http://c:4318").traces_url() == "http://c:4318/v1/traces"
    assert TracingSettings("http://c:4318/v1/traces").traces_url() == "http://c:4318/v1/traces"
    assert TracingSettings("c:4317", "grpc").traces_url() == "c:4317"


def test_sampling_is_decided_once_at_the_gateway_and_followed_after() -> None:
    parent_id = "0af7651916cd43dd8448eb211c80319c"
    sampled = [(b"traceparent", f"00-{parent_id}-b7ad6b7169203331-01".encode())]
    unsampled = [(b"traceparent", f"00-{parent_id}-b7ad6b7169203331-00".encode())]
    never = Tracer(TracingSettings("http://127.0.0.1:9", sample_ratio=0.0), "inferd-test")
    always = Tracer(TracingSettings("http://127.0.0.1:9", sample_ratio=1.0), "inferd-test")
    try:
        # A new trace at ratio 0: nothing is made at all.
        assert never.start("x", []) is None
        # A client's sampled parent is followed whatever the ratio, and the
        # context passed on names this span under the same trace.
        span = never.start("x", sampled)
        assert span is not None and span.is_recording()
        header = traceparent_of(span)
        assert header is not None and header.startswith(f"00-{parent_id}-".encode())
        assert header.endswith(b"-01")
        # A client's unsampled parent is followed too: passed on, not recorded.
        quiet = always.start("x", unsampled)
        assert quiet is not None and not quiet.is_recording()
        passed_on = traceparent_of(quiet)
        assert passed_on is not None and passed_on.startswith(f"00-{parent_id}-".encode())
        assert passed_on.endswith(b"-00")
        # A replica never starts a trace of its own.
        assert always.start("replica chat", [], root=False) is None
        assert always.start("x", []) is not None
    finally:
        never.shutdown()
        always.shutdown()
