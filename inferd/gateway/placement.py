"""Which replica each live prompt prefix belongs to, by what each KV cache holds.

Rendezvous hashing alone (`routing.rendezvous_score`) gives each replica the
same share of prefixes only on average: 12 system prompts over 2 replicas
split 6/6 less than a quarter of the time and 8/4 or worse 39% of the time,
so with caches that each hold about 8 prompts one cache thrashes while the
other idles. Here each prefix is placed once, when it first arrives, on a
replica that has room for it, and then stays there:

- every prefix key (`affinity.RequestPrefix.home`) seen in the last
  `horizon_s` is live, with its size: the hashed blocks of the first
  request of it, rounded up to a power of two (`size_class`);
- a replica's share is the live prefixes' total size times its part of the
  fleet's KV cache (`RoutableReplica.kv_cache_tokens`; equal parts while any
  replica has not reported it) times `slack`;
- a new prefix goes to the first replica in its rendezvous order whose
  placed size plus its own stays within that replica's share; when none has
  room, to the one with the most room left (the most free cache);
- a placed prefix is not moved by later arrivals: moving it would throw away
  the cache it has built where it is (a partition recomputed on every
  arrival, in an order of its own, moved about one cached prefix per new
  one, and a real endpoint's prefix-cache hit rate fell from 0.84 to 0.34).
  It moves only when its replica leaves (to wherever a new prefix would go)
  or when prefixes leaving the live set have left its replica holding more
  than `rebalance_over` times its share: then that replica's least recently
  seen prefixes move to the replica with the most room, until it is back
  within its share. A replica that joins takes the new prefixes first.

Two gateway processes that see the same conversations (a load balancer
alternating between them) see them in different orders, so the rule above
alone would place a third of such prefixes apart (each then cached twice).
They agree through the replicas instead (`inferd.gateway.placement_claims`):
a request sent to its prefix's placed replica tells the replica the key, and
every gateway polls the replicas' lists of keys placed on them (`adopt`). A
prefix new to this gateway that a replica lists goes there (the replica it
was last placed on, if several list it); a prefix this gateway placed in the
last `settle_s` moves to the replica another gateway placed it on first, so
two placements made at once end on the same replica. Each request is a dict
lookup; a new prefix costs one pass over the replicas.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferd.gateway.directory import RoutableReplica
from inferd.gateway.routing import rendezvous_score


@dataclass(frozen=True)
class PlacementSettings:
    # How far over its share a replica may be filled by new prefixes before
    # one tries the next replica (1.0: exactly its share).
    slack: float = 1.15
    # How far over its share a replica may be left by prefixes that expired
    # elsewhere or replicas that joined before its prefixes move (moves cost
    # the cache built for them; a little imbalance costs less).
    rebalance_over: float = 1.5
    # A prefix not seen for this long is no longer live (it leaves the
    # placement, and is placed again if it comes back).
    horizon_s: float = 120.0
    # Live prefixes kept per endpoint at most (least recently seen out first).
    max_prefixes: int = 256
    # For this long after placing a prefix, a gateway follows another
    # gateway's earlier placement of it (learnt from the replicas' lists);
    # later, its placement stands (the lists may still name a replica the
    # prefix was moved off).
    settle_s: float = 15.0


@dataclass(frozen=True)
class Claim:
    """What the replicas' lists say of one prefix key."""

    # The replica it was placed on first (the earliest first placement).
    first: str
    # The replica it was placed on last (the latest last placement).
    current: str


def size_class(blocks: int) -> int:
    """A prefix's size as the placement counts it: its blocks rounded up to
    a power of two. Two gateways may first see a conversation at different
    turns (a few blocks apart); rounded, they count the same size."""
    return 1 << max(0, blocks - 1).bit_length()


