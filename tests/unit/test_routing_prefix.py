"""Prefix routing as a table: affinity, the load bound, rendezvous order,
adapters; and the faults and adversarial inputs it must survive (a dead
replica, one hot prefix, colliding prefixes)."""

from __future__ import annotations

import itertools
import json

import pytest

from inferd.gateway.affinity import request_prefix
from inferd.gateway.directory import RoutableReplica
from inferd.gateway.routing import (
    DEFAULT_MIN_LOAD_BOUND,
    Affinity,
    Outcome,
    Policy,
    Reason,
    choose_replica,
    load_bound,
    rendezvous_score,
)


def r(rid: str, waiting: int = 0, adapters: tuple[str, ...] = ()) -> RoutableReplica:
    return RoutableReplica(rid, f"http://127.0.0.1/{rid}", waiting, frozenset(adapters))


def key_ranking(*order: str) -> int:
    """A home key whose rendezvous order over these replicas is `order`."""
    for key in itertools.count(1):
        scores = [rendezvous_score(key, rid) for rid in order]
        if scores == sorted(scores, reverse=True):
            return key
    raise AssertionError("unreachable")


ABC = key_ranking("a", "b", "c")  # home a, then b, then c
CBA = key_ranking("c", "b", "a")
ABC3 = [r("a"), r("b"), r("c")]

CASES = [
    # (name, replicas, in_flight, exclude, affinity, chosen, reason)
    ("home when idle", ABC3, {}, (), Affinity(ABC), "a", Reason.HOME),
    ("other key other home", ABC3, {}, (), Affinity(CBA), "c", Reason.HOME),
    # bound with loads 2,0,0 -> ceil(1.25 * 3 / 3) = 2: a is at it
    ("home over the bound spills in order", ABC3, {"a": 2}, (), Affinity(ABC), "b",
     Reason.SPILLED),
    ("spill skips the next one too", ABC3, {"a": 3, "b": 3}, (), Affinity(ABC), "c",
     Reason.SPILLED),
    ("reported queue counts as load", [r("a", 2), r("b"), r("c")], {}, (), Affinity(ABC), "b",
     Reason.SPILLED),
    ("home under the bound despite load", ABC3, {"a": 1, "b": 1, "c": 1}, (), Affinity(ABC),
     "a", Reason.HOME),
    ("cached replica first", ABC3, {}, (), Affinity(ABC, cached_on="c"), "c", Reason.CACHED),
    ("cached replica over the bound", ABC3, {"c": 2}, (), Affinity(ABC, cached_on="c"), "a",
     Reason.HOME),
    ("cached replica gone: home", ABC3, {}, (), Affinity(ABC, cached_on="dead"), "a",
     Reason.HOME),
    ("dead home: next in order", [r("b"), r("c")], {}, (), Affinity(ABC), "b", Reason.HOME),
    ("tried home: next in order", ABC3, {}, ("a",), Affinity(ABC), "b", Reason.HOME),
    ("no prefix: least loaded", ABC3, {"a": 1, "c": 1}, (), Affinity(None), "b",
     Reason.LEAST_LOADED),
    ("home at the per-replica cap", ABC3, {"a": 4}, (), Affinity(ABC), "b", Reason.HOME),
    ("adapter holder preferred", [r("a"), r("b"), r("c", adapters=("sql",))], {}, (),
     Affinity(ABC, adapter="sql"), "c", Reason.HOME),
    ("adapter: holders in rendezvous order",
     [r("a"), r("b", adapters=("sql",)), r("c", adapters=("sql",))], {}, (),
     Affinity(ABC, adapter="sql"), "b", Reason.HOME),
    ("adapter holder over the bound: anyone", [r("a"), r("b"), r("c", adapters=("sql",))],
     {"c": 3}, (), Affinity(ABC, adapter="sql"), "a", Reason.HOME),
    ("adapter nobody holds: anyone", ABC3, {}, (), Affinity(ABC, adapter="sql"), "a",
     Reason.HOME),
    # A placement (by what each cache holds) comes before everything else.
    ("placed replica first", ABC3, {}, (), Affinity(ABC, placed_on="c"), "c", Reason.HOME),
    ("placed before cached", ABC3, {}, (), Affinity(ABC, cached_on="b", placed_on="c"), "c",
     Reason.HOME),
    ("placed over the bound: cached", ABC3, {"c": 2}, (),
     Affinity(ABC, cached_on="b", placed_on="c"), "b", Reason.CACHED),
    ("placed over the bound: spilled in order", ABC3, {"c": 2}, (),
     Affinity(ABC, placed_on="c"), "a", Reason.SPILLED),
    ("placed replica gone: rendezvous home", ABC3, {}, (), Affinity(ABC, placed_on="dead"),
     "a", Reason.HOME),
    ("placed replica tried: rendezvous home", ABC3, {}, ("c",), Affinity(ABC, placed_on="c"),
     "a", Reason.HOME),
    ("placement ignored without a prefix", ABC3, {"a": 1, "c": 1}, (),
     Affinity(None, placed_on="c"), "b", Reason.LEAST_LOADED),
    ("adapter holder beats the placement", [r("a"), r("b"), r("c", adapters=("sql",))], {}, (),
     Affinity(ABC, adapter="sql", placed_on="a"), "c", Reason.HOME),
    ("adapter without prefix: least-loaded holder",
     [r("a"), r("b", adapters=("sql",)), r("c", adapters=("sql",))], {"b": 1}, (),
     Affinity(None, adapter="sql"), "c", Reason.LEAST_LOADED),
]  # fmt: skip


