"""Usage per LoRA adapter: requests and tokens per endpoint, adapter and hour.

Replicas report what each adapter served since they started (cumulative);
the meter adds the differences, per hour, until they are handed to the
store (`drain`, added to the stored sums: several instances' figures add
up), and keeps running totals since this instance started for Prometheus
(`inferd_adapter_*_total{endpoint, adapter}`). A lost report loses nothing:
the next one carries the total. These requests are in the endpoint's own
usage too; this is their breakdown by adapter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from inferd.api.replica import AdapterUsageReport
from inferd.control.accounts.model import hour_of
from inferd.control.model import AdapterUsage


@dataclass(frozen=True)
class _Counts:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class AdapterMeter:
    def __init__(self) -> None:
        self._last: dict[tuple[str, str], _Counts] = {}  # (replica, adapter) -> last report
        self._pending: dict[tuple[str, str, datetime], AdapterUsage] = {}
        self._totals: dict[tuple[str, str], _Counts] = {}  # (endpoint, adapter) -> since start

    def count(
        self,
        replica_id: str,
        endpoint_id: str,
        adapters: Mapping[str, AdapterUsageReport],
        wall: datetime,
    ) -> None:
        """A replica reported its cumulative per-adapter counters."""
        for name, now in adapters.items():
            last = self._last.get((replica_id, name), _Counts())
            if now.requests < last.requests:  # a restarted replica process counts anew
                last = _Counts()
            self._last[(replica_id, name)] = _Counts(
                now.requests, now.prompt_tokens, now.completion_tokens
            )
            delta = AdapterUsage(
                endpoint_id,
                name,
                hour_of(wall),
                requests=now.requests - last.requests,
                prompt_tokens=max(0, now.prompt_tokens - last.prompt_tokens),
                completion_tokens=max(0, now.completion_tokens - last.completion_tokens),
            )
            if not (delta.requests or delta.prompt_tokens or delta.completion_tokens):
                continue
            self._add(delta)
            total = self._totals.get((endpoint_id, name), _Counts())
            self._totals[(endpoint_id, name)] = _Counts(
                total.requests + delta.requests,
                total.prompt_tokens + delta.prompt_tokens,
                total.completion_tokens + delta.completion_tokens,
            )

    def _add(self, delta: AdapterUsage) -> None:
        row = self._pending.get(delta.key())
        self._pending[delta.key()] = delta if row is None else row.plus(delta)

    def forget_replica(self, replica_id: str) -> None:
        for key in [k for k in self._last if k[0] == replica_id]:
            del self._last[key]

    def pending(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        return [u for u in self._pending.values() if (u.endpoint_id, u.adapter) == (
            endpoint_id, adapter)]  # fmt: skip

    def drain(self) -> list[AdapterUsage]:
        pending, self._pending = list(self._pending.values()), {}
        return pending

    def restore(self, rows: Iterable[AdapterUsage]) -> None:
        """Put back rows the store did not take (it was unavailable)."""
        for row in rows:
            self._add(row)

    def totals(self) -> Mapping[tuple[str, str], _Counts]:
        return self._totals


def merge_adapter_usage(
    stored: Iterable[AdapterUsage], pending: Iterable[AdapterUsage]
) -> list[AdapterUsage]:
    rows = {r.key(): r for r in stored}
    for p in pending:
        row = rows.get(p.key())
        rows[p.key()] = p if row is None else row.plus(p)
    return sorted(rows.values(), key=lambda r: r.hour)


class AdapterCollector(Collector):
    """The meter's totals since this instance started, as Prometheus counters."""

    def __init__(self, meter: AdapterMeter) -> None:
        self.meter = meter

    def collect(self) -> Iterator[CounterMetricFamily]:
        labels = ["endpoint", "adapter"]
        families = {
            "requests": CounterMetricFamily(
                "inferd_adapter_requests", "Requests a LoRA adapter answered (2xx).", labels=labels
            ),
            "prompt_tokens": CounterMetricFamily(
                "inferd_adapter_prompt_tokens", "Prompt tokens with a LoRA adapter.", labels=labels
            ),
            "completion_tokens": CounterMetricFamily(
                "inferd_adapter_completion_tokens",
                "Completion tokens a LoRA adapter generated.",
                labels=labels,
            ),
        }
        for (endpoint_id, adapter), counts in sorted(self.meter.totals().items()):
            for field, family in families.items():
                family.add_metric([endpoint_id, adapter], getattr(counts, field))
        yield from families.values()
