"""Placing live prompt prefixes by what each replica's KV cache holds: the
balance against rendezvous hashing alone, capacities, prefixes that stay
where they were placed, moves when a replica leaves or is left crowded,
expiry, and two gateways agreeing where they can."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from inferd.gateway.directory import RoutableReplica
from inferd.gateway.placement import (
    Claim,
    Placements,
    PlacementSettings,
    PrefixPlacement,
    choose_home,
    shares,
    size_class,
)
from inferd.gateway.placement_claims import merge
from inferd.gateway.routing import rendezvous_score
from inferd.replica.placed_prefixes import PlacedPrefixes


def r(rid: str, kv_tokens: int | None = None) -> RoutableReplica:
    return RoutableReplica(rid, f"http://127.0.0.1/{rid}", kv_cache_tokens=kv_tokens)


def arrive(placement: PrefixPlacement, keys: list[int], blocks: int, replicas, now=0.0) -> None:  # type: ignore[no-untyped-def]
    for key in keys:
        placement.place(key, blocks, replicas, now)


def test_twelve_prompts_split_evenly_where_hashing_does_not() -> None:
    """The issue's workload: 12 equal prompts, 2 replicas each holding about
    8. Rendezvous hashing alone puts 8 or more on one replica in about 39%
    of draws; placed as they arrive, never more than 6."""
    rng = random.Random(7)
    hashed_uneven = 0
    for _ in range(300):
        replicas = [r(f"replica-{rng.getrandbits(48):x}", 12_288) for _ in range(2)]
        keys = [rng.getrandbits(32) for _ in range(12)]
        placement = PrefixPlacement(PlacementSettings())
        arrive(placement, keys, 17, replicas)
        assert sorted(placement.counts().values()) == [6, 6]
        ids = [x.replica_id for x in replicas]
        by_hash = Counter(max(ids, key=lambda i: rendezvous_score(k, i)) for k in keys)
        hashed_uneven += max(by_hash.values()) >= 8
    assert 60 < hashed_uneven < 180


@pytest.mark.parametrize(
    ("capacities", "parts"),
    [
        ((1000, 1000), (0.5, 0.5)),
        ((2000, 1000), (2 / 3, 1 / 3)),
        ((1000, None), (0.5, 0.5)),  # one not reported: equal parts
        ((3000, 1000, 1000, 1000), (0.5, 1 / 6, 1 / 6, 1 / 6)),
    ],
)
def test_each_replica_gets_its_part_of_the_fleets_cache(
    capacities: tuple[int | None, ...], parts: tuple[float, ...]
) -> None:
    rng = random.Random(3)
    replicas = [r(f"r{i}", c) for i, c in enumerate(capacities)]
    placement = PrefixPlacement(PlacementSettings())
    for _ in range(240):
        placement.place(rng.getrandbits(32), rng.randint(4, 16), replicas, 0.0)
    got = placement.working_sets()
    total = sum(got.values())
    for replica, part in zip(replicas, parts, strict=True):
        assert got[replica.replica_id] <= 1.15 * part * total + 16  # over by one prefix at most
        assert got[replica.replica_id] >= 0.8 * part * total


def test_shares_follow_the_reported_caches() -> None:
    assert shares([("a", 3000), ("b", 1000)], 100, 1.0) == {"a": 75.0, "b": 25.0}
    assert shares([("a", 3000), ("b", None)], 100, 1.2) == {"a": 60.0, "b": 60.0}


@pytest.mark.parametrize(
    ("assigned", "bounds", "expected"),
    [
        # Room on the first in rendezvous order ("b" for key 1): there.
        ({}, {"a": 10.0, "b": 10.0}, "b"),
        # No room on "b": the next in order.
        ({"b": 8}, {"a": 10.0, "b": 10.0}, "a"),
        # No room anywhere: the most room left.
        ({"a": 9, "b": 12}, {"a": 10.0, "b": 10.0}, "a"),
        # Equal room left, none enough: the first in order.
        ({"a": 9, "b": 9}, {"a": 10.0, "b": 10.0}, "b"),
        ({}, {}, None),
    ],
)
def test_a_new_prefix_goes_where_there_is_room(
    assigned: dict[str, int], bounds: dict[str, float], expected: str | None
) -> None:
    assert rendezvous_score(1, "b") > rendezvous_score(1, "a")
    assert choose_home(1, 4, assigned, bounds) == expected


def _two_gateways(
    rng: random.Random, keys: list[int], poll_every: int | None
) -> tuple[PrefixPlacement, PrefixPlacement]:
    """Requests alternate between two gateways (a load balancer), each
    conversation's turns in waves, every request of a prefix noted by the
    replica it was placed on; every `poll_every` requests both gateways read
    the replicas' lists (None: never)."""
    replicas = [r("replica-7f3a", 12_288), r("replica-01c2", 12_288)]
    lists = {x.replica_id: PlacedPrefixes(clock=lambda: now) for x in replicas}
    gateways = PrefixPlacement(PlacementSettings()), PrefixPlacement(PlacementSettings())
    now, sent = 0.0, 0
    for turn in range(8):
        order = keys[:]
        rng.shuffle(order)
        for key in order:
            now += 0.25
            rid = gateways[sent % 2].place(key, 20 + turn, replicas, now)
            assert rid is not None
            lists[rid].note(key)
            sent += 1
            if poll_every and sent % poll_every == 0:
                claims = merge({rid: listed.listing() for rid, listed in lists.items()})
                for gateway in gateways:
                    gateway.adopt(claims, now)
    return gateways


