"""Endpoint record building and status derivation (pure)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from inferd.control.endpoints.records import (
    DerivedStatus,
    ReplicaFailure,
    ReplicaView,
    build_record,
    derive_status,
    example_command,
)
from inferd.control.model import Endpoint, parse_rfc3339
from inferd.vocab import EndpointStatus, ReplicaStatus

ROW = Endpoint(
    id="0f8fad5b-d9cb-469f-a165-70867728950e",
    name="demo",
    model_name="tiny-chat",
    model_kind="chat",
    gpu_type="cpu",
    gpu_count=1,
    location_name="local",
    min_replicas=1,
    max_replicas=2,
    retention_seconds=600,
    hourly_price=2.5,
    currency="USD",
    created_at=parse_rfc3339("2025-01-01T00:00:00.000Z"),
    updated_at=parse_rfc3339("2025-01-01T00:00:00.000Z"),
)
R = ReplicaStatus


def rv(status: ReplicaStatus, generation: int = 1, reason: str | None = None) -> ReplicaView:
    return ReplicaView(gpus=1, status=status, generation=generation, reason=reason)


@pytest.mark.parametrize(
    ("min_replicas", "replicas", "deleting", "expected", "reason"),
    [
        (0, (), False, "scaledToZero", None),
        (1, (), False, "pending", None),
        (1, (), True, "deleting", None),
        (0, (rv(R.READY),), True, "deleting", None),
        (1, (rv(R.STARTING),), False, "initializing", None),
        (0, (rv(R.LOADING),), False, "initializing", None),
        (1, (rv(R.READY),), False, "running", None),
        (1, (rv(R.READY), rv(R.LOADING)), False, "running", None),
        (1, (rv(R.READY, generation=0), rv(R.LOADING)), False, "updating", None),
        (1, (rv(R.FAILED, reason="out of memory"),), False, "failed", "out of memory"),
        (1, (rv(R.FAILED), rv(R.STARTING)), False, "initializing", None),
        (0, (rv(R.STOPPED),), False, "scaledToZero", None),
        # Draining to zero: on the way down, not there yet.
        (0, (rv(R.DRAINING),), False, "updating", None),
        (1, (rv(R.DRAINING),), False, "updating", None),
    ],
)
def test_derive_status(
    min_replicas: int,
    replicas: tuple[ReplicaView, ...],
    deleting: bool,
    expected: str,
    reason: str | None,
) -> None:
    row = replace(ROW, min_replicas=min_replicas, deleting_at=ROW.created_at if deleting else None)
    derived = derive_status(row, replicas)
    assert derived.status == EndpointStatus(expected)
    assert derived.reason == reason


SPEC_FIELDS = {
    "id": str,
    "name": str,
    "modelName": str,
    "gpuType": str,
    "gpuCount": int,
    "locationName": str,
    "minReplicas": int,
    "maxReplicas": int,
    "currentReplicas": int,
    "replicas": list,
    "scaleToZeroRetentionPeriodSeconds": int,
    "hourlyPrice": float,
    "status": str,
    "url": str,
    "exampleCommand": str,
}


def test_record_has_every_spec_field_typed() -> None:
    record = build_record(ROW, "http://127.0.0.1:8080", (rv(R.READY), rv(R.STOPPED)))
    for field, typ in SPEC_FIELDS.items():
        assert isinstance(record[field], typ), field
    assert record["url"] == f"http://127.0.0.1:8080/endpoints/{ROW.id}"
    assert record["currentReplicas"] == 1
    assert record["replicas"] == [
        {
            "gpus": 1,
            "status": "ready",
            "id": "",
            "statusReason": None,
            "since": None,
            "engine": None,
            "node": None,
            "adapters": [],
            "unresponsiveSince": None,
        }
    ]
    assert record["status"] == "running"
    assert record["statusReason"] is None
    assert record["currency"] == "USD"


def test_chat_example_command() -> None:
    url = "http://h:1/endpoints/x"
    assert example_command(url, "chat", "tiny-chat") == (
        "curl http://h:1/endpoints/x/openai/v1/chat/completions"
        ' -H "Authorization: Bearer <ACCESS_TOKEN>" -H "Content-Type: application/json"'
        ' -d \'{"model": "tiny-chat", "messages": [{"role": "user", "content": "Hello!"}],'
        ' "max_tokens": 64, "stream": false}\''
    )


def test_image_example_command_is_valid_shell_and_json() -> None:
    cmd = example_command("http://h:1/endpoints/x", "image", "tiny-sdxl")
    argv = shlex.split(cmd)
    assert argv[1] == "http://h:1/endpoints/x/v1/images/generations"
    assert "Authorization: Bearer <ACCESS_TOKEN>" in argv
    body = json.loads(argv[argv.index("-d") + 1])
    assert body["model"] == "tiny-sdxl" and body["n"] == 1 and body["size"] == "1024x1024"
    assert body["prompt"]


def test_capacity_wait_is_pending_with_the_reason() -> None:
    waiting = "this machine has 0 H100-80GB GPU(s); a replica needs 1"
    derived = derive_status(replace(ROW, min_replicas=0), (), waiting_for=waiting)
    assert derived == DerivedStatus(EndpointStatus.PENDING, waiting)
    # A replica coming up wins over the wait.
    derived = derive_status(ROW, (rv(R.LOADING),), waiting_for=waiting)
    assert derived.status is EndpointStatus.INITIALIZING


def test_the_last_replica_failure_stays_on_the_record_after_replacement() -> None:
    failure = ReplicaFailure("r-1", "engine failed: EngineDeadError", "2025-01-01T00:00:05.000Z")
    record = build_record(ROW, "http://127.0.0.1:8080", (rv(R.READY),), last_failure=failure)
    assert record["status"] == "running"
    assert record["lastReplicaFailure"] == {
        "replicaId": "r-1",
        "reason": "engine failed: EngineDeadError",
        "at": "2025-01-01T00:00:05.000Z",
    }
    assert build_record(ROW, "http://127.0.0.1:8080", (rv(R.READY),))["lastReplicaFailure"] is None
