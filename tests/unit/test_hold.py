"""The hold queue's decisions as tables: admit / hold / refuse, first-in
first-out release, and the Retry-After estimate, with an injected clock."""

from __future__ import annotations

import pytest

from inferd.gateway.directory import RoutableReplica
from inferd.gateway.hold import (
    MAX_RETRY_AFTER_S,
    HoldRoom,
    Verdict,
    admit,
    plan_release,
    retry_after,
)
from inferd.gateway.routing import Outcome


def r(rid: str, waiting: int = 0) -> RoutableReplica:
    return RoutableReplica(rid, f"http://127.0.0.1/{rid}", reported_waiting=waiting)


ADMIT = [
    # (name, outcome, held, max_held, verdict, status)
    ("free slot, nobody waiting", Outcome.CHOSEN, 0, 4, Verdict.FORWARD, None),
    ("free slot, but others wait first", Outcome.CHOSEN, 2, 4, Verdict.HOLD, None),
    ("busy, room in queue", Outcome.BUSY, 3, 4, Verdict.HOLD, None),
    ("busy, queue full", Outcome.BUSY, 4, 4, Verdict.REFUSE, 429),
    ("no replica, room in queue", Outcome.NO_REPLICA, 0, 4, Verdict.HOLD, None),
    ("no replica, queue full", Outcome.NO_REPLICA, 4, 4, Verdict.REFUSE, 503),
    ("no queue allowed, busy", Outcome.BUSY, 0, 0, Verdict.REFUSE, 429),
    ("no queue allowed, scaling", Outcome.NO_REPLICA, 0, 0, Verdict.REFUSE, 503),
    ("no queue allowed, free", Outcome.CHOSEN, 0, 0, Verdict.FORWARD, None),
]


@pytest.mark.parametrize(
    ("outcome", "held", "max_held", "verdict", "status"),
    [case[1:] for case in ADMIT],
    ids=[case[0] for case in ADMIT],
)
def test_admit(
    outcome: Outcome, held: int, max_held: int, verdict: Verdict, status: int | None
) -> None:
    admission = admit(outcome, held, max_held)
    assert (admission.verdict, admission.status) == (verdict, status)


BYTES = [
    # (name, outcome, room, cost, verdict, status) with 1000 bytes per
    # endpoint and 1500 for the instance
    ("room for it", Outcome.NO_REPLICA, HoldRoom(1, 500, 500), 400, Verdict.HOLD, None),
    ("exactly fills the endpoint", Outcome.NO_REPLICA, HoldRoom(1, 500, 500), 500,
     Verdict.HOLD, None),
    ("endpoint bytes full", Outcome.NO_REPLICA, HoldRoom(1, 900, 900), 200, Verdict.REFUSE, 503),
    ("instance bytes full", Outcome.BUSY, HoldRoom(1, 100, 1400), 200, Verdict.REFUSE, 429),
    ("free slot: bytes do not matter", Outcome.CHOSEN, HoldRoom(0, 0, 1500), 9999,
     Verdict.FORWARD, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("outcome", "room", "cost", "verdict", "status"),
    [case[1:] for case in BYTES],
    ids=[case[0] for case in BYTES],
)
def test_admit_bounds_held_bytes_per_endpoint_and_instance(
    outcome: Outcome, room: HoldRoom, cost: int, verdict: Verdict, status: int | None
) -> None:
    admission = admit(
        outcome, room.held, 10_000, room=room, cost=cost, max_bytes=1000, max_instance_bytes=1500
    )
    assert (admission.verdict, admission.status) == (verdict, status)


NONE: frozenset[str] = frozenset()
RELEASE = [
    # (name, queue exclusions, replicas, in_flight, cap, expected [(index, replica)])
    ("nothing ready", [NONE, NONE], [], {}, 2, []),
    ("one slot: oldest goes", [NONE, NONE], [r("a")], {"a": 1}, 2, [(0, "a")]),
    ("no slot", [NONE], [r("a")], {"a": 2}, 2, []),
    ("cold start: fill every slot in order", [NONE] * 5, [r("a")], {}, 2, [(0, "a"), (1, "a")]),
    ("two replicas spread", [NONE] * 3, [r("a"), r("b")], {}, 2, [(0, "a"), (1, "b"), (2, "a")]),
    ("tried replica skipped, next waiter not blocked", [frozenset({"a"}), NONE], [r("a")], {}, 2,
     [(1, "a")]),
    ("tried one, other free", [frozenset({"a"})], [r("a"), r("b")], {"b": 1}, 2, [(0, "b")]),
    ("least loaded first", [NONE], [r("a"), r("b", 3)], {"a": 1}, 4, [(0, "a")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("excluded", "replicas", "in_flight", "cap", "expected"),
    [case[1:] for case in RELEASE],
    ids=[case[0] for case in RELEASE],
)
def test_plan_release(
    excluded: list[frozenset[str]],
    replicas: list[RoutableReplica],
    in_flight: dict[str, int],
    cap: int,
    expected: list[tuple[int, str]],
) -> None:
    before = dict(in_flight)
    placements, turn = plan_release(excluded, replicas, in_flight, max_in_flight=cap, turn=0)
    assert [(p.index, p.replica.replica_id) for p in placements] == expected
    assert turn == len(expected)
    assert in_flight == before  # pure: the caller applies the plan


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


RETRY_AFTER = [
    # (name, scaling, ahead, slots, mean service, cold start, scaling for, expected)
    ("busy, nothing observed", False, 1, 4, None, 10.0, 0.0, 1),
    ("busy, short queue rounds up to 1", False, 1, 8, 0.2, 10.0, 0.0, 1),
    ("busy, queue drains through slots", False, 40, 4, 0.5, 10.0, 0.0, 5),
    ("busy, long service", False, 9, 1, 3.0, 10.0, 0.0, 27),
    ("scaling, cold start estimate", True, 1, 1, None, 10.0, 0.0, 11),
    ("scaling, partly done", True, 1, 4, 0.4, 10.0, 7.5, 3),
    ("scaling, overdue", True, 1, 4, 0.4, 10.0, 30.0, 1),
    ("capped", False, 10_000, 1, 60.0, 10.0, 0.0, MAX_RETRY_AFTER_S),
]  # fmt: skip


@pytest.mark.parametrize(
    ("scaling", "ahead", "slots", "mean", "cold", "elapsed", "expected"),
    [case[1:] for case in RETRY_AFTER],
    ids=[case[0] for case in RETRY_AFTER],
)
def test_retry_after(
    scaling: bool,
    ahead: int,
    slots: int,
    mean: float | None,
    cold: float,
    elapsed: float,
    expected: int,
) -> None:
    clock = FakeClock()
    scale_started = clock()
    clock.now += elapsed  # time passes on the injected clock, not in the test
    seconds = retry_after(
        scaling=scaling,
        ahead=ahead,
        slots=slots,
        mean_service_s=mean,
        cold_start_s=cold,
        scaling_for_s=clock() - scale_started,
    )
    assert seconds == expected
    assert seconds >= 1
