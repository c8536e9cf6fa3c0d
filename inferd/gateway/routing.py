"""Which replica takes a request: a pure function of what the gateway knows.

Least in-flight work wins: the gateway's own in-flight count on a replica plus
the engine queue the replica last reported. Replicas already tried for this
request and replicas at the per-replica bound are out. Ties go round-robin by
a turn counter the caller keeps, over the tied replicas sorted by id, so the
same inputs always give the same answer.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from inferd.gateway.directory import RoutableReplica


class Outcome(enum.Enum):
    CHOSEN = "chosen"
    # No ready replica that this request has not tried yet.
    NO_REPLICA = "no_replica"
    # Untried replicas exist but every one is at the per-replica bound.
    BUSY = "busy"


@dataclass(frozen=True)
class Choice:
    outcome: Outcome
    replica: RoutableReplica | None = None


NO_REPLICA = Choice(Outcome.NO_REPLICA)
BUSY = Choice(Outcome.BUSY)


def choose_replica(
    replicas: Sequence[RoutableReplica],
    in_flight: Mapping[str, int],
    *,
    max_in_flight: int,
    turn: int = 0,
    exclude: Collection[str] = (),
) -> Choice:
    best: list[RoutableReplica] = []
    best_load = 0
    candidates = False
    for replica in replicas:
        if replica.replica_id in exclude:
            continue
        candidates = True
        mine = in_flight.get(replica.replica_id, 0)
        if mine >= max_in_flight:
            continue
        load = mine + replica.reported_waiting
        if not best or load < best_load:
            best, best_load = [replica], load
        elif load == best_load:
            best.append(replica)
    if not best:
        return BUSY if candidates else NO_REPLICA
    if len(best) == 1:
        return Choice(Outcome.CHOSEN, best[0])
    best.sort(key=lambda r: r.replica_id)
    return Choice(Outcome.CHOSEN, best[turn % len(best)])
