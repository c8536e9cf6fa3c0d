"""Usage metering: replica-seconds, requests, tokens and images per endpoint
per hour, with their cost.

The meter adds up in memory and hands its pending figures to the store in
batches (`drain`), where they are added to the hourly rows (never
overwritten, so several instances' figures add up). Replica-seconds come
from sampling the registry's live replicas; requests, tokens and images from
the cumulative counters each replica reports, as differences (a lost report
loses nothing: the next one carries the total).

`split_hours` is the pure part: an interval spread over the hours it covers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from inferd.control.accounts.model import UsageDelta, UsageRow, hour_of

HOUR = timedelta(hours=1)


def add_to(row: UsageRow, delta: UsageDelta) -> UsageRow:
    return dataclasses.replace(
        row,
        replica_seconds=row.replica_seconds + delta.replica_seconds,
        requests=row.requests + delta.requests,
        prompt_tokens=row.prompt_tokens + delta.prompt_tokens,
        completion_tokens=row.completion_tokens + delta.completion_tokens,
        images=row.images + delta.images,
        cost=row.cost + delta.cost,
    )


def split_hours(end: datetime, seconds: float) -> list[tuple[datetime, float]]:
    """The interval of `seconds` ending at `end`, as (hour start, seconds in
    that hour) pairs, oldest first."""
    if seconds <= 0:
        return []
    start = end - timedelta(seconds=seconds)
    parts: list[tuple[datetime, float]] = []
    hour = hour_of(start)
    while hour < end:
        lo, hi = max(start, hour), min(end, hour + HOUR)
        if hi > lo:
            parts.append((hour, (hi - lo).total_seconds()))
        hour += HOUR
    return parts


@dataclass(frozen=True)
class LiveReplica:
    """What the meter needs of one replica that holds its GPUs now."""

    replica_id: str
    endpoint_id: str
    gpu_type: str
    gpu_count: int
    since: float  # monotonic time it started


@dataclass(frozen=True)
class EndpointPricing:
    project_id: str
    hourly_price: float  # of one replica at its GPU type and count, from the price table


@dataclass(frozen=True)
class ReplicaCounters:
    """Cumulative counts a replica reports since it started."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0


class UsageMeter:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, datetime, str, int], UsageDelta] = {}
        self._accounted_until: dict[str, float] = {}
        self._counters: dict[str, ReplicaCounters] = {}
        # Cost of the current month per endpoint, as stored plus pending.
        self._month_cost: dict[str, float] = {}
        self._month: datetime | None = None

    def _add(self, delta: UsageDelta) -> None:
        if delta.is_empty():
            return
        row = self._pending.get(delta.key())
        self._pending[delta.key()] = delta if row is None else add_to(row, delta)
        if self._month is not None and delta.hour >= self._month and delta.cost:
            self._month_cost[delta.endpoint_id] = (
                self._month_cost.get(delta.endpoint_id, 0.0) + delta.cost
            )

    def sample(
        self,
        replicas: Iterable[LiveReplica],
        pricing: Mapping[str, EndpointPricing],
        now: float,
        wall: datetime,
    ) -> None:
        """Add the replica-seconds since the last sample of every live replica."""
        seen: set[str] = set()
        for r in replicas:
            seen.add(r.replica_id)
            price = pricing.get(r.endpoint_id)
            start = self._accounted_until.get(r.replica_id, r.since)
            self._accounted_until[r.replica_id] = now
            if price is None or now <= start:
                continue
            for hour, seconds in split_hours(wall, now - start):
                self._add(
                    UsageDelta(
                        r.endpoint_id, price.project_id, hour, r.gpu_type, r.gpu_count,
                        replica_seconds=seconds, cost=seconds / 3600 * price.hourly_price,
                    )
                )  # fmt: skip
        for gone in set(self._accounted_until) - seen:
            del self._accounted_until[gone]

    def count(
        self,
        replica: LiveReplica,
        project_id: str,
        counters: ReplicaCounters,
        wall: datetime,
    ) -> None:
        """A replica reported its cumulative counters: add what is new."""
        last = self._counters.get(replica.replica_id, ReplicaCounters())
        if counters.requests < last.requests:  # a restarted replica process counts anew
            last = ReplicaCounters()
        self._counters[replica.replica_id] = counters
        self._add(
            UsageDelta(
                replica.endpoint_id, project_id, hour_of(wall), replica.gpu_type, replica.gpu_count,
                requests=counters.requests - last.requests,
                prompt_tokens=max(0, counters.prompt_tokens - last.prompt_tokens),
                completion_tokens=max(0, counters.completion_tokens - last.completion_tokens),
                images=max(0, counters.images - last.images),
            )
        )  # fmt: skip

    def forget_replica(self, replica_id: str) -> None:
        self._counters.pop(replica_id, None)
        self._accounted_until.pop(replica_id, None)

    def pending(
        self, *, endpoint_id: str | None = None, project_id: str | None = None
    ) -> list[UsageDelta]:
        """Figures not handed to the store yet (a read adds them, so that it
        is current to the last sample, not to the last write)."""
        return [
            d
            for d in self._pending.values()
            if (endpoint_id is None or d.endpoint_id == endpoint_id)
            and (project_id is None or d.project_id == project_id)
        ]

    def drain(self) -> list[UsageDelta]:
        """Pending figures, handed over once (to be added to the store)."""
        pending, self._pending = list(self._pending.values()), {}
        return pending

    def restore(self, deltas: Iterable[UsageDelta]) -> None:
        """Put back figures the store did not take (it was unavailable)."""
        month = self._month
        self._month = None  # already counted in the month's cost
        for delta in deltas:
            self._add(delta)
        self._month = month

    # --- cost of the current month ------------------------------------------------------

    def set_month(self, month: datetime, costs: Mapping[str, float]) -> None:
        """Start of the current month and each endpoint's stored cost in it,
        plus what is still pending here."""
        self._month = month
        self._month_cost = dict(costs)
        for delta in self._pending.values():
            if delta.hour >= month and delta.cost:
                self._month_cost[delta.endpoint_id] = (
                    self._month_cost.get(delta.endpoint_id, 0.0) + delta.cost
                )

    @property
    def month(self) -> datetime | None:
        return self._month

    def cost_so_far(self, endpoint_id: str) -> float:
        return self._month_cost.get(endpoint_id, 0.0)


def month_of(at: datetime) -> datetime:
    return hour_of(at).replace(day=1, hour=0)


def merge_usage(
    stored: Iterable[UsageRow],
    pending: Iterable[UsageDelta],
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[UsageRow]:
    """Stored hourly rows plus pending figures in the same range, by key."""
    rows: dict[tuple[str, datetime, str, int], UsageRow] = {r.key(): r for r in stored}
    for d in pending:
        if (since is not None and d.hour < since) or (until is not None and d.hour >= until):
            continue
        row = rows.get(d.key())
        rows[d.key()] = d if row is None else add_to(row, d)
    return sorted(rows.values(), key=lambda r: (r.hour, r.endpoint_id, r.gpu_type, r.gpu_count))