def test_two_gateways_agree_through_the_replicas_lists() -> None:
    """Alone, two gateways seeing conversations in different orders place
    several of 12 prefixes apart (each then cached twice); reading the
    replicas' lists of placed prefixes every 4 requests (a second, at 4
    requests a second), they end up placing every prefix alike, evenly."""
    apart_alone = 0
    for trial in range(40):
        draw = random.Random(trial)
        keys = [draw.getrandbits(32) for _ in range(12)]
        one, two = _two_gateways(random.Random(trial), keys, None)
        apart_alone += sum(one.placements()[k] != two.placements()[k] for k in keys)
        one, two = _two_gateways(random.Random(trial), keys, 4)
        assert one.placements() == two.placements()
        assert max(one.counts().values()) <= 7
    assert apart_alone >= 80  # about 4 prefixes of 12 in each trial


def test_a_new_prefix_follows_where_another_gateway_placed_it() -> None:
    replicas = [r("a"), r("b")]
    placement = PrefixPlacement(PlacementSettings())
    placement.place(1, 8, replicas, 0.0)
    key = next(k for k in range(2, 100) if choose_home(k, 8, {}, {"a": 99.0, "b": 99.0}) == "a")
    placement.adopt({key: Claim(first="a", current="b")}, 1.0)
    assert placement.place(key, 8, replicas, 2.0) == "b"  # where it was placed last
    assert placement.moves == 0


def test_a_placement_settled_here_does_not_follow_old_lists() -> None:
    """A prefix placed here long enough ago stays, whatever the lists say
    (they may still name a replica it was moved off)."""
    replicas = [r("a"), r("b")]
    placement = PrefixPlacement(PlacementSettings(settle_s=10.0))
    home = placement.place(7, 8, replicas, 0.0)
    other = "b" if home == "a" else "a"
    assert placement.adopt({7: Claim(first=other, current=other)}, 11.0) == 0
    assert placement.placements()[7] == home
    fresh = placement.place(8, 8, replicas, 12.0)
    elsewhere = "b" if fresh == "a" else "a"
    assert placement.adopt({8: Claim(first=elsewhere, current=fresh)}, 13.0) == 1
    assert placement.placements()[8] == elsewhere


@pytest.mark.parametrize(
    ("listings", "expected"),
    [
        ({"a": [(1, 5.0, 9.0)], "b": [(1, 6.0, 8.0)]}, {1: Claim("a", "a")}),
        ({"a": [(1, 5.0, 7.0)], "b": [(1, 6.0, 8.0)]}, {1: Claim("a", "b")}),
        # Ties: the smaller id, in every gateway.
        ({"b": [(1, 5.0, 8.0)], "a": [(1, 5.0, 8.0)]}, {1: Claim("a", "a")}),
        ({"a": [(1, 5.0, 5.0)], "b": [(2, 1.0, 1.0)]}, {1: Claim("a", "a"), 2: Claim("b", "b")}),
        ({}, {}),
    ],
)
def test_the_lists_merge_into_first_and_last_placements(
    listings: dict[str, list[tuple[int, float, float]]], expected: dict[int, Claim]
) -> None:
    assert merge(listings) == expected


@pytest.mark.parametrize(("blocks", "size"), [(0, 1), (1, 1), (2, 2), (3, 4), (17, 32), (32, 32)])
def test_sizes_are_counted_in_powers_of_two(blocks: int, size: int) -> None:
    assert size_class(blocks) == size


