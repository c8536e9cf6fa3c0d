"""The routing choice as a table: least in-flight work, exclusions, the
per-replica bound and round-robin ties."""

from __future__ import annotations

import pytest

from inferd.gateway.directory import RoutableReplica
from inferd.gateway.routing import Affinity, Outcome, choose_replica


def r(rid: str, waiting: int = 0) -> RoutableReplica:
    return RoutableReplica(rid, f"http://127.0.0.1/{rid}", reported_waiting=waiting)


CASES = [
    # (name, replicas, in_flight, exclude, cap, turn, outcome, chosen)
    ("no replicas", [], {}, (), 4, 0, Outcome.NO_REPLICA, None),
    ("single idle", [r("a")], {}, (), 4, 0, Outcome.CHOSEN, "a"),
    ("least gateway in-flight", [r("a"), r("b")], {"a": 2, "b": 1}, (), 4, 0, Outcome.CHOSEN, "b"),
    ("reported waiting counts", [r("a", 3), r("b")], {"b": 2}, (), 4, 0, Outcome.CHOSEN, "b"),
    ("waiting plus in-flight", [r("a", 1), r("b", 0)], {"a": 0, "b": 2}, (), 4, 0,
     Outcome.CHOSEN, "a"),
    ("excluded replica skipped", [r("a"), r("b", 5)], {}, ("a",), 4, 0, Outcome.CHOSEN, "b"),
    ("all excluded", [r("a"), r("b")], {}, ("a", "b"), 4, 0, Outcome.NO_REPLICA, None),
    ("at the bound", [r("a"), r("b")], {"a": 4, "b": 1}, (), 4, 0, Outcome.CHOSEN, "b"),
    ("bound beats low waiting", [r("a"), r("b", 9)], {"a": 4}, (), 4, 0, Outcome.CHOSEN, "b"),
    ("all at the bound", [r("a"), r("b")], {"a": 4, "b": 4}, (), 4, 0, Outcome.BUSY, None),
    ("busy and excluded", [r("a"), r("b")], {"a": 4}, ("b",), 4, 0, Outcome.BUSY, None),
    ("tie turn 0", [r("b"), r("a")], {}, (), 4, 0, Outcome.CHOSEN, "a"),
    ("tie turn 1", [r("b"), r("a")], {}, (), 4, 1, Outcome.CHOSEN, "b"),
    ("tie turn 2", [r("b"), r("a")], {}, (), 4, 2, Outcome.CHOSEN, "a"),
    ("tie among least only", [r("a"), r("b"), r("c")], {"a": 1}, (), 4, 1, Outcome.CHOSEN, "c"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("replicas", "in_flight", "exclude", "cap", "turn", "outcome", "chosen"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_choose_replica(
    replicas: list[RoutableReplica],
    in_flight: dict[str, int],
    exclude: tuple[str, ...],
    cap: int,
    turn: int,
    outcome: Outcome,
    chosen: str | None,
) -> None:
    choice = choose_replica(replicas, in_flight, max_in_flight=cap, turn=turn, exclude=exclude)
    assert choice.outcome is outcome
    assert (choice.replica.replica_id if choice.replica else None) == chosen


def test_round_robin_spreads_sequential_requests() -> None:
    replicas = [r("a"), r("b"), r("c")]
    picks = [
        choose_replica(replicas, {}, max_in_flight=4, turn=turn).replica.replica_id  # type: ignore[union-attr]
        for turn in range(6)
    ]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_same_inputs_same_answer_whatever_the_directory_order() -> None:
    forward = choose_replica([r("a"), r("b")], {}, max_in_flight=4, turn=5)
    backward = choose_replica([r("b"), r("a")], {}, max_in_flight=4, turn=5)
    assert forward == backward


def held(rid: str, *adapters: str, waiting: int = 0) -> RoutableReplica:
    return RoutableReplica(rid, f"http://127.0.0.1/{rid}", waiting, frozenset(adapters))


ADAPTER_CASES = [
    # (name, replicas, in_flight, adapter, chosen): least-loaded policy, bound 1.25x mean
    ("the holder, though busier", [held("a"), held("b", "sql")], {"b": 1}, "sql", "b"),
    ("base model: least loaded", [held("a"), held("b", "sql")], {"b": 1}, None, "a"),
    ("least loaded of the holders", [held("a", "sql"), held("b", "sql"), held("c")],
     {"a": 2, "b": 1}, "sql", "b"),
    ("holder over the load bound: least loaded", [held("a"), held("b", "sql")], {"b": 3},
     "sql", "a"),
    ("nobody holds it: least loaded", [held("a", "x"), held("b")], {"a": 1}, "sql", "b"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("replicas", "in_flight", "adapter", "chosen"),
    [case[1:] for case in ADAPTER_CASES],
    ids=[case[0] for case in ADAPTER_CASES],
)
def test_an_adapters_holder_is_preferred_within_the_load_bound(
    replicas: list[RoutableReplica], in_flight: dict[str, int], adapter: str | None, chosen: str
) -> None:
    choice = choose_replica(
        replicas, in_flight, max_in_flight=8, affinity=Affinity(adapter=adapter)
    )
    assert choice.replica is not None and choice.replica.replica_id == chosen