def shares(
    replicas: Sequence[tuple[str, int | None]], total: int, slack: float
) -> dict[str, float]:
    """Replica id -> the size of prefixes it may hold: `slack` times its part
    of `total`, by reported KV-cache tokens (equal parts while any replica
    has not reported them)."""
    capacities = [capacity for _, capacity in replicas]
    weights: Sequence[int | None] = capacities
    if not all(capacities):
        weights = [1] * len(replicas)
    whole = sum(w or 0 for w in weights) or 1
    return {
        rid: slack * total * (w or 0) / whole for (rid, _), w in zip(replicas, weights, strict=True)
    }


def choose_home(
    key: int, size: int, assigned: Mapping[str, int], bounds: Mapping[str, float]
) -> str | None:
    """Where a new prefix goes: the first replica in its rendezvous order
    with room for it under its bound, else the one with the most room left
    (ties: the earlier in rendezvous order). Pure and deterministic."""
    if not bounds:
        return None
    order = sorted(bounds, key=lambda rid: rendezvous_score(key, rid), reverse=True)
    for rid in order:
        if assigned.get(rid, 0) + size <= bounds[rid]:
            return rid
    return max(order, key=lambda rid: bounds[rid] - assigned.get(rid, 0))


class PrefixPlacement:
    """The live prefixes of one endpoint and the replica each is placed on."""

    def __init__(self, settings: PlacementSettings) -> None:
        self.settings = settings
        # key -> last seen, least recently seen first.
        self._seen: OrderedDict[int, float] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._total = 0
        self._placed: dict[int, str] = {}
        # Replica id -> the placed prefixes' sizes there.
        self._assigned: dict[str, int] = {}
        self._replicas: tuple[tuple[str, int | None], ...] = ()
        # Prefixes this gateway placed by its own rule in the last
        # `settle_s`, with when (its own clock): those follow another
        # gateway's earlier placement (`adopt`).
        self._settling: dict[int, float] = {}
        # The replicas' lists of placed prefixes, as last polled.
        self._claims: Mapping[int, Claim] = {}
        # Live prefixes moved off a replica that still holds their cache
        # (rebalancing), and off replicas that left.
        self.moves = 0

    def __len__(self) -> int:
        return len(self._seen)

    def place(
        self, key: int, blocks: int, replicas: Sequence[RoutableReplica], now: float
    ) -> str | None:
        """Note a request of prefix `key` carrying `blocks` hashed blocks;
        the replica its prefix is placed on (None without replicas)."""
        if not replicas:
            return None
        seen = self._seen
        if key in seen:
            seen[key] = now
            seen.move_to_end(key)
        else:
            seen[key] = now
            self._sizes[key] = size_class(blocks)
            self._total += self._sizes[key]
        expired = self._expire(now)
        signature = tuple(sorted((r.replica_id, r.kv_cache_tokens) for r in replicas))
        joined_or_left = signature != self._replicas
        if joined_or_left:
            self._replicas = signature
            self._drop_departed()
        if expired or joined_or_left:
            self._rebalance()
        placed = self._placed.get(key)
        if placed is None:
            placed = self._place_new(key, now)
        return placed

    def adopt(self, claims: Mapping[int, Claim], now: float) -> int:
        """Take the replicas' lists of placed prefixes (key -> `Claim`): new
        prefixes will follow them, and prefixes placed here in the last
        `settle_s` move to where another gateway placed them first. Returns
        the prefixes moved."""
        self._claims = claims
        present = {rid for rid, _ in self._replicas}
        moved = 0
        for key, at in list(self._settling.items()):
            if now - at > self.settings.settle_s:
                del self._settling[key]
                continue
            claim = claims.get(key)
            if claim is not None and claim.first != self._placed[key] and claim.first in present:
                self._unassign(key)
                self._assign(key, claim.first)
                moved += 1
        self.moves += moved
        return moved

    def placements(self) -> dict[int, str]:
        return dict(self._placed)

    def claims(self) -> Mapping[int, Claim]:
        """The replicas' lists as last adopted."""
        return self._claims

    def working_sets(self) -> dict[str, int]:
        """Size classes of the live prefixes placed on each replica (the split)."""
        return {rid: self._assigned.get(rid, 0) for rid, _ in self._replicas}

    def counts(self) -> dict[str, int]:
        """Live prefixes placed on each replica."""
        out = {rid: 0 for rid, _ in self._replicas}
        for rid in self._placed.values():
            out[rid] = out.get(rid, 0) + 1
        return out

    def _bounds(self, slack: float) -> dict[str, float]:
        return shares(self._replicas, self._total, slack)

    def _assign(self, key: int, rid: str) -> None:
        self._placed[key] = rid
        self._assigned[rid] = self._assigned.get(rid, 0) + self._sizes[key]

    def _unassign(self, key: int) -> str | None:
        rid = self._placed.pop(key, None)
        self._settling.pop(key, None)
        if rid is not None:
            self._assigned[rid] -= self._sizes[key]
        return rid

    def _place_new(self, key: int, now: float) -> str:
        claim = self._claims.get(key)
        rid: str | None = None
        if claim is not None and any(claim.current == r for r, _ in self._replicas):
            rid = claim.current  # another gateway placed it: follow
        else:
            bounds = self._bounds(self.settings.slack)
            rid = choose_home(key, self._sizes[key], self._assigned, bounds)
            self._settling[key] = now
        assert rid is not None  # there are replicas
        self._assign(key, rid)
        return rid

    def _expire(self, now: float) -> bool:
        settings = self.settings
        seen = self._seen
        expired = False
        while seen:
            key, at = next(iter(seen.items()))
            if len(seen) <= settings.max_prefixes and now - at <= settings.horizon_s:
                break
            seen.popitem(last=False)
            self._unassign(key)
            self._total -= self._sizes.pop(key)
            expired = True
        return expired

    def _drop_departed(self) -> None:
        """Prefixes of replicas that left are placed again (where a new
        prefix would go) when next seen."""
        present = {rid for rid, _ in self._replicas}
        for key, rid in list(self._placed.items()):
            if rid not in present:
                self._unassign(key)
                self.moves += 1
        for rid in list(self._assigned):
            if rid not in present:
                del self._assigned[rid]

    def _rebalance(self) -> None:
        """Move the least recently seen prefixes off replicas over
        `rebalance_over` times their share, to the replica with the most
        room, while that one stays within its own share."""
        over = self._bounds(self.settings.rebalance_over)
        within = self._bounds(self.settings.slack)
        crowded = [rid for rid, bound in over.items() if self._assigned.get(rid, 0) > bound]
        if not crowded:
            return
        for key in list(self._seen):  # least recently seen first
            rid = self._placed.get(key)
            if rid is None or rid not in crowded or self._assigned[rid] <= within[rid]:
                continue
            size = self._sizes[key]
            roomiest = max(within, key=lambda r: within[r] - self._assigned.get(r, 0))
            if roomiest == rid or self._assigned.get(roomiest, 0) + size > within[roomiest]:
                continue
            self._unassign(key)
            self._assign(key, roomiest)
            self.moves += 1


class Placements:
    """`PrefixPlacement` per endpoint."""

    def __init__(self, settings: PlacementSettings | None = None) -> None:
        self.settings = settings or PlacementSettings()
        self._endpoints: dict[str, PrefixPlacement] = {}

    def place(
        self,
        endpoint_id: str,
        key: int,
        blocks: int,
        replicas: Sequence[RoutableReplica],
        now: float,
    ) -> str | None:
        placement = self._endpoints.get(endpoint_id)
        if placement is None:
            if not replicas:
                return None
            placement = self._endpoints[endpoint_id] = PrefixPlacement(self.settings)
        return placement.place(key, blocks, replicas, now)

    def endpoint(self, endpoint_id: str) -> PrefixPlacement | None:
        return self._endpoints.get(endpoint_id)

    def endpoints(self) -> dict[str, PrefixPlacement]:
        return dict(self._endpoints)

    def forget(self, endpoint_id: str) -> None:
        self._endpoints.pop(endpoint_id, None)
