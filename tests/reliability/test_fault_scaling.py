"""Scaling while requests keep coming (issue 5, item 4): 1 -> 2 -> 1 and
1 -> 0 -> 1 under an open-loop load at a fixed rate, and a burst that
arrives at zero replicas, all without one failed request. Fake-engine
replicas (20 ms a token): this is about the autoscaler, the reconciler and
the gateway's hold queue."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from inferd.testing import ServeHandle
from tests.reliability.fault_support import (
    CHAT,
    Endpoint,
    chat_body,
    keep_alive_burst,
    open_loop,
    ready_ids,
    stream_status,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)

# A request takes about 0.3 s (15 tokens at 20 ms); at 20 requests a second
# about 6 are in flight, three times the target of 2 per replica.
TOKENS = 15
HIGH_RATE = 20.0
LOW_RATE = 3.0
PHASE_MAX_S = 30.0
SCALING = {"autoscale_target_concurrency": "2"}


class Watch:
    """Polls an endpoint's record on a thread; keeps the distinct replica
    counts seen (live processes included) and answers `reached(n)`."""

    def __init__(self, serve: ServeHandle, endpoint_id: str) -> None:
        self.serve, self.endpoint_id = serve, endpoint_id
        self.seen: list[tuple[int, int]] = []  # (ready replicas, replica processes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            state = (len(ready_ids(self.serve.record(self.endpoint_id))), self.processes())
            if not self.seen or self.seen[-1] != state:
                self.seen.append(state)
            self._stop.wait(0.1)

    def processes(self) -> int:
        return len(self.serve.replica_pids())

    def reached(self, ready: int, processes: int | None = None) -> Callable[[], bool]:
        """True once the last state seen has `ready` ready replicas (and,
        if given, exactly that many replica processes)."""

        def check() -> bool:
            if not self.seen:
                return False
            last_ready, last_processes = self.seen[-1]
            return last_ready == ready and processes in (None, last_processes)

        return check

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def load(
    ep: Endpoint, rate: float, until: Callable[[], bool], then_s: float = 1.0
) -> list[int | str]:
    """Requests at `rate` a second, every other one streamed, until
    `until()`, then `then_s` more. Returns each one's status."""
    reached_at: list[float] = []

    def done() -> bool:
        if not reached_at and until():
            reached_at.append(time.monotonic())
        return bool(reached_at) and time.monotonic() - reached_at[0] >= then_s

    async with httpx.AsyncClient(headers=ep.headers, timeout=60) as client:

        async def send(n: int) -> int | str:
            if n % 2:
                return (await client.post(ep.url + CHAT, json=chat_body(TOKENS))).status_code
            return await stream_status(client, ep.url + CHAT, chat_body(TOKENS, stream=True))

        return await open_loop(send, rate, done, PHASE_MAX_S)


def ready_path(watch: Watch) -> list[int]:
    """The ready-replica counts seen, repeats folded."""
    path: list[int] = []
    for ready, _ in watch.seen:
        if not path or path[-1] != ready:
            path.append(ready)
    return path


def counts(statuses: list[Any]) -> dict[Any, int]:
    return {s: statuses.count(s) for s in set(statuses)}


@pytest.mark.reliability(item=4)
def test_one_two_one_under_load(serve_factory: Callable[..., ServeHandle]) -> None:
    """1 -> 2 -> 1 replicas under an open-loop load at a fixed rate (20/s,
    then 3/s; half of it streamed): zero failed requests."""
    serve = serve_factory(**SCALING)
    ep = Endpoint.create(serve, name="up-down", modelName="tiny-chat", minReplicas=1, maxReplicas=2)
    serve.wait_record(ep.id, lambda r: len(ready_ids(r)) == 1, timeout=60)
    watch = Watch(serve, ep.id)
    try:
        up = asyncio.run(load(ep, HIGH_RATE, watch.reached(2)))
        assert watch.reached(2)(), f"never scaled to 2: {watch.seen}"
        # Down under load: the drained replica finishes its requests and exits.
        down = asyncio.run(load(ep, LOW_RATE, watch.reached(1, processes=1)))
        assert watch.reached(1, processes=1)(), f"never back to 1: {watch.seen}"
    finally:
        watch.stop()
    assert counts(up) == {200: len(up)} and counts(down) == {200: len(down)}
    assert len(up) >= HIGH_RATE  # at least a second of load at each rate
    assert len(down) >= LOW_RATE
    assert ready_path(watch) == [1, 2, 1], watch.seen


@pytest.mark.reliability(item=4)
def test_one_zero_one_under_load(serve_factory: Callable[..., ServeHandle]) -> None:
    """1 -> 0 -> 1 replicas: load at a fixed rate (5/s, half of it
    streamed), idle past the retention (to zero), load again: zero failed
    requests."""
    serve = serve_factory(**SCALING)
    ep = Endpoint.create(
        serve,
        name="to-zero",
        modelName="tiny-chat",
        minReplicas=0,
        maxReplicas=1,
        scaleToZeroRetentionPeriodSeconds=1,
    )
    watch = Watch(serve, ep.id)
    try:
        first = asyncio.run(load(ep, 5.0, watch.reached(1), then_s=2.0))
        wait_until(watch.reached(0, processes=0), 30, what="scaled to zero, process gone")
        again = asyncio.run(load(ep, 5.0, watch.reached(1), then_s=2.0))
    finally:
        watch.stop()
    assert counts(first) == {200: len(first)} and counts(again) == {200: len(again)}
    assert ready_path(watch) == [0, 1, 0, 1], watch.seen
    assert serve.record(ep.id)["status"] == "running"


@pytest.mark.reliability(item=4)
def test_fifty_requests_at_zero_replicas_all_succeed(
    serve_factory: Callable[..., ServeHandle],
) -> None:
    """50 concurrent requests arriving at an endpoint with zero replicas: held
    while replicas start, then all answered 200."""
    serve = serve_factory(**SCALING)
    ep = Endpoint.create(serve, name="cold", modelName="tiny-chat", minReplicas=0, maxReplicas=2)
    record = serve.record(ep.id)
    assert record["status"] == "scaledToZero" and serve.replica_pids() == []
    statuses = asyncio.run(keep_alive_burst(ep.url + CHAT, chat_body(TOKENS), ep.headers, 50, 50))
    assert statuses == [200] * 50
    assert serve.record(ep.id)["currentReplicas"] >= 1