def test_a_prefix_is_kept_where_it_was_placed() -> None:
    placement = PrefixPlacement(PlacementSettings())
    replicas = [r("a"), r("b"), r("c")]
    rng = random.Random(2)
    keys = [rng.getrandbits(32) for _ in range(30)]
    arrive(placement, keys, 10, replicas)
    first = placement.placements()
    for t in range(1, 20):  # the same live set, requests in any order: nothing moves
        for k in rng.sample(keys, len(keys)):
            assert placement.place(k, 10 + t, replicas, float(t)) == first[k]
    assert placement.moves == 0


def test_new_prefixes_never_move_placed_ones_and_keep_the_caches_even() -> None:
    """Prefixes arrive one by one: each goes where there is room, none
    already placed moves (its cache stays useful), and the working sets
    stay within their shares."""
    placement = PrefixPlacement(PlacementSettings())
    replicas = [r("a", 1000), r("b", 1000), r("c", 1000), r("d", 1000)]
    rng = random.Random(4)
    placed: dict[int, str] = {}
    for n in range(100):
        key = rng.getrandbits(32)
        placed[key] = placement.place(key, rng.choice((4, 8, 16)), replicas, float(n))  # type: ignore[assignment]
        assert placement.placements() == placed
        sets = placement.working_sets()
        if n >= 10:
            assert max(sets.values()) <= 1.15 * sum(sets.values()) / 4 + 16
    assert placement.moves == 0


def test_a_dead_replicas_prefixes_move_and_the_others_stay() -> None:
    placement = PrefixPlacement(PlacementSettings())
    three = [r("a"), r("b"), r("c")]
    rng = random.Random(9)
    keys = [rng.getrandbits(32) for _ in range(60)]
    arrive(placement, keys, 5, three)
    before = placement.placements()
    lost = [k for k in keys if before[k] == "c"]
    during = {k: placement.place(k, 5, three[:2], 1.0) for k in keys}
    assert "c" not in during.values()
    assert all(during[k] == before[k] for k in keys if before[k] != "c")
    assert placement.moves == len(lost)
    # Back: the survivors hold about 1.5x their share of three: any that
    # shed prefixes shed them to "c", the rest stay; new prefixes go to "c".
    again = {k: placement.place(k, 5, three, 2.0) for k in keys}
    assert all(again[k] in (during[k], "c") for k in keys)
    sets = placement.working_sets()
    assert max(sets.values()) <= 1.5 * sum(sets.values()) / 3
    new = [rng.getrandbits(32) for _ in range(10)]
    assert [placement.place(k, 5, three, 3.0) for k in new].count("c") >= 6


def test_a_replica_left_crowded_sheds_its_least_recently_seen_prefixes() -> None:
    """One replica serves alone, then a second joins: the first holds twice
    its share, so its least recently seen prefixes move until it is within
    its share; the most recently seen stay with their cache."""
    placement = PrefixPlacement(PlacementSettings())
    keys = list(range(20))
    for n, key in enumerate(keys):
        placement.place(key, 8, [r("a")], float(n))
    assert placement.counts() == {"a": 20}
    placement.place(keys[-1], 8, [r("a"), r("b")], 30.0)
    counts = placement.counts()
    assert counts["b"] >= 8 and counts["a"] <= 12  # within 1.15x of 10
    placed = placement.placements()
    assert all(placed[k] == "a" for k in keys[-8:])  # the most recently seen stayed
    assert placement.moves == counts["b"]


def test_prefixes_not_seen_for_the_horizon_leave() -> None:
    placement = PrefixPlacement(PlacementSettings(horizon_s=60.0))
    replicas = [r("a"), r("b")]
    placement.place(1, 10, replicas, 0.0)
    placement.place(2, 10, replicas, 30.0)
    assert len(placement) == 2
    placement.place(3, 10, replicas, 70.0)
    assert len(placement) == 2  # 1 left: unseen for 70 s
    assert set(placement.placements()) == {2, 3}
    assert sum(placement.working_sets().values()) == 32  # two of 10 blocks: 16 each


def test_live_prefixes_are_bounded() -> None:
    placement = PrefixPlacement(PlacementSettings(max_prefixes=100))
    replicas = [r("a"), r("b")]
    for key in range(1000):
        placement.place(key, 1, replicas, 0.0)
    assert len(placement) == 100
    assert sum(placement.working_sets().values()) == 100


def test_no_replica_no_placement() -> None:
    placements = Placements()
    assert placements.place("ep", 1, 10, [], 0.0) is None
    assert placements.endpoint("ep") is None
    assert placements.place("ep", 1, 10, [r("a")], 0.0) == "a"
    assert set(placements.endpoints()) == {"ep"}
    placements.forget("ep")
    assert placements.endpoint("ep") is None
