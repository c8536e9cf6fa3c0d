"""Usage metering, pure: intervals split by hour, replica-seconds from samples,
reported counters as differences, month cost, pending figures merged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inferd.control.accounts.metering import (
    EndpointPricing,
    LiveReplica,
    ReplicaCounters,
    UsageMeter,
    merge_usage,
    month_of,
    split_hours,
)
from inferd.control.accounts.model import UsageDelta

T0 = datetime(2026, 3, 1, 10, 59, 30, tzinfo=UTC)
H10 = datetime(2026, 3, 1, 10, tzinfo=UTC)
H11 = datetime(2026, 3, 1, 11, tzinfo=UTC)
PRICE = {"ep": EndpointPricing("team", 3.6)}  # 0.001 per replica-second


@pytest.mark.parametrize(
    ("end", "seconds", "expected"),
    [
        (T0, 10, [(H10, 10.0)]),
        (T0 + timedelta(seconds=40), 60, [(H10, 50.0), (H11, 10.0)]),
        (H11, 30, [(H10, 30.0)]),
        (T0, 0, []),
        (H11 + timedelta(hours=1), 7200, [(H10, 3600.0), (H11, 3600.0)]),
    ],
)
def test_split_hours(end: datetime, seconds: float, expected: list[tuple[datetime, float]]) -> None:
    assert split_hours(end, seconds) == expected


def replica(rid: str = "r1", since: float = 100.0, gpus: int = 2) -> LiveReplica:
    return LiveReplica(rid, "ep", "A100", gpus, since)


def test_replica_seconds_from_samples() -> None:
    meter = UsageMeter()
    meter.set_month(month_of(T0), {})
    meter.sample([replica()], PRICE, now=110.0, wall=T0)  # 10 s since it started
    meter.sample([replica()], PRICE, now=115.0, wall=T0 + timedelta(seconds=5))
    meter.sample([replica(), replica("r2", since=114.0)], PRICE, now=120.0,
                 wall=T0 + timedelta(seconds=10))  # fmt: skip
    (row,) = meter.pending()
    # r1: 10 + 5 + 5; r2: 6 seconds, same key (endpoint, hour, type, count).
    assert row.replica_seconds == pytest.approx(26.0)
    assert row.cost == pytest.approx(0.026)
    assert row.gpu_type == "A100" and row.gpu_count == 2 and row.project_id == "team"
    assert meter.cost_so_far("ep") == pytest.approx(0.026)
    # A replica gone between samples is dropped; one seen again restarts from its start.
    meter.sample([], PRICE, now=130.0, wall=T0 + timedelta(seconds=20))
    assert meter.pending()[0].replica_seconds == pytest.approx(26.0)


def test_interval_across_the_hour_is_split() -> None:
    meter = UsageMeter()
    meter.sample([replica(since=0.0)], PRICE, now=60.0, wall=H11 + timedelta(seconds=20))
    rows = {r.hour: r.replica_seconds for r in meter.drain()}
    assert rows == {H10: pytest.approx(40.0), H11: pytest.approx(20.0)}
    assert meter.drain() == []


def test_counters_are_added_as_differences() -> None:
    meter = UsageMeter()
    r = replica()
    meter.count(r, "team", ReplicaCounters(3, 30, 12, 0), T0)
    meter.count(r, "team", ReplicaCounters(5, 50, 20, 0), T0)
    meter.count(r, "team", ReplicaCounters(5, 50, 20, 0), T0)  # a repeated report adds nothing
    (row,) = meter.pending()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (5, 50, 20)
    # A restarted replica process counts from zero again.
    meter.count(r, "team", ReplicaCounters(1, 10, 4, 2), T0)
    (row,) = meter.pending()
    assert (row.requests, row.prompt_tokens, row.completion_tokens, row.images) == (6, 60, 24, 2)


def test_restore_after_a_failed_write_does_not_double_the_month() -> None:
    meter = UsageMeter()
    meter.set_month(month_of(T0), {"ep": 1.0})
    meter.sample([replica()], PRICE, now=110.0, wall=T0)
    pending = meter.drain()
    meter.restore(pending)
    assert meter.cost_so_far("ep") == pytest.approx(1.01)
    assert meter.pending()[0].replica_seconds == pytest.approx(10.0)
    # Reloading the month from the store keeps what is still pending.
    meter.set_month(month_of(T0), {"ep": 1.0})
    assert meter.cost_so_far("ep") == pytest.approx(1.01)


def test_merge_usage_adds_pending_to_stored() -> None:
    stored = [UsageDelta("ep", "team", H10, "A100", 2, replica_seconds=100, requests=4, cost=0.1)]
    pending = [
        UsageDelta("ep", "team", H10, "A100", 2, replica_seconds=5, requests=1, cost=0.005),
        UsageDelta("ep", "team", H11, "A100", 2, replica_seconds=7),
    ]
    merged = merge_usage(stored, pending)
    assert [(r.hour, r.replica_seconds, r.requests) for r in merged] == [(H10, 105, 5), (H11, 7, 0)]
    assert merge_usage(stored, pending, until=H11)[0].requests == 5
    assert len(merge_usage(stored, pending, until=H11)) == 1