@pytest.mark.parametrize(
    ("replicas", "in_flight", "exclude", "affinity", "chosen", "reason"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_prefix_policy(
    replicas: list[RoutableReplica],
    in_flight: dict[str, int],
    exclude: tuple[str, ...],
    affinity: Affinity,
    chosen: str,
    reason: Reason,
) -> None:
    choice = choose_replica(
        replicas,
        in_flight,
        max_in_flight=4,
        exclude=exclude,
        affinity=affinity,
        policy=Policy.PREFIX,
    )
    assert choice.outcome is Outcome.CHOSEN
    assert choice.replica is not None
    assert (choice.replica.replica_id, choice.reason) == (chosen, reason)


def test_least_loaded_policy_ignores_the_prefix() -> None:
    choice = choose_replica(
        ABC3, {"a": 1}, max_in_flight=4, affinity=Affinity(ABC, cached_on="a"), turn=0
    )
    assert choice.replica is not None and choice.replica.replica_id == "b"
    assert choice.reason is Reason.LEAST_LOADED


@pytest.mark.parametrize(
    ("total", "replicas", "factor", "bound"),
    [(0, 2, 1.25, 1), (0, 1, 1.25, 2), (7, 2, 1.25, 5), (8, 4, 1.0, 3), (99, 4, 1.25, 32)],
)
def test_load_bound(total: int, replicas: int, factor: float, bound: int) -> None:
    assert load_bound(total, replicas, factor) == bound


@pytest.mark.parametrize(
    ("total", "replicas", "min_bound", "bound"),
    [(0, 4, 4, 4), (3, 4, 4, 4), (2, 4, 1, 1), (99, 4, 4, 32), (99, 4, 40, 40)],
)
def test_load_bound_has_a_floor(total: int, replicas: int, min_bound: int, bound: int) -> None:
    assert load_bound(total, replicas, 1.25, min_bound) == bound


def test_a_lightly_loaded_home_keeps_its_prefix() -> None:
    # Loads 2,0,0: 1.25x the mean is 2, so without a floor a's prefix spills
    # (a second copy of the prompt in b's cache); an engine batches 2 requests
    # at no cost, so with a floor of 4 it stays home...
    spilled = choose_replica(
        ABC3, {"a": 2}, max_in_flight=8, affinity=Affinity(ABC), policy=Policy.PREFIX
    )
    assert spilled.replica is not None and spilled.replica.replica_id == "b"
    kept = choose_replica(
        ABC3, {"a": 2}, max_in_flight=8, affinity=Affinity(ABC), policy=Policy.PREFIX, min_bound=4
    )
    assert kept.replica is not None and kept.replica.replica_id == "a"
    assert kept.reason is Reason.HOME
    # ... until it carries the floor.
    full = choose_replica(
        ABC3, {"a": 4}, max_in_flight=8, affinity=Affinity(ABC), policy=Policy.PREFIX, min_bound=4
    )
    assert full.replica is not None and full.replica.replica_id == "b"
    assert full.reason is Reason.SPILLED


def test_rendezvous_scores_are_pinned() -> None:
    # Two gateway processes (maybe of two versions during an upgrade) agree
    # only if this function never changes: pinned values.
    assert rendezvous_score(0, "a") == 0xF613DFA2B3C872DF
    assert rendezvous_score(123456789, "replica-1") == 0x6E8A1A7AE402EE55


def test_a_dead_replica_takes_only_its_own_keys() -> None:
    """Its affinity goes at once (nothing is sent to it) and only the keys it
    was home to move."""
    before = [r(f"r{i}") for i in range(5)]
    after = [x for x in before if x.replica_id != "r2"]
    moved = stayed = 0
    for key in range(1, 2001):
        home = Affinity(key * 2654435761)
        was = choose_replica(before, {}, max_in_flight=4, affinity=home, policy=Policy.PREFIX)
        now = choose_replica(after, {}, max_in_flight=4, affinity=home, policy=Policy.PREFIX)
        assert was.replica is not None and now.replica is not None
        assert now.replica.replica_id != "r2"
        if was.replica.replica_id == "r2":
            moved += 1
        else:
            assert now.replica == was.replica
            stayed += 1
    # Each replica is home to about a fifth of the keys.
    assert 300 < moved < 500 and stayed == 2000 - moved


def _place(replicas: list[RoutableReplica], affinities: list[Affinity]) -> dict[str, int]:
    """Place requests one after the other, none finishing: the load each
    replica ends with."""
    load: dict[str, int] = {}
    for affinity in affinities:
        choice = choose_replica(
            replicas, load, max_in_flight=10_000, affinity=affinity, policy=Policy.PREFIX,
            min_bound=DEFAULT_MIN_LOAD_BOUND,
        )  # fmt: skip
        assert choice.replica is not None
        rid = choice.replica.replica_id
        load[rid] = load.get(rid, 0) + 1
    return load


def _chat(system: str, user: str) -> bytes:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return json.dumps({"model": "m", "messages": messages}).encode()


def test_one_huge_shared_prefix_cannot_pin_all_traffic() -> None:
    system = "You are a helpful assistant. " * 400  # ~12 KB shared by every request
    bodies = [_chat(system, f"question {i}") for i in range(400)]
    prefixes = [
        request_prefix(b, "ep", base_model="m", block_bytes=512, max_blocks=64) for b in bodies
    ]
    assert len({p.home for p in prefixes}) == 1  # every request has the same home
    replicas = [r(f"r{i}") for i in range(4)]
    load = _place(replicas, [Affinity(p.home) for p in prefixes])
    assert sum(load.values()) == 400
    # The home replica fills to the bound (1.25x the mean), no further.
    assert max(load.values()) <= load_bound(399, 4, 1.25, DEFAULT_MIN_LOAD_BOUND)
    assert len(load) == 4


def test_colliding_prefixes_cannot_pin_all_traffic() -> None:
    # Keys built to collide: different prompts, all with the same home key.
    replicas = [r(f"r{i}") for i in range(3)]
    load = _place(replicas, [Affinity(ABC, cached_on="a") for _ in range(300)])
    assert max(load.values()) <= load_bound(299, 3, 1.25, DEFAULT_MIN_LOAD_BOUND)
    assert min(load.values()) > 0


def test_a_placed_hot_prefix_cannot_pin_all_traffic() -> None:
    """The placement gives one hot prefix (or colliding keys: one key) one
    replica; the load bound still spills it over the others."""
    from inferd.gateway.placement import PlacementSettings, PrefixPlacement

    replicas = [r(f"r{i}") for i in range(4)]
    placement = PrefixPlacement(PlacementSettings())
    placed = {placement.place(ABC, 24, replicas, now=float(i)) for i in range(400)}
    assert len(placed) == 1 and len(placement) == 1
    (home,) = placed
    load = _place(replicas, [Affinity(ABC, cached_on="r0", placed_on=home) for _ in range(400)])
    assert sum(load.values()) == 400
    assert max(load.values()) <= load_bound(399, 4, 1.25, DEFAULT_MIN_LOAD_BOUND)
    assert len(load) == 4


def test_distinct_conversations_spread_evenly() -> None:
    replicas = [r(f"r{i}") for i in range(4)]
    homes = [
        request_prefix(
            _chat(f"system prompt number {i} " * 40, "hi"),
            "ep",
            base_model="m",
            block_bytes=512,
            max_blocks=64,
        ).home
        for i in range(400)
    ]
    counts: dict[str, int] = {}
    for home in homes:
        choice = choose_replica(
            replicas, {}, max_in_flight=4, affinity=Affinity(home), policy=Policy.PREFIX
        )
        assert choice.replica is not None
        counts[choice.replica.replica_id] = counts.get(choice.replica.replica_id, 0) + 1
    assert min(counts.values()) > 60  # about 100 each


def test_held_requests_are_released_to_their_home() -> None:
    """A request held while every replica was busy keeps its affinity when
    a slot frees up: it goes home if home has room."""
    from inferd.gateway.hold import plan_release
    from inferd.gateway.settings import GatewaySettings

    placements, _ = plan_release(
        [frozenset(), frozenset()],
        ABC3,
        {"a": 1, "b": 1, "c": 1},
        max_in_flight=2,
        turn=0,
        affinities=[Affinity(CBA), Affinity(ABC)],
        settings=GatewaySettings(routing_policy=Policy.PREFIX),
    )
    assert [(p.index, p.replica.replica_id, p.reason) for p in placements] == [
        (0, "c", Reason.HOME),
        (1, "a", Reason.HOME),
    ]


@pytest.mark.parametrize(
    ("mine", "reported", "expected"),
    [
        # The replica's queue is this gateway's own 3 requests: load 3, under
        # the bound of 4 (their sum, 6, sent the request off its cache).
        (3, 3, Reason.HOME),
        # Another gateway's requests queue there too: its report says 5.
        (0, 5, Reason.SPILLED),
        (4, 0, Reason.SPILLED),
    ],
)
def test_the_reported_queue_and_the_gateways_own_requests_are_not_added(
    mine: int, reported: int, expected: Reason
) -> None:
    replicas = [r("a", reported), r("b"), r("c")]
    choice = choose_replica(
        replicas,
        {"a": mine},
        max_in_flight=8,
        affinity=Affinity(CBA, placed_on="a"),
        policy=Policy.PREFIX,
        min_bound=4,
    )
    assert choice.reason is expected
    assert (choice.replica and choice.replica.replica_id) == (
        "a" if expected is Reason.HOME else "c"
    )
