"""Sharing the gateways' load between instances: the pure policy.

Each instance keeps counting its own requests (the gateway's traffic) and,
about every second, upserts one row per endpoint it has seen into
`inferd_gateway_load` (UNLOGGED: soft state, rebuilt within a second after a
crash). The leader sums the fresh rows: the autoscaler then sees every
instance's traffic, not only what reached the leader. This is the pattern of
Knative's per-activator reports and Ray Serve's per-handle metrics.

Freshness: a row counts only while younger than `max_age_s` (twice the
publishing interval, at least 3 s), so an instance that died stops holding
load up; its `last_request_at` still counts, so an endpoint does not scale
to zero earlier because the instance that saw its last request is gone.
The leader hands the other instances' rows to its `MergedLoad` as samples,
which adds them to its own gateway's live counts.
Times in rows are the database's clock (`now()`), never a process's
monotonic clock, which does not compare across machines.

A request held at zero replicas cannot wait a publishing period: the
instance that holds it writes its row and sends `NOTIFY inferd_wake` in the
same transaction (delivered at commit), and the leader, listening, wakes
its reconciler at once. NOTIFY is not a queue (a listener that is not
connected misses it), so the leader also re-reads the table every tick.
The SQL is in `inferd.control.cluster.postgres`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from inferd.control.ports import LoadSample

# -- the policy (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class LoadReport:
    """One instance's load for one endpoint. Times: seconds since the epoch,
    on the database's clock."""

    instance_id: str
    endpoint_id: str
    in_flight: int
    held: int
    last_request_at: float | None
    reported_at: float


def max_age(interval_s: float) -> float:
    """How old a report may be and still count: two missed intervals, and
    never under 3 s (a busy instance's event loop can be late a second)."""
    return max(3.0, 2.0 * interval_s)


def remote_samples(
    reports: Iterable[LoadReport],
    own_instance: str,
    db_now: float,
    mono_now: float,
    max_age_s: float,
) -> list[LoadSample]:
    """The other instances' reports as load samples on this process's clock
    (for `MergedLoad.publish`, which adds them to this gateway's own counts).
    A stale report adds no load but keeps its last request: an endpoint
    must not scale to zero early because the instance that saw its last
    request died. Every sample is taken `mono_now`: staleness is judged
    here, against the database's clock."""
    samples = []
    for report in reports:
        if report.instance_id == own_instance:
            continue
        fresh = db_now - report.reported_at <= max_age_s
        last = report.last_request_at
        samples.append(
            LoadSample(
                source=report.instance_id,
                endpoint_id=report.endpoint_id,
                in_flight=report.in_flight if fresh else 0,
                held=report.held if fresh else 0,
                in_flight_by_replica=MappingProxyType({}),
                last_request_at=None if last is None else mono_now - (db_now - last),
                at=mono_now,
            )
        )
    return samples


@dataclass(frozen=True)
class LocalLoad:
    """One endpoint's load as this instance's gateway counts it. Its
    `last_request_at` is on this process's monotonic clock; it is sent as
    an age, and the database turns it into a time on its own clock."""

    endpoint_id: str
    in_flight: int
    held: int
    last_request_at: float | None


def rows_to_publish(
    current: Mapping[str, LocalLoad], published: Mapping[str, LocalLoad]
) -> list[LocalLoad]:
    """The rows an instance writes this round: those whose numbers changed
    since it last wrote them, and those carrying load (a heartbeat, so they
    stay fresh). An idle, unchanged row ages out harmlessly: stale rows add
    no load, and their `last_request_at` still counts."""
    return [
        load
        for endpoint_id, load in current.items()
        if load != published.get(endpoint_id) or load.in_flight or load.held
    ]
