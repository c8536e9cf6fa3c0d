"""Who gives way when an endpoint's hold queue is full: a fair share of it.

The hold queue is bounded (requests per endpoint, bytes per endpoint and per
instance: `GatewaySettings`). Refusing whoever arrives once it is full would
let one client's flood shut every other client out. Instead the queue is
shared as a buffer is in fair queuing ("longest queue drop", Demers, Keshav
and Shenker, SIGCOMM 1989), weighted as the release is
(`inferd.gateway.fairness`):

- A client's *use* of the queue is its dominant share of the bounds: the
  larger of its held requests over the count bound and its held bytes over
  the byte bound, divided by its weight.
- When a request arrives at a full queue, the client using the most (by
  that measure) gives way, if it uses strictly more than the arriving
  client would with its request admitted: its newest held request is
  refused (429 with Retry-After, never dropped unanswered) and the next
  heaviest is asked again, until there is room.
- Otherwise the arriving request is refused: its client already holds at
  least as large a share as anyone it could displace.

A client alone may fill the whole queue (nobody else wants it); a second
client always finds room up to the share it is owed, taken from whoever is
over theirs. Requests are only displaced from clients using more than the
newcomer would, so two clients cannot displace each other back and forth:
each eviction leaves the heaviest client's use no larger than before. Who
waits longest keeps their place: the newest held request of a client goes
first. The bounds themselves never move.

Pure: `make_room` computes what to refuse; the hold queue
(`inferd.gateway.hold`) answers those requests and admits the newcomer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ClientHold:
    """One client's held requests, as the admission policy sees them."""

    weight: float
    # The bytes each held request counts, oldest first.
    costs: Sequence[int]
    # Their sum (kept by the caller, so that it is not added up again).
    bytes: int


@dataclass(frozen=True)
class Bounds:
    """The queue's bounds and what is free of them now (`None`: unbounded).
    `free_bytes` is the smaller of what the endpoint's and the instance's
    byte bounds leave; `max_bytes` the bound a client's bytes are measured
    against."""

    max_count: int
    free_count: int
    max_bytes: int | None = None
    free_bytes: int | None = None


@dataclass(frozen=True)
class Room:
    """The answer: `evict` (client -> how many of its newest held requests
    to refuse) when the newcomer is admitted, or None when it is refused;
    `over_share`: refused because its client holds at least as large a
    share as anyone it could displace (rather than because the queue cannot
    hold it at all)."""

    evict: Mapping[str, int] | None
    over_share: bool = False

    @property
    def admitted(self) -> bool:
        return self.evict is not None


def use(count: int, held_bytes: int, weight: float, bounds: Bounds) -> float:
    """A client's weighted dominant share of the queue's bounds."""
    shares = [count / bounds.max_count if bounds.max_count > 0 else float("inf")]
    if bounds.max_bytes is not None:
        shares.append(held_bytes / bounds.max_bytes if bounds.max_bytes > 0 else float("inf"))
    return max(shares) / weight


def make_room(
    clients: Mapping[str, ClientHold],
    arriving: str,
    weight: float,
    cost: int,
    bounds: Bounds,
) -> Room:
    """Room for one request of `arriving` (its client's weight, its `cost`
    in bytes) in a queue holding `clients`' requests: nothing to evict when
    it fits, else whose newest requests to refuse for it, or a refusal."""
    need_count = 1 - bounds.free_count
    need_bytes = 0 if bounds.free_bytes is None else cost - bounds.free_bytes
    if need_count <= 0 and need_bytes <= 0:
        return Room({})
    mine = clients.get(arriving)
    count = (len(mine.costs) if mine else 0) + 1
    held_bytes = (mine.bytes if mine else 0) + cost
    if count > bounds.max_count or (bounds.max_bytes is not None and cost > bounds.max_bytes):
        return Room(None)  # it cannot be held however the others give way
    my_use = use(count, held_bytes, weight, bounds)
    left = {
        name: [len(c.costs), c.bytes] for name, c in clients.items() if name != arriving and c.costs
    }
    evict: dict[str, int] = {}
    while need_count > 0 or need_bytes > 0:
        heaviest = max(
            (name for name, (n, _) in left.items() if n > 0),
            key=lambda name: use(left[name][0], left[name][1], clients[name].weight, bounds),
            default=None,
        )
        if heaviest is None:
            return Room(None)  # nobody else left to give way
        n, b = left[heaviest]
        if use(n, b, clients[heaviest].weight, bounds) <= my_use:
            return Room(None, over_share=True)
        costs = clients[heaviest].costs
        taken = evict.get(heaviest, 0)
        freed = costs[len(costs) - 1 - taken]
        evict[heaviest] = taken + 1
        left[heaviest] = [n - 1, b - freed]
        need_count -= 1
        need_bytes -= freed
    return Room(evict)
