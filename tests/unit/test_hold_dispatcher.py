"""The dispatcher on an event loop, with an in-memory directory and an
injected clock: first-in first-out release, no overtaking, no leaks when a
held client leaves, the bounds (429/503) and time-outs. No sleeps: the tests
only let the loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from inferd.errors import NotFound, ServiceUnavailable, TooManyRequests
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.hold import OVER_SHARE, Dispatcher
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.gateway.traffic import EndpointTraffic

T = TypeVar("T")
EP = "ep-1"
A = RoutableReplica("a", "http://127.0.0.1:1")
B = RoutableReplica("b", "http://127.0.0.1:2")
NONE: frozenset[str] = frozenset()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def setup(
    replicas: list[RoutableReplica], **settings: Any
) -> tuple[Dispatcher, EndpointTraffic, StaticDirectory, Clock]:
    directory = StaticDirectory()
    directory.add_endpoint(EndpointRoute(EP, "chat", "m"), replicas)
    clock = Clock()
    options = {"max_in_flight_per_replica": 1, "max_held_requests": 4, **settings}
    dispatcher = Dispatcher(directory, GatewaySettings(**options), clock, directory)
    return dispatcher, EndpointTraffic(EP, 8), directory, clock


def test_held_requests_are_released_first_in_first_out() -> None:
    async def scenario() -> None:
        dispatcher, ep, _, clock = setup([A])
        first = await dispatcher.acquire(ep, NONE, clock() + 60)
        assert first is A and ep.in_flight == {"a": 1}
        second = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        third = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        assert ep.held == 2 and not second.done()
        dispatcher.release(ep, "a")
        await turns()
        assert second.done() and not third.done()
        assert ep.in_flight == {"a": 1} and ep.held == 1
        dispatcher.release(ep, "a")
        await turns()
        assert third.result() is A
        dispatcher.release(ep, "a")
        assert ep.in_flight_total == 0 and not ep.held
        await dispatcher.close()

    run(scenario())


def test_a_new_request_does_not_overtake_held_ones() -> None:
    async def scenario() -> None:
        dispatcher, ep, _, clock = setup([A])
        await dispatcher.acquire(ep, NONE, clock() + 60)
        held = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        dispatcher.release(ep, "a")  # the slot goes to the held request...
        late = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        assert held.done() and not late.done()  # ...not to the newcomer
        dispatcher.release(ep, "a")
        await turns()
        assert late.result() is A
        await dispatcher.close()

    run(scenario())


def test_a_client_that_leaves_while_held_leaves_no_trace() -> None:
    async def scenario() -> None:
        dispatcher, ep, _, clock = setup([A])
        await dispatcher.acquire(ep, NONE, clock() + 60)
        held = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        held.cancel()
        await turns()
        assert not ep.held
        # Cancelled in the same loop turn as it was given a slot: the slot
        # comes back.
        racing = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        dispatcher.release(ep, "a")
        racing.cancel()
        await turns()
        assert racing.cancelled()
        assert ep.in_flight_total == 0 and not ep.held
        await dispatcher.close()

    run(scenario())


def test_held_bytes_are_counted_while_held_and_given_back_however_they_leave() -> None:
    """Bodies count toward the memory bound while held (plus the fixed cost
    each), and every way out (placed, gone, timed out) gives them back."""

    async def scenario() -> None:
        dispatcher, ep, _, clock = setup(
            [A], held_request_overhead_bytes=100, max_held_bytes_per_endpoint=700
        )
        await dispatcher.acquire(ep, NONE, clock() + 60)
        placed = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60, size=200))
        leaving = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60, size=250))
        await turns()
        assert dispatcher.held_bytes(EP) == dispatcher.held_bytes() == ep.held_bytes == 650
        with pytest.raises(TooManyRequests):  # 650 + 100 + 1 > 700
            await dispatcher.acquire(ep, NONE, clock() + 60, size=1)
        leaving.cancel()
        dispatcher.release(ep, "a")
        await turns()
        assert placed.result() is A and dispatcher.held_bytes() == 0
        expiring = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 0.01, size=50))
        await asyncio.sleep(0.05)
        with pytest.raises(ServiceUnavailable):
            await expiring
        assert dispatcher.held_bytes(EP) == 0 and dispatcher.held_bytes() == 0
        await dispatcher.close()

    run(scenario())


def test_an_endpoint_that_fits_nowhere_is_refused_at_once_and_its_held_requests_too() -> None:
    """Held while nobody knew; once the control plane says no node could
    ever take a replica, the held request and every new one get 503 with
    the reason and Retry-After, without waiting out the hold."""

    async def scenario() -> None:
        dispatcher, ep, directory, clock = setup([], hold_poll_seconds=0.01)
        held = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 600))
        await turns()
        assert not held.done()
        why = "no node of the cluster in location 'us-west' has cpu"
        directory.set_route(EndpointRoute(EP, "chat", "m", unplaceable=why))
        with pytest.raises(ServiceUnavailable) as refused:
            await asyncio.wait_for(held, 5)
        assert refused.value.code == "no_capacity" and why in refused.value.message
        assert refused.value.retry_after is not None and refused.value.retry_after >= 1
        with pytest.raises(ServiceUnavailable, match="can be placed"):
            await dispatcher.acquire(ep, NONE, clock() + 600)
        assert dispatcher.held(EP) == 0 and dispatcher.held_bytes() == 0
        await dispatcher.close()

    run(scenario())


def test_queue_full_is_429_when_busy_and_503_when_scaling() -> None:
    async def scenario() -> None:
        dispatcher, ep, directory, clock = setup([A], max_held_requests=1)
        await dispatcher.acquire(ep, NONE, clock() + 60)
        held = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        with pytest.raises(TooManyRequests) as busy:
            await dispatcher.acquire(ep, NONE, clock() + 60)
        assert busy.value.retry_after is not None and busy.value.retry_after >= 1
        held.cancel()
        dispatcher.release(ep, "a")

        directory.set_ready(EP, [])
        waiting = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        assert directory.capacity_requests == [EP]  # asked at once
        with pytest.raises(ServiceUnavailable) as scaling:
            await dispatcher.acquire(ep, NONE, clock() + 60)
        assert scaling.value.code == "scaling_up"
        # The estimate comes from the default cold start (10 s), 4 s of it gone.
        clock.now += 4
        with pytest.raises(ServiceUnavailable) as later:
            await dispatcher.acquire(ep, NONE, clock() + 60)
        # 6 s left, then 2 requests ahead through 1 slot at 1 s each (no
        # service time observed yet).
        assert later.value.retry_after == 8
        waiting.cancel()
        await dispatcher.close()

    run(scenario())


def test_a_full_queue_makes_room_for_another_client_by_refusing_the_floods_newest() -> None:
    """Scaling from zero, a queue of 4 full of one client's requests: another
    client's request is held in place of the flood's newest, which is
    answered 429 at once (not dropped); the flood's next is refused. The
    counts and bytes held follow, and the rest are released in turn."""

    async def scenario() -> None:
        dispatcher, ep, directory, clock = setup(
            [], held_request_overhead_bytes=10, max_in_flight_per_replica=4
        )

        def request(client: str) -> asyncio.Future[RoutableReplica]:
            claim = dispatcher.claim(ep, client, 1.0, False, 90)
            return asyncio.ensure_future(
                dispatcher.acquire(ep, NONE, clock() + 60, size=90, claim=claim)
            )

        flood = [request("flood") for _ in range(4)]
        await turns()
        assert ep.held == 4 and dispatcher.held_bytes(EP) == 400
        light = request("light")
        await turns()
        with pytest.raises(TooManyRequests) as displaced:
            await flood[-1]
        assert displaced.value.code == OVER_SHARE and "made room" in displaced.value.message
        assert displaced.value.retry_after is not None and displaced.value.retry_after >= 1
        assert ep.held == 4 and dispatcher.held_bytes(EP) == 400 and not light.done()
        with pytest.raises(TooManyRequests) as refused:  # 3 against 1: still over its share
            claim = dispatcher.claim(ep, "flood", 1.0, False, 90)
            await dispatcher.acquire(ep, NONE, clock() + 60, size=90, claim=claim)
        assert refused.value.code == OVER_SHARE and "holds at least" in refused.value.message
        assert ep.refused[OVER_SHARE] == 2
        directory.set_ready(EP, [A])
        assert {r.replica_id for r in await asyncio.gather(light, *flood[:3])} == {"a"}
        assert ep.held == 0 and dispatcher.held_bytes() == 0
        await dispatcher.close()

    run(scenario())


def test_scale_from_zero_releases_when_ready_and_measures_the_cold_start() -> None:
    async def scenario() -> None:
        dispatcher, ep, directory, clock = setup([], max_in_flight_per_replica=4)
        held = [asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60)) for _ in range(3)]
        await turns()
        assert ep.held == 3 and ep.snapshot().held == 3 and dispatcher.view(EP).held == 3
        clock.now += 12.5
        directory.set_ready(EP, [A, B])
        results = await asyncio.gather(*held)
        assert sorted(r.replica_id for r in results) == ["a", "a", "b"]
        view = dispatcher.view(EP)
        assert view.cold_start_s == 12.5 and view.scale_requested_at is None
        await dispatcher.close()

    run(scenario())


def test_hold_past_the_deadline_is_503_hold_timeout() -> None:
    async def scenario() -> None:
        dispatcher, ep, _, clock = setup([])
        deadline = clock() + 30
        clock.now += 31  # already past it when the request is held
        with pytest.raises(ServiceUnavailable) as timed_out:
            await dispatcher.acquire(ep, NONE, deadline)
        assert timed_out.value.code == "hold_timeout"
        assert not ep.held
        await dispatcher.close()

    run(scenario())


def test_a_request_that_tried_every_replica_waits_for_a_new_one() -> None:
    async def scenario() -> None:
        dispatcher, ep, directory, clock = setup([A])
        tried = asyncio.ensure_future(dispatcher.acquire(ep, frozenset({"a"}), clock() + 60))
        await turns()
        assert not tried.done() and ep.held == 1
        directory.set_ready(EP, [A, B])
        assert await tried is B  # found by the watcher's re-read of the directory
        await dispatcher.close()

    run(scenario())


def test_close_answers_held_requests() -> None:
    async def scenario() -> None:
        dispatcher, ep, _, clock = setup([])
        held = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        await dispatcher.close()
        with pytest.raises(ServiceUnavailable):
            await held
        assert not dispatcher.view(EP).watching

    run(scenario())


@pytest.mark.parametrize("deleted", [True, False])
def test_held_requests_of_a_deleted_endpoint_are_answered(deleted: bool) -> None:
    async def scenario() -> None:
        dispatcher, ep, directory, clock = setup([], hold_poll_seconds=0.01)
        held = asyncio.ensure_future(dispatcher.acquire(ep, NONE, clock() + 60))
        await turns()
        if deleted:
            directory.remove_endpoint(EP)
        else:
            directory.set_route(EndpointRoute(EP, "chat", "m", deleting=True))
        with pytest.raises(NotFound if deleted else ServiceUnavailable) as answered:
            await held
        assert answered.value.code == ("endpoint_not_found" if deleted else "endpoint_deleting")
        assert not ep.held
        await dispatcher.close()

    run(scenario())
