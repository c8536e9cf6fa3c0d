"""The leader policy as tables: lease, fencing, the follower's alarm."""

from __future__ import annotations

import pytest

from inferd.control.cluster.lease import (
    NOT_LEADING,
    Leadership,
    LeaseSettings,
    confirmed,
    elected,
    fence_allows,
    heartbeat_stale,
    lease_holds,
)

SETTINGS = LeaseSettings(retry_s=0.5, check_s=1.0, check_timeout_s=2.0, stale_heartbeat_s=30.0)


@pytest.mark.parametrize(
    ("state", "now", "holds"),
    [
        (NOT_LEADING, 0.0, False),
        (elected(3, now=10.0), 10.0, True),
        (elected(3, now=10.0), 12.9, True),
        (elected(3, now=10.0), 13.0, True),  # exactly check_s + check_timeout_s
        (elected(3, now=10.0), 13.01, False),  # confirmations stopped: step down
        (Leadership(term=3, confirmed_at=None), 10.0, False),
        (confirmed(elected(3, now=10.0), now=12.5), 15.0, True),
    ],
)
def test_lease_holds(state: Leadership, now: float, holds: bool) -> None:
    assert lease_holds(state, now, SETTINGS) is holds


def test_confirming_a_follower_leaves_it_a_follower() -> None:
    assert confirmed(NOT_LEADING, now=5.0) == NOT_LEADING
    assert confirmed(elected(7, now=1.0), now=5.0) == Leadership(term=7, confirmed_at=5.0)


@pytest.mark.parametrize(
    ("writer", "current", "allowed"),
    [
        (4, 4, True),
        (3, 4, False),  # deposed: a newer leader was elected
        (5, 4, False),  # a term never issued
        (0, 0, True),
    ],
)
def test_fence_allows_only_the_current_term(writer: int, current: int, allowed: bool) -> None:
    assert fence_allows(writer, current) is allowed


@pytest.mark.parametrize(
    ("age", "lock_free", "alarm"),
    [
        (None, False, False),  # never beaten: nothing to compare
        (5.0, False, False),
        (30.0, False, False),
        (31.0, False, True),  # held, silent: report it
        (31.0, True, False),  # free: the follower simply takes it
    ],
)
def test_heartbeat_alarm(age: float | None, lock_free: bool, alarm: bool) -> None:
    assert heartbeat_stale(age, lock_free, SETTINGS) is alarm


def test_lease_is_check_period_plus_timeout() -> None:
    assert LeaseSettings(check_s=0.5, check_timeout_s=1.5).lease_s == 2.0
