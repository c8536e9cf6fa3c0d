"""A replica whose vLLM engine core is SIGKILLed under load: only the
requests in flight fail, new ones get a retryable 503 (which the gateway
sends elsewhere), and the replica reports `failed` with the reason and
exits, so that its launcher replaces it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd import procfs
from inferd.testing import ReplicaHandle, ServeHandle
from tests.support import FakeRegistry, needs

pytestmark = [needs("vllm"), pytest.mark.slow]

CHAT = "/openai/v1/chat/completions"


def engine_core_pid(replica_pid: int) -> int:
    """vLLM's engine-core process: the replica's child that has children
    of its own (its CPU worker)."""
    for child in procfs.children(replica_pid):
        if procfs.children(child):
            return child
    raise AssertionError(f"no engine core under {replica_pid}: {procfs.children(replica_pid)}")


def stream_until_end(url: str, outcomes: list[str], headers: dict[str, str] | None = None) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        target = url if url.endswith(CHAT) else f"{url}{CHAT}"
        with httpx.stream("POST", target, json=body, headers=headers, timeout=120) as response:
            text = "".join(response.iter_text())
        outcomes.append("done" if text.rstrip().endswith("[DONE]") else "failed in band")
    except httpx.HTTPError as exc:
        outcomes.append(f"connection: {type(exc).__name__}")


def test_sigkill_of_the_engine_core_fails_the_replica(tiny_chat_dir: Any) -> None:
    registry = FakeRegistry()
    replica = ReplicaHandle(
        str(tiny_chat_dir),
        [
            *("--engine", "vllm", "--device", "cpu", "--served-model-name", "tiny-chat"),
            *("--registry-url", registry.url, "--replica-id", "r-dead", "--report-interval", "0.5"),
            *("--health-interval", "0.5", "--no-warmup"),
        ],
    )
    try:
        replica.wait_ready(timeout=300)
        # The replica answers before its reporter (its own thread, every
        # 0.5 s) has told the registry; under a loaded machine that report
        # can come seconds later. The kill must come after it for the
        # ready -> failed transition to be what is checked.
        deadline = time.monotonic() + 60
        while "ready" not in registry.statuses():
            assert time.monotonic() < deadline, registry.statuses()
            time.sleep(0.1)
        core = engine_core_pid(replica.pid)
        outcomes: list[str] = []
        streams = [
            threading.Thread(target=stream_until_end, args=(replica.url, outcomes))
            for _ in range(3)
        ]
        for thread in streams:
            thread.start()
        time.sleep(1.0)  # the streams are generating
        os.kill(core, signal.SIGKILL)
        # A request sent now, before the replica exits, is refused with a
        # code the gateway retries on another replica, or is never answered
        # (the replica is exiting); it is never a 500.
        try:
            late = httpx.post(
                f"{replica.url}{CHAT}",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                timeout=30,
            )
            assert late.status_code == 503, late.text
            assert late.json()["error"]["code"] in ("engine_dead", "replica_failed")
        except httpx.TransportError:
            pass
        for thread in streams:
            thread.join(60)
        assert len(outcomes) == 3 and "done" not in outcomes, outcomes
        assert replica.process.wait(timeout=60) == 1
        failed = [r for r in registry.reports if r["status"] == "failed"]
        assert failed, registry.statuses()
        assert failed[-1]["reason"].startswith("engine failed:"), failed[-1]
        assert registry.statuses()[-2:] == ["ready", "failed"]
    finally:
        replica.stop()
        registry.stop()


# Two loads of vLLM (the replica and its replacement) on a shared 2-core box.
@pytest.mark.timeout(1500)
def test_endpoint_serves_again_after_its_engine_core_is_killed(tmp_path: Path) -> None:
    """Through `inferd serve`: the engine core of the endpoint's one replica is
    SIGKILLed under load; only the requests in flight may fail, the control
    plane hears why the replica failed, a replacement is started, and the
    endpoint serves again (a request sent meanwhile is held, not failed)."""
    serve = ServeHandle(
        tmp_path,
        settings={
            "health_period_seconds": "0.5",
            "reconcile_period_seconds": "0.2",
            "gateway_hold_timeout_seconds": "600",
            "replica_args": "--cpu-kv-cache-gib 1 --health-interval 0.5",
        },
    ).start()
    try:
        created = serve.create_endpoint(
            name="chat", modelName="tiny-chat", minReplicas=1, maxReplicas=1
        )
        eid = created["id"]
        record = serve.wait_record(eid, lambda r: r["status"] == "running", timeout=600)
        (first,) = record["replicas"]
        url = f"{created['url']}/openai/v1/chat/completions"
        headers = {"Authorization": f"Bearer {created['accessToken']}"}
        (replica_pid,) = serve.replica_pids()
        core = engine_core_pid(replica_pid)
        outcomes: list[str] = []
        streams = [
            threading.Thread(target=stream_until_end, args=(url, outcomes, headers))
            for _ in range(2)
        ]
        for thread in streams:
            thread.start()
        time.sleep(1.0)
        os.kill(core, signal.SIGKILL)
        # Why it failed reaches the control plane.
        deadline = time.monotonic() + 120
        expected = f"replica {first['id']} of endpoint {eid} failed (engine failed:"
        while expected not in serve.out_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the failure never reached the control plane"
            time.sleep(0.2)
        # Sent after the kill: held by the gateway until a replica is ready.
        after = httpx.post(
            url,
            headers=headers,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=900,
        )
        assert after.status_code == 200, after.text
        for thread in streams:
            thread.join(60)
        assert len(outcomes) == 2, outcomes
        record = serve.record(eid)
        assert record["status"] == "running"
        assert any(r["status"] == "ready" and r["id"] != first["id"] for r in record["replicas"])
        # The record keeps why the replaced replica failed.
        last = record["lastReplicaFailure"]
        assert last is not None and last["replicaId"] == first["id"], record
        assert last["reason"].startswith("engine failed:"), last
    finally:
        serve.cleanup()
