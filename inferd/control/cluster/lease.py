"""The leader lease and its fencing term: the pure policy of the election.

Several `inferd serve` instances share one PostgreSQL; all of them serve
clients, and exactly one, the leader, runs what must be single (reconciler,
autoscaler, launcher, liveness sweep). Two mechanisms together:

- A session advisory lock on a dedicated, non-pooled connection. The server
  releases it when that session ends (process killed, connection lost), so
  another instance takes over without waiting for any lease to expire. A
  pooled connection would hand the lock to whoever borrows it next, and
  PgBouncer in transaction mode breaks session locks altogether.
- A term: the `inferd_leader` row's counter, incremented by every new leader
  in the session that holds the lock. Every leader write runs in a `fenced`
  transaction that reads the term `FOR SHARE` and refuses to go on when it
  is not the writer's own: a deposed leader's late write (a tick that was
  already running when its connection dropped) fails instead of undoing the
  new leader's work. The share lock makes the check hold until commit: the
  next leader's term increment waits for the write to finish.

A leader that cannot confirm its session (an error, or no answer within the
check timeout) stops leading at once; the pure `lease_holds` also ends
leadership when confirmations stop for a while without an error (a stalled
event loop), because by then the server may have let the lock go.

The policy is pure (frozen dataclasses, the clock passed in) and tested as
tables; `inferd.control.cluster.postgres` is the adapter, tested on a real
PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The fence's rule sits beside `Deposed`, below the stores that apply it too.
from inferd.control.model import fence_allows as fence_allows

# -- the policy (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class LeaseSettings:
    # How often a follower tries the lock: the bound on failover once the
    # server has noticed the old leader's session is gone.
    retry_s: float = 0.5
    # How often the leader confirms its session and heartbeat.
    check_s: float = 1.0
    # How long one confirmation may take before the session counts as lost.
    check_timeout_s: float = 2.0
    # A heartbeat older than this, while the lock stays held elsewhere, is
    # reported (never acted on: only the lock decides who leads).
    stale_heartbeat_s: float = 30.0

    @property
    def lease_s(self) -> float:
        """The longest a leader goes on without a confirmed session."""
        return self.check_s + self.check_timeout_s


@dataclass(frozen=True)
class Leadership:
    """This instance's view of its own leadership."""

    term: int | None = None  # None: not leading
    confirmed_at: float | None = None  # clock of the last confirmed session

    @property
    def leading(self) -> bool:
        return self.term is not None


NOT_LEADING = Leadership()


def elected(term: int, now: float) -> Leadership:
    return Leadership(term=term, confirmed_at=now)


def confirmed(state: Leadership, now: float) -> Leadership:
    return replace(state, confirmed_at=now) if state.leading else state


def lease_holds(state: Leadership, now: float, settings: LeaseSettings) -> bool:
    """Whether this instance may still act as the leader at `now`."""
    if state.term is None or state.confirmed_at is None:
        return False
    return now - state.confirmed_at <= settings.lease_s


def heartbeat_stale(
    heartbeat_age_s: float | None, lock_free: bool, settings: LeaseSettings
) -> bool:
    """A follower's alarm: the lock is held, yet the holder has not beaten
    for `stale_heartbeat_s` (a half-open connection the server has not yet
    dropped). The follower reports it and does not take over."""
    if lock_free or heartbeat_age_s is None:
        return False
    return heartbeat_age_s > settings.stale_heartbeat_s
