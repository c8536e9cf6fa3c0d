"""What the control plane says of itself on `/metrics`, for alerts and
dashboards: each endpoint's bounds, status and cost, the tokens its replicas
served, replica failures, whether this instance leads and whether the store
answers.

Everything here is read at scrape time from what the server already keeps,
except two small pieces of state: token totals per endpoint (the replicas
report cumulative counters that restart with the replica; a Prometheus
counter must not go down when one replica of several goes away) and the
store probe's last answer (a scrape must never wait on the database).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from inferd.api.replica import ReplicaReport
from inferd.control.endpoints.records import EndpointRuntime, derive_status
from inferd.control.model import Endpoint
from inferd.control.replicas.registry import Registry
from inferd.vocab import EndpointStatus

log = logging.getLogger(__name__)


@dataclass
class _Served:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0


class EndpointTokens:
    """Tokens and images served per endpoint since this instance started:
    fed with every report the registry accepts (`reported`), from the
    differences between a replica's cumulative counters."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._last: dict[str, _Served] = {}
        self.totals: dict[str, _Served] = {}

    def reported(self, replica_id: str, report: ReplicaReport) -> None:
        usage = report.usage
        replica = self._registry.get(replica_id)
        if usage is None or replica is None:
            return
        now = _Served(usage.prompt_tokens, usage.completion_tokens, usage.images)
        last = self._last.get(replica_id, _Served())
        if now.prompt_tokens < last.prompt_tokens or now.completion_tokens < last.completion_tokens:
            last = _Served()  # a restarted replica process counts anew
        self._last[replica_id] = now
        total = self.totals.setdefault(replica.endpoint_id, _Served())
        total.prompt_tokens += now.prompt_tokens - last.prompt_tokens
        total.completion_tokens += now.completion_tokens - last.completion_tokens
        total.images += max(0, now.images - last.images)

    def forget(self, known_endpoints: Iterable[str], known_replicas: Iterable[str]) -> None:
        """Drop what belongs to endpoints and replicas that are gone."""
        keep = set(known_endpoints)
        for endpoint_id in [e for e in self.totals if e not in keep]:
            del self.totals[endpoint_id]
        live = set(known_replicas)
        for replica_id in [r for r in self._last if r not in live]:
            del self._last[replica_id]


class StoreProbe:
    """Asks the store a trivial question every `period_s` (bounded by
    `timeout_s`) and remembers whether it answered: `/metrics` reads the
    answer, so a scrape never waits on a database that hangs."""

    def __init__(
        self,
        ask: Callable[[], Awaitable[object]],
        *,
        period_s: float = 10.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ask = ask
        self._period_s = period_s
        self._timeout_s = timeout_s
        self._clock = clock
        self.up: bool | None = None  # None until the first answer
        self.last_ok_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def probe(self) -> bool:
        try:
            await asyncio.wait_for(self._ask(), self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure means "not answering"
            if self.up is not False:
                log.warning("the store does not answer: %s", exc)
            self.up = False
            return False
        self.up = True
        self.last_ok_at = self._clock()
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="store-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(self._period_s)


class PlaneCollector(Collector):
    """The control plane's own series (see the module's docstring)."""

    def __init__(
        self,
        endpoints: Callable[[], Iterable[Endpoint]],
        runtime_of: Callable[[str], EndpointRuntime],
        registry: Registry,
        tokens: EndpointTokens,
        store: StoreProbe,
        leading: Callable[[], bool],
    ) -> None:
        self._endpoints = endpoints
        self._runtime_of = runtime_of
        self._registry = registry
        self._tokens = tokens
        self._store = store
        self._leading = leading

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["endpoint"]
        min_replicas = GaugeMetricFamily(
            "inferd_endpoint_min_replicas", "The endpoint's minReplicas.", labels=labels
        )
        max_replicas = GaugeMetricFamily(
            "inferd_endpoint_max_replicas", "The endpoint's maxReplicas.", labels=labels
        )
        ready = GaugeMetricFamily(
            "inferd_endpoint_ready_replicas",
            "Replicas of the endpoint taking requests.",
            labels=labels,
        )
        status = GaugeMetricFamily(
            "inferd_endpoint_status",
            "1 for the endpoint's current status (as its record shows it), per endpoint.",
            labels=["endpoint", "name", "project", "model", "status"],
        )
        cost = GaugeMetricFamily(
            "inferd_endpoint_cost_per_hour",
            "What the endpoint's live replicas cost per hour now (replicas x hourly price), "
            "in the currency labelled.",
            labels=["endpoint", "currency"],
        )
        prompt = CounterMetricFamily(
            "inferd_endpoint_prompt_tokens",
            "Prompt tokens the endpoint's replicas processed (since this instance started).",
            labels=labels,
        )
        completion = CounterMetricFamily(
            "inferd_endpoint_completion_tokens",
            "Tokens the endpoint's replicas generated (since this instance started).",
            labels=labels,
        )
        images = CounterMetricFamily(
            "inferd_endpoint_generated_images",
            "Images the endpoint's replicas generated (since this instance started).",
            labels=labels,
        )
        failures = CounterMetricFamily(
            "inferd_replica_failures",
            "Replicas that failed (exited, engine dead, unhealthy), per endpoint, since this "
            "instance started: a fast rate is a replica flapping.",
            labels=labels,
        )
        rows = list(self._endpoints())
        for row in rows:
            runtime = self._runtime_of(row.id)
            derived = derive_status(row, runtime.replicas, runtime.waiting_for, runtime.replacing)
            live = [r for r in self._registry.of_endpoint(row.id) if r.live]
            min_replicas.add_metric([row.id], row.min_replicas)
            max_replicas.add_metric([row.id], row.max_replicas)
            ready.add_metric([row.id], sum(1 for r in live if r.routable))
            for candidate in EndpointStatus:
                status.add_metric(
                    [row.id, row.name, row.project_id, row.model_name, candidate.value],
                    1 if derived.status is candidate else 0,
                )
            cost.add_metric([row.id, row.currency], len(live) * row.hourly_price)
            served = self._tokens.totals.get(row.id, _Served())
            prompt.add_metric([row.id], served.prompt_tokens)
            completion.add_metric([row.id], served.completion_tokens)
            images.add_metric([row.id], served.images)
            # From zero for every endpoint, so that increase() sees the first one.
            failures.add_metric([row.id], self._registry.failures.get(row.id, 0))
        yield from (min_replicas, max_replicas, ready, status, cost)
        yield from (prompt, completion, images, failures)
        leader = GaugeMetricFamily(
            "inferd_leader", "1 while this instance leads the control plane, else 0."
        )
        leader.add_metric([], 1 if self._leading() else 0)
        yield leader
        store_up = GaugeMetricFamily(
            "inferd_store_up",
            "1 when the store (SQLite or PostgreSQL) answered this instance's last probe.",
        )
        if self._store.up is not None:
            store_up.add_metric([], 1 if self._store.up else 0)
        yield store_up

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())
