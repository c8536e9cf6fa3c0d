"""Which replica each live prompt prefix belongs to, by what each KV cache holds.

Rendezvous hashing alone (`routing.rendezvous_score`) gives each replica the
same share of prefixes only on average: 12 system prompts over 2 replicas
split 6/6 less than a quarter of the time and 8/4 or worse 39% of the time,
so with caches that each hold about 8 prompts one cache thrashes while the
other idles. Here the live prefixes are partitioned instead, with
consistent hashing with bounded loads (Mirrokni et al., 2018) where the load
is the prefix's size, not its requests:

- every prefix key (`affinity.RequestPrefix.home`) seen in the last
  `horizon_s` is live, with its size: the hashed blocks of the first
  request of it, rounded up to a power of two (`size_class`);
- in a canonical order (by key, so the arrival order does not matter), each
  goes to the first replica in its rendezvous order whose assigned size plus
  its own stays within the replica's share: the total size times the
  replica's part of the fleet's KV cache (`RoutableReplica.kv_cache_tokens`;
  equal parts while any replica has not reported it) times `slack`. When no
  replica has room for it, it goes to the one with the most room left: the
  most free cache;
- a replica's share is below its cache whenever the live set fits the
  fleet's, so when new prefixes arrive and a replica's working set would
  outgrow its share, the prefixes latest in the order move to their next
  replica; the others stay where they are.

The partition is a function of the live set (keys and size classes) and of
the replicas (ids and reported capacities) alone. Two gateway processes that
see the same conversations (a load balancer alternating between them)
compute the same placements without talking to each other; while one has
seen a prefix the other has not yet, they may differ, and agree again once
both have seen it. The partition is computed again when a prefix arrives or
leaves and when the replicas change (time proportional to the live
prefixes, at most `max_prefixes`); every other request is a dict lookup.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferd.gateway.directory import RoutableReplica
from inferd.gateway.routing import rendezvous_score


@dataclass(frozen=True)
class PlacementSettings:
    # How far over its share a replica may be filled before a prefix tries
    # the next replica (1.0: exactly its share). Tighter evens the caches
    # out more and moves more prefixes when one arrives.
    slack: float = 1.15
    # A prefix not seen for this long is no longer live (it leaves the
    # partition, and is placed again if it comes back).
    horizon_s: float = 120.0
    # Live prefixes kept per endpoint at most (oldest out first): each new
    # one computes the partition again, in time proportional to this.
    max_prefixes: int = 256


def size_class(blocks: int) -> int:
    """A prefix's size as the partition counts it: its blocks rounded up to
    a power of two. Two gateways may first see a conversation at different
    turns (a few blocks apart); rounded, they count the same size."""
    return 1 << max(0, blocks - 1).bit_length()


def partition(
    prefixes: Mapping[int, int],
    replicas: Sequence[tuple[str, int | None]],
    slack: float,
) -> dict[int, str]:
    """Prefix key -> replica id, for prefixes given as key -> size and
    replicas as (id, KV-cache tokens or None). Pure and deterministic."""
    ids = [rid for rid, _ in replicas]
    bounds = _shares(replicas, sum(prefixes.values()), slack)
    return _partition(sorted(prefixes), prefixes, ids, bounds, {})


def _partition(
    keys: Sequence[int],
    sizes: Mapping[int, int],
    ids: list[str],
    bounds: list[float],
    orders: dict[int, tuple[int, ...]],
) -> dict[int, str]:
    """`partition` over `keys` (sorted), with each key's rendezvous order
    cached in `orders`."""
    if not ids:
        return {}
    assigned = [0] * len(ids)
    out: dict[int, str] = {}
    for key in keys:
        order = orders.get(key)
        if order is None:
            order = orders[key] = _order(key, ids)
        size = sizes[key]
        for i in order:
            if assigned[i] + size <= bounds[i]:
                break
        else:  # no room anywhere: the most room left
            i = max(order, key=lambda j: bounds[j] - assigned[j])
        assigned[i] += size
        out[key] = ids[i]
    return out


def _order(key: int, ids: list[str]) -> tuple[int, ...]:
    """The replicas (indices) in the key's rendezvous order."""
    return tuple(sorted(range(len(ids)), key=lambda i: rendezvous_score(key, ids[i]), reverse=True))


def _shares(replicas: Sequence[tuple[str, int | None]], total: int, slack: float) -> list[float]:
    capacities = [capacity for _, capacity in replicas]
    weights: Sequence[int | None] = capacities
    if not all(capacities):
        weights = [1] * len(replicas)
    whole = sum(w or 0 for w in weights) or 1
    return [slack * total * (w or 0) / whole for w in weights]


class PrefixPlacement:
    """The live prefixes of one endpoint and where the partition puts them."""

    def __init__(self, settings: PlacementSettings) -> None:
        self.settings = settings
        # key -> last seen, least recently seen first.
        self._seen: OrderedDict[int, float] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._keys: list[int] = []  # the live keys, sorted
        self._total = 0
        self._placed: dict[int, str] = {}
        self._replicas: tuple[tuple[str, int | None], ...] = ()
        # Rendezvous order per key over `_replicas` (kept while they are).
        self._orders: dict[int, tuple[int, ...]] = {}
        self._changed = False

    def __len__(self) -> int:
        return len(self._seen)

    def place(
        self, key: int, blocks: int, replicas: Sequence[RoutableReplica], now: float
    ) -> str | None:
        """Note a request of prefix `key` carrying `blocks` hashed blocks;
        the replica its prefix belongs to (None without replicas)."""
        if not replicas:
            return None
        seen = self._seen
        if key in seen:
            seen[key] = now
            seen.move_to_end(key)
        else:
            seen[key] = now
            size = self._sizes[key] = size_class(blocks)
            self._total += size
            bisect.insort(self._keys, key)
            self._changed = True
        self._expire(now)
        signature = tuple((r.replica_id, r.kv_cache_tokens) for r in replicas)
        if signature != self._replicas:
            if sorted(signature) != sorted(self._replicas):
                self._orders = {}
                self._changed = True
            self._replicas = signature
        if self._changed:
            self._compute()
        return self._placed.get(key)

    def placements(self) -> dict[int, str]:
        return dict(self._placed)

    def working_sets(self) -> dict[str, int]:
        """Size classes of the live prefixes per replica (the split)."""
        out = {rid: 0 for rid, _ in self._replicas}
        for key, rid in self._placed.items():
            out[rid] += self._sizes[key]
        return out

    def _expire(self, now: float) -> None:
        settings = self.settings
        seen = self._seen
        while seen:
            key, at = next(iter(seen.items()))
            if len(seen) <= settings.max_prefixes and now - at <= settings.horizon_s:
                break
            seen.popitem(last=False)
            self._total -= self._sizes.pop(key)
            del self._keys[bisect.bisect_left(self._keys, key)]
            self._orders.pop(key, None)
            self._changed = True

    def _compute(self) -> None:
        # Replicas in a canonical order: the directory may list them in any.
        replicas = sorted(self._replicas)
        ids = [rid for rid, _ in replicas]
        bounds = _shares(replicas, self._total, self.settings.slack)
        self._placed = _partition(self._keys, self._sizes, ids, bounds, self._orders)
        self._changed = False


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

    def forget(self, endpoint_id: str) -> None:
        self._endpoints.pop(endpoint_id, None)
