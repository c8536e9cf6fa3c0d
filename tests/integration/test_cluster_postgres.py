"""Two instances' cluster parts on a real PostgreSQL: the load each gateway
sees reaches the leader's reconciler view, a request held on a follower
wakes the leader at once, and the leader duties move when the leader goes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from inferd.control.leader import LeaseSettings, PostgresElection
from inferd.control.load import MergedLoad, ReplicaCount
from inferd.control.loadshare import max_age
from inferd.gateway.traffic import EndpointTraffic, TrafficSnapshot
from inferd.server.cluster import (
    CallbackDuty,
    ClusterLoadFeed,
    LeaderDutySet,
    LoadPublisher,
)
from inferd.testing_postgres import PostgresServer

FAST = LeaseSettings(retry_s=0.1, check_s=0.2, check_timeout_s=1.0)
INTERVAL = 0.2


class FakeGateway:
    """Traffic counters a test sets by hand."""

    def __init__(self) -> None:
        self.loads: dict[str, tuple[int, int, float | None]] = {}

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        snap = EndpointTraffic(endpoint_id, 1).snapshot()
        in_flight, held, last = self.loads.get(endpoint_id, (0, 0, None))
        return replace(snap, in_flight=in_flight, held=held, last_request_at=last)

    def snapshots(self) -> list[TrafficSnapshot]:
        return [self.traffic(endpoint_id) for endpoint_id in self.loads]


class NoReplicaReports:
    def reported_in_flight(self, endpoint_id: str) -> list[ReplicaCount]:
        return []


class Instance:
    """The cluster parts of one `inferd serve`, with a fake reconciler."""

    def __init__(self, url: str, name: str) -> None:
        self.name = name
        self.gateway = FakeGateway()
        self.publisher = LoadPublisher(url, name, self.gateway.snapshots, INTERVAL)
        # The leader's view, as the reconciler reads it.
        self.load = MergedLoad(
            self.gateway, NoReplicaReports(), clock=time.monotonic, stale_after_s=max_age(INTERVAL)
        )
        self.woken: list[tuple[str, float]] = []
        self.reconciling: list[int] = []
        feed = ClusterLoadFeed(
            url,
            name,
            self.load.publish,
            lambda e: self.woken.append((e, time.monotonic())),
            INTERVAL,
        )

        async def start(term: int) -> None:
            self.reconciling.append(term)

        async def stop() -> None:
            self.reconciling.append(-1)

        self.election = PostgresElection(
            url, name, LeaderDutySet([feed, CallbackDuty(start, stop)]), FAST
        )

    def start(self) -> None:
        self.publisher.start()
        self.election.start()

    async def stop(self) -> None:
        await self.election.stop()
        await self.publisher.stop()


@pytest.fixture
def db(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_the_leader_sees_every_instances_load(db: str) -> None:
    async def scenario() -> None:
        a, b = Instance(db, "a"), Instance(db, "b")
        a.start()
        await until(lambda: a.election.leading)
        b.start()
        now = time.monotonic()
        a.gateway.loads["e1"] = (1, 0, now - 30.0)
        b.gateway.loads["e1"] = (4, 2, now - 2.0)
        await until(lambda: a.load.load("e1").in_flight == 5)
        seen = a.load.load("e1")
        assert seen.held == 2
        # b's last request, carried through the database's clock as an age
        # and back onto the leader's clock (the same process's clock here).
        assert seen.last_request_at is not None
        assert abs(seen.last_request_at - (now - 2.0)) < 0.3
        # b stops cleanly: its load leaves the sum at once.
        await b.stop()
        await until(lambda: a.load.load("e1").in_flight == 1)
        await a.stop()

    asyncio.run(scenario())


def test_a_request_held_on_a_follower_wakes_the_leader_at_once(db: str) -> None:
    async def scenario() -> None:
        a, b = Instance(db, "a"), Instance(db, "b")
        a.start()
        await until(lambda: a.election.leading)
        b.start()
        await asyncio.sleep(3 * INTERVAL)  # the leader is listening
        b.gateway.loads["cold"] = (0, 1, time.monotonic())
        asked = time.monotonic()
        b.publisher.wake("cold")
        await until(lambda: any(e == "cold" for e, _ in a.woken), timeout=5)
        woke_at = next(t for e, t in a.woken if e == "cold")
        assert woke_at - asked < INTERVAL  # sooner than any publishing round
        # The leader's view already says a request waits.
        assert a.load.load("cold").held == 1
        assert not b.woken  # followers run no reconciler
        await b.stop()
        await a.stop()

    asyncio.run(scenario())


def test_the_leader_duties_move_with_the_leadership(db: str) -> None:
    async def scenario() -> None:
        a, b = Instance(db, "a"), Instance(db, "b")
        a.start()
        await until(lambda: a.election.leading)
        b.start()
        await asyncio.sleep(0.3)
        assert a.reconciling == [1] and b.reconciling == []
        await a.stop()
        assert a.reconciling == [1, -1]
        await until(lambda: b.reconciling == [2], timeout=2)
        # The new leader listens for wake-ups too.
        a2 = Instance(db, "a2")
        a2.start()
        await asyncio.sleep(0.3)
        a2.gateway.loads["e9"] = (0, 1, time.monotonic())
        a2.publisher.wake("e9")
        await until(lambda: any(e == "e9" for e, _ in b.woken), timeout=5)
        await a2.stop()
        await b.stop()

    asyncio.run(scenario())
