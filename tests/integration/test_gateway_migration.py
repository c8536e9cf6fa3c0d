"""Stream migration through the gateway, with real replica processes (fake
engine): a replica SIGKILLed mid-stream, and the client's stream is the one a
fault-free run gives, byte for byte (but the `created` second)."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from inferd.gateway.directory import RoutableReplica
from inferd.gateway.routing import Policy
from inferd.gateway.settings import GatewaySettings
from inferd.testing import ReplicaHandle
from tests.integration.test_gateway import (
    CHAT,
    CHAT_EP,
    GatewayServer,
    auth,
    metric,
    replica_of,
    replicas,
    serve,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)
__all__ = ["replicas", "serve"]  # the fixtures, shared with test_gateway

# The stream starts on the doomed replica: the other looks busy, and no
# prompt prefix pulls it elsewhere.
LEAST_LOADED = GatewaySettings(routing_policy=Policy.LEAST_LOADED)
_CREATED = re.compile(rb'"created": ?\d+')


def streamed_chat(max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_stream(
    gw: GatewayServer, body: dict[str, Any], kill_after: int = 0, doomed: Any = None
) -> bytes:
    """The raw bytes the client reads; `doomed` is SIGKILLed once
    `kill_after` content chunks have arrived."""
    out = b""
    seen = 0
    headers = {**auth(), "x-request-id": "chatcmpl-fixed"}
    with httpx.stream("POST", gw.url() + CHAT, json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            out += chunk
            if doomed is not None and seen < kill_after:
                seen = out.count(b'"content": "')
                if seen >= kill_after:
                    doomed.process.send_signal(signal.SIGKILL)
    return out


def usage_of(stream: bytes) -> dict[str, Any]:
    chunks = [json.loads(e[6:]) for e in stream.split(b"\n\n") if b'"usage": {' in e]
    assert len(chunks) == 1
    usage: dict[str, Any] = chunks[0]["usage"]
    return usage


@pytest.fixture
def doomed() -> Iterator[ReplicaHandle]:
    handle = ReplicaHandle(
        "tiny-chat", ["--engine", "fake", "--engine-arg", "token_delay_s=0.03"]
    ).wait_ready(60)
    try:
        yield handle
    finally:
        handle.stop()


def test_a_stream_whose_replica_is_killed_reads_as_the_fault_free_stream(
    serve: Callable[..., GatewayServer],
    replicas: list[ReplicaHandle],
    doomed: ReplicaHandle,
) -> None:
    gw = serve(
        LEAST_LOADED,
        chat_replicas=[replica_of(doomed, "r-doomed"), replica_of(replicas[0], "r-a", 50)],
    )
    faultless = serve(chat_replicas=[replica_of(replicas[1], "r-b")])
    reference = read_stream(faultless, streamed_chat(30))
    counted_before = [
        metric(replicas[0].url, name)
        for name in ("inferd_prompt_tokens_total", "inferd_generated_tokens_total")
    ]
    migrated = read_stream(gw, streamed_chat(30), kill_after=8, doomed=doomed)
    assert doomed.process.wait(10) == -signal.SIGKILL
    # The clock's second is the only difference a client may see (the
    # token-id lines the gateway reads are not seen).
    assert _CREATED.sub(b"", migrated) == _CREATED.sub(b"", reference)
    assert b": ids" not in migrated and b": ids" not in reference
    assert len(set(_CREATED.findall(migrated))) == 1
    assert migrated.count(b"data: [DONE]") == 1
    usage = usage_of(migrated)
    assert usage["prompt_tokens"] == usage_of(reference)["prompt_tokens"]
    assert usage["completion_tokens"] == 30
    text = gw.gateway.metrics.render().decode()
    series = f'{{endpoint="{CHAT_EP}",reason="connection_lost"}} 1.0'
    assert "inferd_gateway_migrations_total" + series in text
    # The replica that continued it metered the whole answer once: the
    # original prompt, and the 30 completion tokens.
    wait_until(lambda: metric(replicas[0].url, "inferd_engine_running") == 0, 5)
    counted = [
        metric(replicas[0].url, name) - before
        for name, before in zip(
            ("inferd_prompt_tokens_total", "inferd_generated_tokens_total"),
            counted_before,
            strict=True,
        )
    ]
    assert counted == [usage["prompt_tokens"], 30]


def test_a_request_that_cannot_be_continued_ends_with_an_error_naming_why(
    serve: Callable[..., GatewayServer],
    replicas: list[ReplicaHandle],
    doomed: ReplicaHandle,
) -> None:
    gw = serve(
        LEAST_LOADED,
        chat_replicas=[replica_of(doomed, "r-doomed"), replica_of(replicas[0], "r-a", 50)],
    )
    body = {**streamed_chat(30), "seed": 7, "temperature": 0.8}
    out = read_stream(gw, body, kill_after=4, doomed=doomed)
    last = json.loads(out.strip().split(b"\n\n")[-1][6:])
    assert last["error"]["code"] == "upstream_failed"
    assert "(seed)" in last["error"]["message"]
    assert b"data: [DONE]" not in out
    text = gw.gateway.metrics.render().decode()
    assert f'inferd_gateway_migrations_refused_total{{endpoint="{CHAT_EP}",reason="seed"}} 1.0' in (
        text
    )


def test_the_migration_cap_ends_the_stream_when_reached(
    serve: Callable[..., GatewayServer],
    replicas: list[ReplicaHandle],
    doomed: ReplicaHandle,
) -> None:
    gw = serve(
        GatewaySettings(max_migrations=0, routing_policy=Policy.LEAST_LOADED),
        chat_replicas=[replica_of(doomed, "r-doomed"), replica_of(replicas[0], "r-a", 50)],
    )
    out = read_stream(gw, streamed_chat(30), kill_after=4, doomed=doomed)
    last = json.loads(out.strip().split(b"\n\n")[-1][6:])
    assert "(cap)" in last["error"]["message"]


@pytest.fixture
def traced() -> Iterator[Any]:
    """The process's tracer, on, with spans kept in memory."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferd import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(tracing.TracingSettings("http://unused:4318"), "inferd-gateway", exporter)
    try:
        yield exporter
    finally:
        tracing.configure(tracing.NO_TRACING, "inferd")


