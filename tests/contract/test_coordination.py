"""The `Coordination` contract, run against every adapter: `Solo` (a
cluster of one) and `Postgres` (instances on a real PostgreSQL).

Election, fencing, load sharing and wake-ups hold for both; failover needs
a second instance, which only a shared database has (`CLUSTERS`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest

from inferd.control.cluster.lease import LeaseSettings
from inferd.control.cluster.loadshare import LocalLoad
from inferd.control.cluster.ports import Coordination, Deposed
from inferd.control.cluster.postgres import Postgres
from inferd.control.cluster.solo import Solo
from inferd.control.ports import LoadSample
from inferd.gateway.traffic import EndpointTraffic, TrafficSnapshot
from inferd.testing.postgres import PostgresServer
from tests.timings import HANG_S, record_timing

FAST = LeaseSettings(retry_s=0.1, check_s=0.2, check_timeout_s=1.0)
INTERVAL = 0.2
KINDS = ["solo", "postgres"]
CLUSTERS = ["postgres"]  # several instances share the state


class Duties:
    def __init__(self) -> None:
        self.events: list[tuple[str, int | None]] = []

    async def start(self, term: int) -> None:
        self.events.append(("start", term))

    async def stop(self) -> None:
        self.events.append(("stop", None))


@dataclass
class Member:
    """One instance: its coordination, its duties, what reached it."""

    coordination: Coordination
    duties: Duties
    traffic: dict[str, TrafficSnapshot] = field(default_factory=dict)
    woken: list[tuple[str, float]] = field(default_factory=list)
    remote: list[LoadSample] = field(default_factory=list)

    def set_load(self, endpoint_id: str, in_flight: int, held: int, last: float | None) -> None:
        snap = EndpointTraffic(endpoint_id, 1).snapshot()
        self.traffic[endpoint_id] = replace(
            snap, in_flight=in_flight, held=held, last_request_at=last
        )


@dataclass
class Cluster:
    kind: str
    url: str | None

    def member(self, name: str, interval_s: float = INTERVAL) -> Member:
        duties = Duties()
        member = Member(coordination=None, duties=duties)  # type: ignore[arg-type]

        def woken(endpoint_id: str) -> None:
            member.woken.append((endpoint_id, time.monotonic()))

        if self.kind == "solo":
            member.coordination = Solo(name, on_wake=woken)
        else:
            assert self.url is not None
            member.coordination = Postgres(
                self.url,
                name,
                traffic=lambda: list(member.traffic.values()),
                on_remote_load=member.remote.append,
                on_wake=woken,
                interval_s=interval_s,
                lease=FAST,
            )
        return member


@pytest.fixture(params=KINDS)
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    url = None
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.create_migrated_database()
    yield Cluster(request.param, url)


@pytest.fixture(params=CLUSTERS)
def shared(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    server: PostgresServer = request.getfixturevalue("postgres_server")
    yield Cluster(request.param, server.create_migrated_database())


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_an_instance_alone_leads_and_runs_its_duties_under_its_term(cluster: Cluster) -> None:
    async def scenario() -> None:
        a = cluster.member("a")
        assert a.coordination.term is None
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        term = a.coordination.term
        assert a.duties.events == [("start", term)]
        leader = a.coordination.leader()
        assert (leader.holder, leader.term) == ("a", term)
        await a.coordination.stop()
        assert a.coordination.term is None
        assert a.duties.events == [("start", term), ("stop", None)]
        await a.coordination.stop()  # idempotent: the duties stop once
        assert a.duties.events == [("start", term), ("stop", None)]

    asyncio.run(scenario())


def test_only_the_current_term_is_confirmed(cluster: Cluster) -> None:
    """The fence: acts under any other term are refused."""

    async def scenario() -> None:
        a = cluster.member("a")
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        term = a.coordination.term
        assert term is not None
        await a.coordination.confirm(term)
        for other in (term - 1, term + 1):
            with pytest.raises(Deposed) as refused:
                await a.coordination.confirm(other)
            assert refused.value.writer_term == other
        await a.coordination.stop()

    asyncio.run(scenario())


def test_the_leader_never_counts_its_own_load_as_remote(cluster: Cluster) -> None:
    async def scenario() -> None:
        a = cluster.member("a")
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        now = time.monotonic()
        await a.coordination.publish_load([LocalLoad("e1", 3, 1, now)])
        assert [s for s in await a.coordination.remote_load() if s.source == "a"] == []
        await a.coordination.stop()

    asyncio.run(scenario())


def test_a_wake_reaches_the_leaders_reconciler_at_once(cluster: Cluster) -> None:
    async def scenario() -> None:
        a = cluster.member("a")
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        await asyncio.sleep(3 * INTERVAL)  # a new leader is listening by now
        asked = time.monotonic()
        a.coordination.wake("cold")
        # Only a wake names the endpoint: the periodic pass does not.
        await until(lambda: any(e == "cold" for e, _ in a.woken), timeout=HANG_S)
        woke_at = next(t for e, t in a.woken if e == "cold")
        record_timing("coordination: wake reached the leader", woke_at - asked)
        await a.coordination.stop()

    asyncio.run(scenario())


# -- several instances ---------------------------------------------------------------


def test_one_leader_and_the_lead_moves_with_a_higher_term(shared: Cluster) -> None:
    async def scenario() -> None:
        a, b = shared.member("a"), shared.member("b")
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        await b.coordination.start(b.duties)
        await asyncio.sleep(0.5)  # several tries by b
        old = a.coordination.term
        assert old is not None and b.coordination.term is None and b.duties.events == []
        assert b.coordination.leader().holder == "a"
        await a.coordination.stop()
        took = await until(lambda: b.coordination.term is not None, timeout=HANG_S)
        record_timing("coordination: the lead moved after a stop", took)
        new = b.coordination.term
        assert new is not None and new > old
        assert b.duties.events == [("start", new)]
        # The deposed leader's term is fenced off everywhere.
        with pytest.raises(Deposed):
            await b.coordination.confirm(old)
        await b.coordination.stop()

    asyncio.run(scenario())


def test_the_leader_sees_every_other_instances_load(shared: Cluster) -> None:
    async def scenario() -> None:
        a, b = shared.member("a"), shared.member("b")
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        await b.coordination.start(b.duties)
        now = time.monotonic()
        a.set_load("e1", 1, 0, now - 30.0)
        b.set_load("e1", 4, 2, now - 2.0)

        def seen() -> list[LoadSample]:
            return [s for s in a.remote if s.endpoint_id == "e1" and s.in_flight == 4]

        await until(lambda: bool(seen()))
        sample = seen()[-1]
        assert (sample.source, sample.held) == ("b", 2)
        # b's last request, carried through the database's clock as an age
        # and back onto the leader's clock (the same process's clock here).
        assert sample.last_request_at is not None
        assert abs(sample.last_request_at - (now - 2.0)) < 0.3
        # b leaves cleanly: its load goes with it at once.
        await b.coordination.stop()
        assert [s for s in await a.coordination.remote_load() if s.source == "b"] == []
        await a.coordination.stop()

    asyncio.run(scenario())


def test_a_request_held_on_a_follower_wakes_the_leader_at_once(shared: Cluster) -> None:
    async def scenario() -> None:
        # No publishing round within the test: only the wake itself can
        # carry the held request to the leader.
        quiet = 3600.0
        a, b = shared.member("a", quiet), shared.member("b", quiet)
        await a.coordination.start(a.duties)
        await until(lambda: a.coordination.term is not None)
        await b.coordination.start(b.duties)
        await asyncio.sleep(3 * INTERVAL)  # the leader is listening
        b.set_load("cold", 0, 1, time.monotonic())
        asked = time.monotonic()
        b.coordination.wake("cold")
        await until(lambda: any(e == "cold" for e, _ in a.woken), timeout=HANG_S)
        woke_at = next(t for e, t in a.woken if e == "cold")
        record_timing("coordination: a follower's wake reached the leader", woke_at - asked)
        # The leader's view already says a request waits.
        assert any(s.endpoint_id == "cold" and s.held == 1 for s in a.remote)
        assert not b.woken  # a follower's reconciler is not woken
        await b.coordination.stop()
        await a.coordination.stop()

    asyncio.run(scenario())
