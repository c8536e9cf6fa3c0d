"""The replica as a real process, on the fake engine: lifecycle, status
reports to a registry, graceful drain on SIGTERM, aborts on disconnect.

These are control-plane behaviours (timing, signals), so the fake engine is
the right tool; the real engines are exercised in test_replica_vllm.py and
test_replica_diffusers.py.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inferd.replica.auth import call_key
from inferd.testing import ReplicaHandle, free_port
from tests.support import FakeRegistry
from tests.timings import HANG_S, record_timing

CHAT = "/openai/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    reg = FakeRegistry()
    yield reg
    reg.stop()


def fake_replica(*args: str, env: dict[str, str] | None = None) -> ReplicaHandle:
    return ReplicaHandle("tiny-chat", ["--engine", "fake", *args], env=env)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} not in metrics"
    return float(match.group(1))


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def test_reports_lifecycle_to_registry_and_drains_on_sigterm(registry: FakeRegistry) -> None:
    replica = fake_replica(
        "--registry-url", registry.url, "--replica-id", "r-1", "--endpoint-id", "e-1",
        "--report-interval", "0.2", "--engine-arg", "load_delay_s=0.5",
        "--engine-arg", "token_delay_s=0.02",
        env={"INFERD_REPLICA_SECRET": "s3cret"},
    ).wait_ready(60)  # fmt: skip
    try:
        wait_until(lambda: "ready" in registry.statuses(), HANG_S)
        ready = next(r for r in registry.reports if r["status"] == "ready")
        assert ready["replicaId"] == "r-1" and ready["endpointId"] == "e-1"
        assert ready["url"] == replica.url and "pid" not in ready  # process ids stay local
        assert [r["seq"] for r in registry.reports] == sorted({r["seq"] for r in registry.reports})
        assert set(ready["load"]) >= {"inFlight", "running", "waiting", "kvCacheUsage"}
        assert registry.auth[-1] == "Bearer s3cret"
        # What it is doing while it loads, and which engine serves it: in the
        # reports, hence in the endpoint record.
        loading = [r["reason"] for r in registry.reports if r["status"] == "loading"]
        assert loading and loading[0] == "loading tiny-chat with the fake engine"
        assert ready["engine"] == "fake" and ready["reason"] is None
        health = httpx.get(replica.url + "/healthz").json()
        assert (health["status"], health["engine"]) == ("ready", "fake")

        # With a secret, only calls with its key (the gateway's) are served.
        key = {"Authorization": f"Bearer {call_key('s3cret')}"}
        stranger = httpx.post(replica.url + CHAT, json={"messages": HELLO, "max_tokens": 1})
        assert stranger.status_code == 401

        # A long stream is in flight when SIGTERM arrives: it must finish.
        events: list[str] = []
        body = {"messages": HELLO, "max_tokens": 60, "stream": True}

        def consume() -> None:
            with httpx.stream(
                "POST", replica.url + CHAT, json=body, headers=key, timeout=30
            ) as response:
                events.extend(line for line in response.iter_lines() if line)

        reader = threading.Thread(target=consume)
        reader.start()
        wait_until(lambda: metric(replica.url, "inferd_requests_in_flight") == 1, HANG_S)
        replica.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining" in registry.statuses(), HANG_S)
        refused = httpx.post(
            replica.url + CHAT, json={"messages": HELLO, "max_tokens": 1}, headers=key
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "replica_draining"
        reader.join(30)
        assert events[-1] == "data: [DONE]"
        assert replica.process.wait(30) == 0
        assert registry.statuses() == ["starting", "loading", "ready", "draining", "stopped"]
    finally:
        replica.stop()


def test_failed_load_is_reported_with_reason(registry: FakeRegistry) -> None:
    replica = fake_replica(
        "--registry-url", registry.url, "--replica-id", "r-2",
        "--engine-arg", "fail_load=out of memory while loading weights",
    )  # fmt: skip
    try:
        assert replica.process.wait(30) == 1
        failed = registry.reports[-1]
        assert failed["status"] == "failed"
        assert "out of memory while loading weights" in failed["reason"]
    finally:
        replica.stop()


def test_replica_that_registry_forgot_drains_and_exits(registry: FakeRegistry) -> None:
    replica = fake_replica(
        "--registry-url", registry.url, "--replica-id", "r-3", "--report-interval", "0.2"
    ).wait_ready(60)
    try:
        registry.answer = 404  # the control plane no longer knows this replica
        assert replica.process.wait(15) == 0
        assert registry.statuses()[-1] == "stopped"
    finally:
        replica.stop()


def test_replica_without_registry_exits_after_orphan_timeout() -> None:
    dead_registry = f"http://127.0.0.1:{free_port()}"
    replica = fake_replica(
        "--registry-url", dead_registry, "--report-interval", "0.2", "--orphan-timeout", "1"
    ).wait_ready(60)
    try:
        assert replica.process.wait(15) == 0
    finally:
        replica.stop()


def raw_post(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST on a bare socket, so the test controls exactly when the
    client goes away (closing an httpx client from another thread does not
    reliably close a connection that is in use)."""
    parsed = httpx.URL(url)
    sock = socket.create_connection((parsed.host, parsed.port))
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parsed.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_engine_work(stream: bool) -> None:
    replica = fake_replica("--engine-arg", "token_delay_s=0.05").wait_ready(60)
    try:
        body = {"messages": HELLO, "max_tokens": 2000, "stream": stream}
        sock = raw_post(replica.url, CHAT, body)
        wait_until(lambda: metric(replica.url, "inferd_engine_running") == 1, HANG_S)
        if stream:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.close()  # the client goes away mid-generation
        # Aborted: 2,000 tokens at 50 ms each would run for 100 s, beyond
        # HANG_S. How soon is a goal, judged in benchmarks/fault_timings.py.
        freed = wait_until(lambda: metric(replica.url, "inferd_engine_running") == 0, HANG_S)
        record_timing(f"disconnect via replica (stream={stream}): fake engine freed", freed)
        wait_until(lambda: metric(replica.url, "inferd_requests_in_flight") == 0, HANG_S)
        assert metric(replica.url, "inferd_generated_tokens_total") < 2000
    finally:
        replica.stop()
