"""Per-endpoint figures per minute, recorded by inferd itself for its charts.

Two feeds: every request the gateway answers (`observe_request`: latency,
status) and a periodic `sample` of what the control plane knows (held
requests, replicas, the replicas' running totals of generated tokens and
images). Each endpoint keeps the last day of minutes in memory; a minute
keeps at most `LATENCY_SAMPLES` latencies, enough for p99 of the traffic a
chart can show. The clock is passed in (wall seconds), so tests need no sleeps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

MINUTES_KEPT = 24 * 60
LATENCY_SAMPLES = 512


@dataclass
class _Minute:
    start: int  # epoch seconds, a multiple of 60
    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    images: int = 0
    held_max: int = 0
    replicas_max: int = 0
    replica_seconds: float = 0.0


@dataclass(frozen=True)
class Point:
    """One bucket of a chart (one minute, or several merged)."""

    start: int
    seconds: int
    requests: int
    errors: int
    p50: float | None
    p95: float | None
    p99: float | None
    tokens_per_s: float
    images_per_s: float
    held: int
    replicas: int


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def merge(minutes: Iterable[_Minute], start: int, seconds: int) -> Point:
    group = list(minutes)
    latencies = sorted(x for m in group for x in m.latencies)
    return Point(
        start=start,
        seconds=seconds,
        requests=sum(m.requests for m in group),
        errors=sum(m.errors for m in group),
        p50=percentile(latencies, 50),
        p95=percentile(latencies, 95),
        p99=percentile(latencies, 99),
        tokens_per_s=sum(m.tokens for m in group) / seconds,
        images_per_s=sum(m.images for m in group) / seconds,
        held=max((m.held_max for m in group), default=0),
        replicas=max((m.replicas_max for m in group), default=0),
    )


@dataclass(frozen=True)
class Totals:
    """Since this process started."""

    requests: int = 0
    tokens: int = 0
    images: int = 0


class _EndpointSeries:
    __slots__ = ("grand", "last_sample_at", "minutes", "replica_seconds", "totals")

    def __init__(self) -> None:
        self.minutes: deque[_Minute] = deque(maxlen=MINUTES_KEPT)
        # Last running totals seen per replica: (generated tokens, images).
        self.totals: dict[str, tuple[int, int]] = {}
        self.last_sample_at: float | None = None
        self.replica_seconds = 0.0
        self.grand = Totals()

    def minute(self, now: float) -> _Minute:
        start = int(now // 60 * 60)
        if self.minutes and self.minutes[-1].start == start:
            return self.minutes[-1]
        if self.minutes and self.minutes[-1].start > start:  # the clock went back
            return self.minutes[-1]
        bucket = _Minute(start)
        self.minutes.append(bucket)
        return bucket


@dataclass(frozen=True)
class ReplicaTotals:
    replica_id: str
    generated_tokens: int
    images: int


class EndpointSeries:
    """Every endpoint's minutes, and its replica-seconds since this process started."""

    def __init__(self) -> None:
        self._series: dict[str, _EndpointSeries] = {}

    def _of(self, endpoint_id: str) -> _EndpointSeries:
        series = self._series.get(endpoint_id)
        if series is None:
            series = self._series[endpoint_id] = _EndpointSeries()
        return series

    def observe_request(self, endpoint_id: str, seconds: float, status: int, now: float) -> None:
        series = self._of(endpoint_id)
        series.grand = replace(series.grand, requests=series.grand.requests + 1)
        minute = series.minute(now)
        minute.requests += 1
        if status >= 500 or status == 429:
            minute.errors += 1
        if len(minute.latencies) < LATENCY_SAMPLES:
            minute.latencies.append(seconds)

    def sample(
        self,
        endpoint_id: str,
        *,
        held: int,
        replicas: int,
        totals: Sequence[ReplicaTotals],
        now: float,
    ) -> None:
        series = self._of(endpoint_id)
        minute = series.minute(now)
        minute.held_max = max(minute.held_max, held)
        minute.replicas_max = max(minute.replicas_max, replicas)
        if series.last_sample_at is not None and now > series.last_sample_at:
            elapsed = now - series.last_sample_at
            minute.replica_seconds += replicas * elapsed
            series.replica_seconds += replicas * elapsed
        series.last_sample_at = now
        seen: dict[str, tuple[int, int]] = {}
        tokens = images = 0
        for t in totals:
            before = series.totals.get(t.replica_id, (0, 0))
            # A total lower than before: the replica restarted its count.
            tokens += max(0, t.generated_tokens - before[0])
            images += max(0, t.images - before[1])
            seen[t.replica_id] = (t.generated_tokens, t.images)
        series.totals = seen
        minute.tokens += tokens
        minute.images += images
        grand = series.grand
        series.grand = replace(grand, tokens=grand.tokens + tokens, images=grand.images + images)

    def totals(self, endpoint_id: str) -> Totals:
        series = self._series.get(endpoint_id)
        return series.grand if series else Totals()

    def replica_seconds(self, endpoint_id: str) -> float:
        series = self._series.get(endpoint_id)
        return series.replica_seconds if series else 0.0

    def points(self, endpoint_id: str, span_s: int, bucket_s: int, now: float) -> list[Point]:
        """`span_s` seconds up to `now` in buckets of `bucket_s` (a multiple
        of 60), oldest first; empty buckets are zeros, not gaps."""
        series = self._series.get(endpoint_id)
        end = int(now // bucket_s * bucket_s) + bucket_s
        first = end - span_s
        groups: dict[int, list[_Minute]] = {}
        for m in series.minutes if series else ():
            if first <= m.start < end:
                groups.setdefault(m.start - (m.start - first) % bucket_s, []).append(m)
        return [
            merge(groups.get(start, ()), start, bucket_s) for start in range(first, end, bucket_s)
        ]

    def endpoint_ids(self) -> list[str]:
        return list(self._series)

    def forget(self, endpoint_id: str) -> None:
        self._series.pop(endpoint_id, None)
