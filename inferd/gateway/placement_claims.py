"""Gateway instances agreeing on prefix placements through the replicas.

Each instance places prompt prefixes by what it has seen itself
(`inferd.gateway.placement`). A request sent to its prefix's placed replica
carries the prefix key (`PLACED_HEADER`); every replica lists the keys placed
on it with when each was first and last placed there
(`inferd.replica.placed_prefixes`). Every `period` seconds, each instance
reads the lists of the ready replicas of every endpoint it places prefixes
for and hands them to the endpoint's placement (`PrefixPlacement.adopt`).

No round trip per request, and nothing in the store: the lists are small
(keys of live prefixes) and a replica that does not answer is skipped for
that round (its placements stand as they were).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence

from inferd.api.replica import PLACED_HEADER, PLACED_PREFIXES_PATH
from inferd.gateway.directory import RoutableReplica
from inferd.gateway.placement import Claim, Placements
from inferd.gateway.proxy import with_call_key
from inferd.gateway.upstream import Upstream

logger = logging.getLogger(__name__)

PLACED = PLACED_HEADER.encode()
POLL_PERIOD_S = 1.0
_FETCH_TIMEOUT_S = 2.0

_MAX_LISTING_BYTES = 1 << 20
# (key, first placed, last placed) as one replica lists them.
Listing = Sequence[tuple[int, float, float]]


def merge(listings: dict[str, Listing]) -> dict[int, Claim]:
    """Replica id -> its listing, to key -> `Claim`: the replica each key was
    placed on first and the one it was placed on last (ties: the smaller id,
    so that every gateway merging the same listings gets the same claims)."""
    first: dict[int, tuple[float, str]] = {}
    last: dict[int, tuple[float, str]] = {}
    for rid, listing in listings.items():
        for key, first_at, last_at in listing:
            seen = first.get(key)
            if seen is None or (first_at, rid) < seen:
                first[key] = (first_at, rid)
            seen = last.get(key)
            if seen is None or (-last_at, rid) < (-seen[0], seen[1]):
                last[key] = (last_at, rid)
    return {key: Claim(first[key][1], last[key][1]) for key in first}


class ClaimsPoller:
    def __init__(
        self,
        placements: Placements,
        ready_replicas: Callable[[str], Sequence[RoutableReplica]],
        clock: Callable[[], float],
        upstream: Upstream,
        period: float = POLL_PERIOD_S,
    ) -> None:
        """`upstream`: the gateway's connections to the replicas."""
        self._placements = placements
        self._ready = ready_replicas
        self._clock = clock
        self._upstream = upstream
        self._period = period
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def poll(self) -> None:
        """One round: every endpoint with live placements, its ready replicas."""
        for endpoint_id, placement in self._placements.endpoints().items():
            if not len(placement):
                continue
            replicas = list(self._ready(endpoint_id))
            if len(replicas) < 2:
                continue  # nothing to agree on
            got = await asyncio.gather(*(self._fetch(r) for r in replicas))
            listings = {r.replica_id: g for r, g in zip(replicas, got, strict=True) if g}
            placement.adopt(merge(listings), self._clock())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            try:
                await self.poll()
            except Exception:  # the next round tries again
                logger.warning("could not read the replicas' placed prefixes", exc_info=True)

    async def _fetch(self, replica: RoutableReplica) -> Listing | None:
        """The replica's listing; None from one that does not answer in time
        or is of a version without it."""
        try:
            return await asyncio.wait_for(self._read(replica), _FETCH_TIMEOUT_S)
        except Exception:  # TimeoutError included
            return None

    async def _read(self, replica: RoutableReplica) -> Listing | None:
        response = await self._upstream.send(
            replica.url, "GET", PLACED_PREFIXES_PATH, with_call_key([], replica.call_key), b""
        )
        try:
            if response.status != 200:
                return None
            chunks, size = [], 0
            while chunk := await response.next_chunk():
                size += len(chunk)
                if size > _MAX_LISTING_BYTES:
                    return None
                chunks.append(chunk)
        finally:
            response.close()
        listed = json.loads(b"".join(chunks))["prefixes"]
        return [(int(key), float(first), float(last)) for key, first, last in listed]
