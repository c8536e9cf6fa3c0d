"""The control plane SIGKILLed and restarted while its replicas run (issue 5,
item 3). Fake-engine replicas: this is about adoption, not the engines."""

from __future__ import annotations

import signal
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from inferd.testing import ServeHandle
from tests.reliability.fault_support import (
    CHAT,
    IMAGES,
    Endpoint,
    chat_body,
    pid_alive,
    ready_ids,
    replica_pid,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

# What a restart may change: the replicas that run now, not the settings.
RUNTIME_FIELDS = ("currentReplicas", "replicas", "status", "statusReason")


def settings_of(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in RUNTIME_FIELDS}


def gone(pid: int) -> bool:
    return not pid_alive(pid)


def call(ep: Endpoint, kind: str) -> int:
    if kind == "image":
        return ep.post(IMAGES, {"prompt": "x", "size": "64x64"}).status_code
    return ep.post(CHAT, chat_body(3)).status_code


@pytest.mark.reliability(item=3)
def test_control_plane_sigkilled_and_restarted(serve_factory: Callable[..., ServeHandle]) -> None:
    """Control plane SIGKILLed with 2 endpoints x 2 replicas: same endpoints
    after restart, replicas adopted (same PIDs) or cleanly replaced, requests
    work, no orphan process."""
    serve = serve_factory()
    kinds = {"chat": "tiny-chat", "image": "tiny-sdxl"}
    endpoints = {
        kind: Endpoint.create(serve, name=f"cp-{kind}", modelName=model, minReplicas=2)
        for kind, model in kinds.items()
    }
    pids: dict[str, int] = {}
    before: dict[str, dict[str, Any]] = {}
    for kind, ep in endpoints.items():
        record = serve.wait_record(ep.id, lambda r: len(ready_ids(r)) == 2, timeout=60)
        before[ep.id] = settings_of(record)
        for rid in ready_ids(record):
            pid = replica_pid(serve, rid)
            assert pid is not None
            pids[rid] = pid
        assert call(ep, kind) == 200
    assert sorted(serve.replica_pids()) == sorted(pids.values())

    serve.stop(signal.SIGKILL)
    # Replicas outlive a crashed control plane on purpose (in-flight work
    # finishes); the next run must take them over.
    assert all(pid_alive(pid) for pid in pids.values())
    serve.start()

    after: dict[str, set[str]] = {}
    for kind, ep in endpoints.items():
        record = serve.wait_record(
            ep.id, lambda r: r["status"] == "running" and len(ready_ids(r)) == 2, timeout=60
        )
        assert settings_of(record) == before[ep.id]
        after[ep.id] = ready_ids(record)
        assert call(ep, kind) == 200, f"{kind} endpoint after the restart"

    # Each replica of the first run is either adopted (same id, same PID) or
    # gone; the processes that run are exactly the records' replicas.
    running = {rid: replica_pid(serve, rid) for ids in after.values() for rid in ids}
    for rid, pid in pids.items():
        if rid in running:
            assert running[rid] == pid, f"replica {rid} changed PID"
        else:
            wait_until(partial(gone, pid), 10, what=f"old replica {rid} gone")
    assert sorted(serve.replica_pids()) == sorted(p for p in running.values() if p is not None)
    # This implementation adopts every live replica (not only "or restarted").
    assert set(running) == set(pids)

    assert serve.stop() == 0
    assert serve.launched_pids() == []
