"""Item 7: overload. The gateway bounds what waits per endpoint
(`gateway_max_queued_per_endpoint`) and what runs per replica
(`gateway_max_in_flight_per_replica`); past the bounds it answers 429 (503
while scaling from zero) with a `Retry-After` computed from what it observed.

A real `inferd serve` with fake-engine replicas (a token every 20 ms, 10
tokens a request), so capacity is known and measurable: it is measured
first, then driven at twice that for a bounded time.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from inferd.testing import ServeHandle
from tests.reliability.fault_support import CHAT, Endpoint, metric, replica_url, wait_until
from tests.reliability.limits_support import assert_error, rss_mib
from tests.timings import record_figure

pytestmark = pytest.mark.reliability(item=7)

SLOTS = 4  # gateway_max_in_flight_per_replica
QUEUE = 8  # gateway_max_queued_per_endpoint
TOKENS = 10  # per request, at token_delay_s=0.02: ~0.2 s of service
LOAD_SECONDS = 8.0
MAX_LOAD_REQUESTS = 500
# RSS of `inferd serve` may grow by at most this much under load, and keep
# at most this much after it (allocator slack, metric children, caches).
RSS_PEAK_MARGIN_MIB = 48.0
RSS_AFTER_MARGIN_MIB = 24.0
RECOVERY_LIMIT_S = 60.0

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    handle = ServeHandle(
        tmp_path_factory.mktemp("overload"),
        settings={
            "replica_args": "--engine fake --engine-arg token_delay_s=0.02",
            "health_period_seconds": "0.5",
            "reconcile_period_seconds": "0.2",
            "gateway_max_queued_per_endpoint": str(QUEUE),
            "gateway_max_in_flight_per_replica": str(SLOTS),
        },
    )
    try:
        yield handle.start()
    finally:
        handle.cleanup()


class Sampler(threading.Thread):
    """Samples, every `interval`, the RSS of the server process and the
    gateway's and the replica's own counts of what waits and runs."""

    def __init__(self, pid: int, server: str, endpoint: str, replica: str | None) -> None:
        super().__init__(daemon=True)
        self.pid, self.server, self.endpoint, self.replica = pid, server, endpoint, replica
        self.rss: list[float] = []
        self.held: list[float] = []
        self.in_flight: list[float] = []
        self.replica_in_flight: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.rss.append(rss_mib(self.pid))
            on = {"endpoint": self.endpoint}
            self.held.append(metric(self.server, "inferd_gateway_held_requests", **on))
            self.in_flight.append(metric(self.server, "inferd_gateway_in_flight_requests", **on))
            if self.replica:
                self.replica_in_flight.append(metric(self.replica, "inferd_requests_in_flight"))


async def closed_loop(url: str, headers: dict[str, str], workers: int, seconds: float) -> float:
    """Requests per second `workers` clients get, each sending the next
    request when the last is answered."""
    done = 0
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30) as client:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < end:
                response = await client.post(url, json=BODY, headers=headers)
                assert response.status_code == 200, response.text
                done += 1

        await asyncio.gather(*(worker() for _ in range(workers)))
    return done / seconds


async def open_loop(
    url: str, headers: dict[str, str], rate: float, seconds: float, limit: int
) -> list[tuple[int | str, float, dict[str, str], bytes]]:
    """Send at a fixed `rate` for `seconds` (at most `limit` requests) without
    waiting for answers; returns (status or exception name, latency,
    headers, body) for each."""

    async def one(client: httpx.AsyncClient) -> tuple[int | str, float, dict[str, str], bytes]:
        started = time.monotonic()
        try:
            response = await client.post(url, json=BODY, headers=headers)
        except httpx.HTTPError as exc:
            return type(exc).__name__, time.monotonic() - started, {}, b""
        latency = time.monotonic() - started
        return response.status_code, latency, dict(response.headers), response.content

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        tasks = []
        start = time.monotonic()
        while len(tasks) < limit and time.monotonic() - start < seconds:
            tasks.append(asyncio.ensure_future(one(client)))
            await asyncio.sleep(max(0.0, start + len(tasks) / rate - time.monotonic()))
        return list(await asyncio.gather(*tasks))


def test_twice_the_capacity_gets_429_with_retry_after_bounded_memory_and_recovers(
    serve: ServeHandle,
) -> None:
    """Twice the measured capacity for 8 s: only 200s and 429s (one error
    shape, Retry-After 1 s to the queue's drain), queue, in-flight and RSS
    bounded; all served again afterwards."""
    endpoint = Endpoint.create(serve, name="busy", modelName="tiny-chat", minReplicas=1)
    record = serve.wait_record(endpoint.id, lambda r: r["status"] == "running", timeout=60)
    url = endpoint.url + CHAT
    assert serve.process is not None
    pid = serve.process.pid

    capacity = asyncio.run(closed_loop(url, endpoint.headers, SLOTS, 3.0))
    rate = 2 * capacity
    rss_before = rss_mib(pid)
    sampler = Sampler(pid, serve.url, endpoint.id, replica_url(serve, record["replicas"][0]["id"]))
    sampler.start()
    load_started = time.monotonic()
    try:
        answers = asyncio.run(
            open_loop(url, endpoint.headers, rate, LOAD_SECONDS, MAX_LOAD_REQUESTS)
        )
    finally:
        sampler.stop.set()
        sampler.join()
    load_ended = time.monotonic()

    counts = Counter(status for status, *_ in answers)
    served = [latency for status, latency, *_ in answers if status == 200]
    retry_afters = Counter(h.get("retry-after") for status, _, h, _ in answers if status == 429)
    print(
        f"\ncapacity {capacity:.1f} req/s; {len(answers)} requests at {rate:.1f} req/s over "
        f"{load_ended - load_started:.1f} s: {dict(counts)}; Retry-After {dict(retry_afters)}; "
        f"RSS {rss_before:.1f} MiB before, {max(sampler.rss):.1f} peak; held max "
        f"{max(sampler.held):.0f}, gateway in flight max {max(sampler.in_flight):.0f}, replica "
        f"in flight max {max(sampler.replica_in_flight):.0f}"
    )

    # Only answers, and only these: no 5xx, no client timeouts or resets.
    assert set(counts) <= {200, 429}, counts
    assert counts[429] > 0, "twice the capacity must overflow the bounds"
    # The replica keeps serving meanwhile. How much of its capacity (goal: at
    # least half) is benchmarks/fault_timings.py's to judge on a quiet machine.
    assert counts[200] > 0, counts
    record_figure("overload: served / capacity", counts[200] / (capacity * LOAD_SECONDS), "x")
    # The bounds hold, in the gateway and at the replica.
    assert max(sampler.held) <= QUEUE
    assert max(sampler.in_flight) <= SLOTS
    assert max(sampler.replica_in_flight) <= SLOTS
    # Refusals are in the one shape, with an honest Retry-After: at least 1 s
    # and no more than the time the full queue ahead takes to drain through
    # the replica's slots at the slowest service seen (plus rounding).
    worst_drain = math.ceil((QUEUE + 1) * max(served) / SLOTS)
    for status, _, headers, body in answers:
        if status == 429:
            response = httpx.Response(429, headers=headers, content=body)
            assert_error(response, 429, code="overloaded")
            assert 1 <= int(headers["retry-after"]) <= worst_drain + 1, headers
    # Memory stays bounded: refused requests leave nothing behind.
    assert max(sampler.rss) - rss_before <= RSS_PEAK_MARGIN_MIB, sampler.rss

    # Within a minute after the load drops, everything is back to zero
    # errors: a round of requests within capacity is answered 200, every one.
    def all_served() -> bool:
        async def round_() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                tasks = [client.post(url, json=BODY, headers=endpoint.headers)
                         for _ in range(SLOTS)]  # fmt: skip
                return [r.status_code for r in await asyncio.gather(*tasks)]

        return all(s == 200 for _ in range(3) for s in asyncio.run(round_()))

    recovered_in = wait_until(all_served, RECOVERY_LIMIT_S, 0.5, "zero errors after the load")
    labels = {"endpoint": endpoint.id}
    assert metric(serve.url, "inferd_gateway_held_requests", **labels) == 0
    assert metric(serve.url, "inferd_gateway_in_flight_requests", **labels) == 0
    rss_after = rss_mib(pid)
    print(f"recovered {recovered_in:.1f} s after the load; RSS after {rss_after:.1f} MiB")
    assert rss_after - rss_before <= RSS_AFTER_MARGIN_MIB


def test_overflow_while_scaling_from_zero_is_503_with_retry_after(serve: ServeHandle) -> None:
    """At zero replicas the first QUEUE requests are held and all answered
    once a replica is up; the rest are refused at once with 503 and a
    Retry-After. The first estimate is the configured cold start; once one
    has been observed, the next estimate is that observation."""
    endpoint = Endpoint.create(
        serve,
        name="cold",
        modelName="tiny-chat",
        minReplicas=0,
        maxReplicas=1,
        scaleToZeroRetentionPeriodSeconds=1,
    )
    url = endpoint.url + CHAT
    assert serve.record(endpoint.id)["status"] == "scaledToZero"
    others = set(serve.replica_pids())

    def burst() -> tuple[list[httpx.Response], float]:
        async def send() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [client.post(url, json=BODY, headers=endpoint.headers)
                         for _ in range(2 * QUEUE)]  # fmt: skip
                return list(await asyncio.gather(*tasks))

        started = time.monotonic()
        responses = asyncio.run(send())
        return responses, time.monotonic() - started

    observed: list[float] = []
    for round_ in range(2):
        responses, took = burst()
        counts = Counter(r.status_code for r in responses)
        retry_afters = sorted(int(r.headers["retry-after"]) for r in responses
                              if r.status_code == 503)  # fmt: skip
        print(f"\nround {round_}: {dict(counts)} in {took:.1f} s; Retry-After {retry_afters}")
        assert counts == {200: QUEUE, 503: QUEUE}, counts
        for response in responses:
            if response.status_code == 503:
                assert_error(response, 503, code="scaling_up")
        # The cold start still ahead plus the queue's drain through the
        # replica's slots (one service time assumed until one is observed).
        drain = math.ceil((QUEUE + 1) / SLOTS)
        expected = 10.0 if not observed else observed[-1]  # gateway default, then observed
        assert all(1 <= ra <= math.ceil(expected) + drain + 1 for ra in retry_afters), retry_afters
        observed.append(took)
        if round_ == 0:
            # Idle past the retention: back to zero, process gone.
            serve.wait_record(
                endpoint.id, lambda r: r["status"] == "scaledToZero" and not r["replicas"], 30
            )
            wait_until(lambda: set(serve.replica_pids()) == others, 30, 0.2, "replica exited")
