"""The fair release of held requests as tables: virtual token counters per
client (weights, lifting a client that starts waiting, the estimate settled
by the answer's usage), the batch priority class, and the dispatcher
releasing a light client's request ahead of a heavy client's backlog."""

from __future__ import annotations

import asyncio

import pytest

from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.fairness import OWNER, Claim, FairShare, Picker
from inferd.gateway.hold import Dispatcher, plan_release
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.gateway.traffic import EndpointTraffic

NONE: frozenset[str] = frozenset()
R = RoutableReplica("r", "http://127.0.0.1:1")


def a(cost: float = 10, weight: float = 1) -> Claim:
    return Claim("a", weight, False, cost)


def b(cost: float = 10, weight: float = 1) -> Claim:
    return Claim("b", weight, False, cost)


def batch(client: str = "x", cost: float = 10) -> Claim:
    return Claim(client, 1.0, True, cost)


OWNER_CLAIM = Claim(OWNER, 1.0, False, 10)

RELEASE = [
    # (name, claims in queue order, counters, free slots, expected release order)
    ("one client alone: first in, first out", [OWNER_CLAIM] * 4, {}, 3, [0, 1, 2]),
    ("equal counters: fewer waiting goes first, then alternate",
     [a(), a(), a(), b(), b()], {}, 4, [3, 0, 4, 1]),
    ("equal counters and backlogs: arrival breaks the tie",
     [a(), b(), a(), b()], {}, 2, [0, 1]),
    ("a light client goes ahead of a heavy one's backlog",
     [a(), a(), a(), a(), b()], {"a": 40, "b": 40}, 2, [4, 0]),
    ("the smaller counter first", [a(), b()], {"a": 25, "b": 5}, 1, [1]),
    ("everything to the heavy client while nobody else waits",
     [a(), a(), a()], {"a": 900, "b": 0}, 3, [0, 1, 2]),
    ("weight 3 against 1: three releases to one",
     [a(weight=3)] * 6 + [b()] * 6, {}, 8, [0, 6, 1, 2, 3, 7, 4, 5]),
    ("cheap requests of one client against expensive ones of another",
     [a(cost=100)] * 3 + [b(cost=10)] * 6, {}, 6, [0, 3, 4, 5, 6, 7]),
    ("batch waits while an interactive request is held",
     [batch(), batch(), a()], {"x": 0, "a": 500}, 1, [2]),
    ("batch goes once every interactive one was placed",
     [batch(), a(), batch("y")], {}, 3, [1, 0, 2]),
    ("batch clients share by their counters too",
     [batch("x"), batch("x"), batch("y")], {"x": 0, "y": 5}, 2, [0, 2]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("claims", "counters", "slots", "expected"),
    [case[1:] for case in RELEASE],
    ids=[case[0] for case in RELEASE],
)
def test_release_order(
    claims: list[Claim], counters: dict[str, float], slots: int, expected: list[int]
) -> None:
    placements, _ = plan_release(
        [NONE] * len(claims), [R], {}, max_in_flight=slots, turn=0, claims=claims,
        counters=counters,
    )  # fmt: skip
    assert [p.index for p in placements] == expected
    assert counters == dict(counters)  # not modified: the dispatcher charges


def test_an_interactive_request_that_can_go_nowhere_still_holds_batch_back() -> None:
    # The interactive request already tried the only replica (a retry).
    claims = [a(), batch()]
    placements, _ = plan_release(
        [frozenset({"r"}), NONE], [R], {}, max_in_flight=4, turn=0, claims=claims
    )
    assert placements == []


def test_picker_without_placement_moves_on() -> None:
    picker = Picker([a(), b(), b()], {})
    assert picker.next() == 0  # not placed: the counters stay
    assert picker.next() == 1
    picker.placed(1)
    assert picker.next() == 2
    assert picker.next() is None


LIFT = [
    # (name, counters before, floor, waiting, client, counter after)
    ("lifted to the smallest of those waiting", {"a": 50, "c": 80}, 0, ["a", "c"], "b", 50),
    ("its own larger counter is kept", {"a": 50, "b": 70}, 0, ["a"], "b", 70),
    ("nobody waiting: lifted to the floor", {"b": 3}, 20, [], "b", 20),
    ("a new client starts where the others are", {"a": 12}, 0, ["a"], "new", 12),
    ("itself in the waiting set does not count", {"b": 1}, 9, ["b"], "b", 9),
]  # fmt: skip


@pytest.mark.parametrize(
    ("counters", "floor", "waiting", "client", "after"),
    [case[1:] for case in LIFT],
    ids=[case[0] for case in LIFT],
)
def test_a_client_that_starts_waiting_banks_no_credit(
    counters: dict[str, float], floor: float, waiting: list[str], client: str, after: float
) -> None:
    share = FairShare()
    share.counters.update(counters)
    share.floor = floor
    share.started_waiting(client, waiting)
    assert share.counters[client] == after


def test_charges_are_divided_by_weight_and_settled_by_usage() -> None:
    share = FairShare()
    claim = Claim("a", 2.0, False, share.estimate("a", 400))
    assert claim.cost == 100  # 400 bytes of body: 100 prompt tokens, no completion known yet
    share.charge(claim, claim.cost)
    assert share.counters["a"] == 50
    share.settle(claim, prompt_tokens=80, completion_tokens=60)  # 140 served, 100 charged
    assert share.counters["a"] == 70
    assert share.expected_output["a"] == 60
    assert share.estimate("a", 400) == 160
    share.settle(Claim("a", 2.0, False, 160), 100, 10)  # the mean moves a fifth of the way
    assert share.expected_output["a"] == pytest.approx(50)
    assert share.counters["a"] == pytest.approx(70 + (110 - 160) / 2)


def test_the_dispatcher_releases_a_light_clients_request_ahead_of_a_backlog() -> None:
    async def scenario() -> list[str]:
        directory = StaticDirectory()
        directory.add_endpoint(EndpointRoute("ep", "chat", "m"), [R])
        settings = GatewaySettings(max_in_flight_per_replica=1)
        dispatcher = Dispatcher(directory, settings, lambda: 0.0, directory)
        ep = EndpointTraffic("ep", 8)
        order: list[str] = []

        async def request(client: str, is_batch: bool = False) -> None:
            claim = dispatcher.claim(ep, client, 1.0, is_batch, 400)
            replica = await dispatcher.acquire(ep, NONE, 60.0, claim=claim)
            order.append(client)
            await asyncio.sleep(0)
            dispatcher.settle(ep, claim, 100, 20)
            dispatcher.release(ep, replica.replica_id)

        first = await dispatcher.acquire(ep, NONE, 60.0)  # the slot is taken
        tasks = [asyncio.ensure_future(request("heavy")) for _ in range(5)]
        tasks.append(asyncio.ensure_future(request("batch-job", is_batch=True)))
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(request("light")))
        await asyncio.sleep(0)
        assert dispatcher.held("ep") == 7
        dispatcher.release(ep, first.replica_id)
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert dispatcher.held("ep") == 0 and ep.in_flight_total == 0
        return order

    order = asyncio.run(scenario())
    # The light client, lifted to the heavy one's counter, goes before its
    # backlog; the batch job goes last, when no interactive request is held.
    assert order == ["light", "heavy", "heavy", "heavy", "heavy", "heavy", "batch-job"]
