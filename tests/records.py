"""Stored records for store and leader tests: an endpoint row and a replica
record with plain defaults, any field changed by keyword."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from inferd.control.model import Endpoint, ReplicaRecord

T0 = datetime(2025, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)


def endpoint_row(
    n: int = 1, name: str | None = None, at: datetime = T0, **changes: Any
) -> Endpoint:
    row = Endpoint(
        id=f"00000000-0000-4000-8000-{n:012d}",
        name=name or f"ep-{n}",
        model_name="tiny-chat",
        model_kind="chat",
        gpu_type="cpu",
        gpu_count=1,
        location_name="local",
        min_replicas=0,
        max_replicas=2,
        retention_seconds=600,
        hourly_price=1.25,
        currency="USD",
        created_at=at,
        updated_at=at,
    )
    return replace(row, **changes) if changes else row


def replica_record(n: int, endpoint_id: str, **changes: Any) -> ReplicaRecord:
    record = ReplicaRecord(
        id=f"r-{n:012x}",
        endpoint_id=endpoint_id,
        generation=1,
        gpu_type="cpu",
        gpu_count=1,
        secret_hash=bytes([n]) * 32,
        status="starting",
        created_at=T0,
        updated_at=T0,
        node="local",
        placement={"pid": str(1000 + n), "gpu_ids": ""},
    )
    return replace(record, **changes) if changes else record
