"""A replica whose vLLM engine core is SIGKILLed under load: only the
requests in flight fail, new ones get a retryable 503 (which the gateway
sends elsewhere), and the replica reports `failed` with the reason and
exits, so that its launcher replaces it."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from inferd import procfs
from inferd.testing import ReplicaHandle
from tests.support import FakeRegistry, needs_vllm

pytestmark = [needs_vllm, pytest.mark.slow]

CHAT = "/openai/v1/chat/completions"


def engine_core_pid(replica_pid: int) -> int:
    """vLLM's engine-core process: the replica's child that has children
    of its own (its CPU worker)."""
    for child in procfs.children(replica_pid):
        if procfs.children(child):
            return child
    raise AssertionError(f"no engine core under {replica_pid}: {procfs.children(replica_pid)}")


def stream_until_end(url: str, outcomes: list[str]) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream("POST", f"{url}{CHAT}", json=body, timeout=120) as response:
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