def test_a_trace_shows_each_attempt_a_migration_and_a_retry(
    traced: Any,
    serve: Callable[..., GatewayServer],
    replicas: list[ReplicaHandle],
    doomed: ReplicaHandle,
) -> None:
    gw = serve(
        LEAST_LOADED,
        chat_replicas=[replica_of(doomed, "r-doomed"), replica_of(replicas[0], "r-a", 50)],
    )
    read_stream(gw, streamed_chat(30), kill_after=8, doomed=doomed)
    (migrated,) = [s for s in traced.get_finished_spans() if s.name == "POST chat"]
    events = [(e.name, dict(e.attributes or {})) for e in migrated.events]
    assert [name for name, _ in events] == ["forwarded", "migrated", "forwarded"], events
    assert events[0][1]["replica"] == "r-doomed" and events[2][1]["replica"] == "r-a"
    assert events[1][1]["lost_replica"] == "r-doomed" and events[1][1]["produced_chars"] > 0
    # The fake engine names its token ids: the continuation replays them.
    assert events[1][1]["by"] == "token_ids"
    assert migrated.attributes is not None and migrated.attributes["inferd.attempts"] == 2

    traced.clear()
    # A replica that refuses connections before answering: retried on the other.
    gone = RoutableReplica("r-gone", "http://127.0.0.1:9")
    retried = serve(LEAST_LOADED, chat_replicas=[gone, replica_of(replicas[0], "r-a", 50)])
    answer = httpx.post(retried.url() + CHAT, json=streamed_chat(4), headers=auth(), timeout=30)
    assert answer.status_code == 200
    (span,) = [s for s in traced.get_finished_spans() if s.name == "POST chat"]
    names = [e.name for e in span.events]
    assert names == ["forwarded", "retry", "forwarded"], names
    assert dict(span.events[1].attributes or {})["replica"] == "r-gone"
