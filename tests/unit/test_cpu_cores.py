"""How a machine's cores are shared among its CPU replica slots."""

from __future__ import annotations

from inferd.control.launchers.cpu_cores import BIND_ENV, bind_environment, slot_cores


def test_each_slot_gets_its_own_even_contiguous_share() -> None:
    cores = list(range(8))
    assert [slot_cores(s, 4, cores) for s in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # Uneven: the first slots take one more; every core is used once.
    shares = [slot_cores(s, 3, cores) for s in range(3)]
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # A container's cpuset need not start at 0 nor be contiguous.
    assert [slot_cores(s, 2, [2, 3, 6, 7]) for s in range(2)] == [[2, 3], [6, 7]]


def test_more_slots_than_cores_share_cores_round_robin() -> None:
    # Two replicas on a 2-core machine with 4 slots land on different cores.
    assert [slot_cores(s, 4, [0, 1]) for s in range(4)] == [[0], [1], [0], [1]]
    assert slot_cores(0, 0, [0, 1]) == [] and slot_cores(0, 2, []) == []


def test_the_binding_is_vllms_core_list_unless_the_operator_set_one() -> None:
    assert bind_environment(1, 2, [0, 1, 2, 3], {}) == {BIND_ENV: "2,3"}
    assert bind_environment(1, 2, [0, 1, 2, 3], {BIND_ENV: "auto"}) == {}
