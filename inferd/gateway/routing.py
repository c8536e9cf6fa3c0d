"""Which replica takes a request: a pure function of what the gateway knows.

Two policies (`GatewaySettings.routing_policy`):

- `least_loaded`: least in-flight work wins: the larger of the gateway's
  own in-flight count on a replica and the engine queue the replica last
  reported (not their sum: the queue holds this gateway's own requests too,
  and the sum counted them twice, sending requests off their cache from the
  one instance that hears the replicas' reports). Ties go
  round-robin by a turn counter the caller keeps, over the tied replicas
  sorted by id, so the same inputs always give the same answer.
- `prefix`: a request that carries a prefix (`Affinity`) goes where its KV
  cache most likely is, within a load bound — consistent hashing with
  bounded loads (Mirrokni et al., 2018), on rendezvous hashing:
  1. the replica its prefix is placed on (`placed_on`: the partition of
     the live prefixes over the replicas by what each cache holds, see
     `inferd.gateway.placement`), if it is ready and under the bound;
  2. else the replica this gateway last sent its longest known prefix to
     (`cached_on`), if it is ready and under the bound;
  3. else the replicas in rendezvous order of the request's `home` key
     (the same order in every gateway process, since it depends only on the
     key and the replica ids): the first one under the bound;
  4. else, or for a request with no prefix worth caching, least-loaded.
  The bound is `ceil(load_factor * (total load + 1) / replicas)`, at least
  `min_bound` (an engine batches a few requests at no cost): a hot
  prefix (one huge shared system prompt, or keys built to collide) fills its
  home replica to the bound and spills over, so it cannot pin all traffic
  on one replica. A replica that is not ready is not in `replicas`, so its
  affinity is gone at once: its keys fall to their next replica in
  rendezvous order, everyone else's stay put.

In both, a request that names a LoRA adapter prefers the replicas that
report it loaded, as long as one of them is under the bound; replicas
already tried for this request and replicas at the per-replica cap are out.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from inferd.gateway.directory import RoutableReplica


class Outcome(enum.Enum):
    CHOSEN = "chosen"
    # No ready replica that this request has not tried yet.
    NO_REPLICA = "no_replica"
    # Untried replicas exist but every one is at the per-replica bound.
    BUSY = "busy"


class Policy(enum.Enum):
    LEAST_LOADED = "least_loaded"
    PREFIX = "prefix"


class Reason(enum.Enum):
    """Why a replica was chosen (counted in /metrics)."""

    CACHED = "cached"  # where this gateway sent the prefix before
    # Where the prefix is placed; without a placement, the first in
    # rendezvous order.
    HOME = "home"
    SPILLED = "spilled"  # elsewhere: its home was over the bound
    LEAST_LOADED = "least_loaded"


@dataclass(frozen=True)
class Affinity:
    """What a request's prefix asks of the routing choice."""

    # Rendezvous key (same for every turn of a conversation and in every
    # gateway process); None when the request has no prefix worth caching.
    home: int | None = None
    # The replica this gateway last sent the request's longest known prefix to.
    cached_on: str | None = None
    # The LoRA adapter the request names, if any.
    adapter: str | None = None
    # The replica the prefix is placed on (`inferd.gateway.placement`).
    placed_on: str | None = None


@dataclass(frozen=True)
class Choice:
    outcome: Outcome
    replica: RoutableReplica | None = None
    reason: Reason | None = None


NO_REPLICA = Choice(Outcome.NO_REPLICA)
BUSY = Choice(Outcome.BUSY)
NO_AFFINITY = Affinity()
DEFAULT_LOAD_FACTOR = 1.25
# A replica with fewer requests than this (in flight and queued) is never over
# the bound: an LLM engine batches them, so a few requests do not make it
# busy, while a spill costs the whole prompt's prefill elsewhere and a copy
# of it in a second cache. Measured in benchmarks/RESULTS.md (routing).
DEFAULT_MIN_LOAD_BOUND = 4

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads the combined key over 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def rendezvous_score(home: int, replica_id: str) -> int:
    """Highest score wins; stable across processes (no salted `hash()`)."""
    return _mix((zlib.crc32(replica_id.encode()) << 32) ^ home)


def load_bound(total_load: int, replicas: int, load_factor: float, min_bound: int = 1) -> int:
    """The most load a replica may carry and still take a request by
    affinity: `load_factor` times the mean load including this request, and
    never less than `min_bound`."""
    if replicas <= 0:
        return 0
    mean = (total_load + 1) / replicas
    return max(1, min_bound, -int(-(load_factor * mean) // 1))


def choose_replica(
    replicas: Sequence[RoutableReplica],
    in_flight: Mapping[str, int],
    *,
    max_in_flight: int,
    turn: int = 0,
    exclude: Collection[str] = (),
    affinity: Affinity = NO_AFFINITY,
    policy: Policy = Policy.LEAST_LOADED,
    load_factor: float = DEFAULT_LOAD_FACTOR,
    min_bound: int = 1,
) -> Choice:
    open_: list[tuple[RoutableReplica, int]] = []
    candidates = False
    total = 0
    for replica in replicas:
        if replica.replica_id in exclude:
            continue
        candidates = True
        mine = in_flight.get(replica.replica_id, 0)
        if mine >= max_in_flight:
            continue
        load = max(mine, replica.reported_waiting)
        total += load
        open_.append((replica, load))
    if not open_:
        return BUSY if candidates else NO_REPLICA
    bound = load_bound(total, len(open_), load_factor, min_bound)
    adapter = affinity.adapter
    if adapter is not None:
        holders = [(r, load) for r, load in open_ if adapter in r.adapters]
        if any(load < bound for _, load in holders):
            open_ = holders
    if policy is Policy.PREFIX and affinity.home is not None:
        first = Reason.HOME
        wanted = ((affinity.placed_on, Reason.HOME), (affinity.cached_on, Reason.CACHED))
        for rid, reason in wanted:
            if rid is not None:
                for replica, load in open_:
                    if replica.replica_id == rid:
                        if load < bound:
                            return Choice(Outcome.CHOSEN, replica, reason)
                        if reason is Reason.HOME:
                            # Its home is over the bound: anywhere else is a spill.
                            first = Reason.SPILLED
        home = affinity.home
        ranked = sorted(open_, key=lambda rl: rendezvous_score(home, rl[0].replica_id))
        for rank, (replica, load) in enumerate(reversed(ranked)):
            if load < bound:
                return Choice(Outcome.CHOSEN, replica, Reason.SPILLED if rank else first)
    return _least_loaded(open_, turn)


def _least_loaded(open_: list[tuple[RoutableReplica, int]], turn: int) -> Choice:
    best: list[RoutableReplica] = []
    best_load = 0
    for replica, load in open_:
        if not best or load < best_load:
            best, best_load = [replica], load
        elif load == best_load:
            best.append(replica)
    if len(best) > 1:
        best.sort(key=lambda r: r.replica_id)
    return Choice(Outcome.CHOSEN, best[turn % len(best)], Reason.LEAST_LOADED)
