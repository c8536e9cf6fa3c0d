"""A full hold queue shared fairly between clients, as tables: who gives way
to a newcomer (the newest requests of the client most over its weighted
share), and when the newcomer is refused instead."""

from __future__ import annotations

import pytest

from inferd.gateway.hold_share import Bounds, ClientHold, Room, make_room, use


def hold(*costs: int, weight: float = 1.0) -> ClientHold:
    return ClientHold(weight, list(costs), sum(costs))


def count_bound(free: int, bound: int = 4) -> Bounds:
    return Bounds(max_count=bound, free_count=free)


def byte_bound(free: int, bound: int = 1000, count: int = 100) -> Bounds:
    return Bounds(max_count=count, free_count=count, max_bytes=bound, free_bytes=free)


CASES = [
    # (name, clients, arriving, weight, cost, bounds, expected room)
    ("room for it: nobody gives way", {"a": hold(1, 1)}, "b", 1.0, 1, count_bound(2), Room({})),
    ("a client alone fills the queue: its next is refused, as before",
     {"a": hold(1, 1, 1, 1)}, "a", 1.0, 1, count_bound(0), Room(None)),
    ("a flood gives way to a newcomer", {"a": hold(1, 1, 1, 1)}, "b", 1.0, 1, count_bound(0),
     Room({"a": 1})),
    ("still over its share: gives way again", {"a": hold(1, 1, 1), "b": hold(1)}, "b", 1.0, 1,
     count_bound(0), Room({"a": 1})),
    ("even shares: the newcomer's client is refused, nobody displaced",
     {"a": hold(1, 1), "b": hold(1, 1)}, "b", 1.0, 1, count_bound(0), Room(None, True)),
    ("the flooder's own next request is refused, not another's",
     {"a": hold(1, 1, 1), "b": hold(1)}, "a", 1.0, 1, count_bound(0), Room(None, True)),
    ("a weight of 3 holds 3 of 4 within its share",
     {"a": hold(1, 1, 1, weight=3)}, "b", 1.0, 1, count_bound(0, 3), Room(None, True)),
    ("a heavy weight on the newcomer's side displaces a light client",
     {"a": hold(1, 1, 1), "b": hold(1, weight=3)}, "b", 3.0, 1, count_bound(0), Room({"a": 1})),
    ("the heaviest of several gives way",
     {"a": hold(1), "c": hold(1, 1, 1)}, "b", 1.0, 1, count_bound(0), Room({"c": 1})),
    ("bytes: the newest request goes first, one is enough",
     {"a": hold(300, 300, 300)}, "b", 1.0, 350, byte_bound(100), Room({"a": 1})),
    ("bytes: as many as the newcomer needs while over its share",
     {"a": hold(100, 200, 300, 300)}, "b", 1.0, 500, byte_bound(100), Room({"a": 2})),
    ("bytes: nothing displaced for a newcomer that would then be over its own share",
     {"a": hold(100, 200, 300, 300)}, "b", 1.0, 700, byte_bound(100), Room(None, True)),
    ("bytes: larger than the whole bound, refused without displacing anyone",
     {"a": hold(500)}, "b", 1.0, 1001, byte_bound(500), Room(None)),
    ("the dominant share counts: one large body outweighs two small ones",
     {"a": hold(900), "b": hold(10, 10)}, "c", 1.0, 150, byte_bound(80, count=4), Room({"a": 1})),
    ("no queue at all: refused", {}, "a", 1.0, 1, count_bound(0, 0), Room(None)),
    ("the instance's bound is the tighter: its free bytes decide what is needed",
     {"a": hold(200, 200)}, "b", 1.0, 300, byte_bound(0), Room(None, True)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("clients", "arriving", "weight", "cost", "bounds", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_make_room(
    clients: dict[str, ClientHold],
    arriving: str,
    weight: float,
    cost: int,
    bounds: Bounds,
    expected: Room,
) -> None:
    assert make_room(clients, arriving, weight, cost, bounds) == expected


def test_two_clients_cannot_displace_each_other_back_and_forth() -> None:
    """Two flooding clients of equal weight, arriving in turn at a full
    queue of 10: they settle at 5 and 5, and from then on each newcomer is
    refused instead of displacing the other's."""
    held = {"a": [1] * 10, "b": []}
    bounds = count_bound(0, 10)
    displaced = 0
    for turn in range(40):
        client = "ab"[turn % 2]
        clients = {name: hold(*costs) for name, costs in held.items() if costs}
        room = make_room(clients, client, 1.0, 1, bounds)
        if room.evict is None:
            # Alone, a client is refused as the full queue always refused it.
            assert room.over_share == all(held.values())
            continue
        for name, n in room.evict.items():
            del held[name][-n:]
            displaced += n
        held[client].append(1)
    assert (len(held["a"]), len(held["b"])) == (5, 5)
    assert displaced == 5


def test_use_is_the_dominant_share_over_the_weight() -> None:
    bounds = Bounds(max_count=10, free_count=0, max_bytes=1000, free_bytes=0)
    assert use(2, 500, 1.0, bounds) == 0.5
    assert use(5, 100, 2.0, bounds) == 0.25
    assert use(1, 0, 1.0, Bounds(max_count=0, free_count=0)) == float("inf")
