"""Which prompt prefixes gateways placed on this replica, for the gateways.

Every gateway instance places a new prompt prefix on a replica by what it
has seen itself (`inferd.gateway.placement`); two instances behind one load
balancer see conversations in different orders and can place the same
prefix on two replicas, caching it twice. The replica is where their
placements meet: the gateway marks a request sent to the prefix's placed
replica with the prefix key (`PLACED_HEADER`), and the replica lists each
key with when it was first and last placed here, which every gateway polls
(`inferd.gateway.placement_claims`) to follow the placement made first.

A plain ASGI middleware, inside the call-key check: the header is read in
the scan of the request headers; nothing is buffered.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from inferd.api.replica import PLACED_HEADER, PLACED_PREFIXES_PATH

_HEADER = PLACED_HEADER.encode()


class PlacedPrefixes:
    """Key -> (first placed, last placed) in wall-clock seconds, bounded:
    the least recently placed keys leave first, and keys not placed for
    `horizon_s`."""

    def __init__(
        self,
        max_entries: int = 1024,
        horizon_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_entries = max_entries
        self.horizon_s = horizon_s
        self.clock = clock
        self._keys: OrderedDict[int, tuple[float, float]] = OrderedDict()

    def note(self, key: int) -> None:
        now = self.clock()
        keys = self._keys
        seen = keys.pop(key, None)
        keys[key] = (seen[0] if seen else now, now)
        while len(keys) > self.max_entries:
            keys.popitem(last=False)

    def listing(self) -> list[tuple[int, float, float]]:
        """(key, first placed, last placed), least recently placed first."""
        keys = self._keys
        oldest = self.clock() - self.horizon_s
        while keys:
            key, (_, last) = next(iter(keys.items()))
            if last >= oldest:
                break
            del keys[key]
        return [(key, first, last) for key, (first, last) in keys.items()]


class PlacedPrefixesApp:
    def __init__(self, app: ASGIApp, placed: PlacedPrefixes) -> None:
        self._app = app
        self.placed = placed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["path"] == PLACED_PREFIXES_PATH and scope["method"] == "GET":
                await self._list(send)
                return
            for name, value in scope["headers"]:
                if name == _HEADER:
                    # Only the gateway sets it; a bad value is ignored.
                    with contextlib.suppress(ValueError):
                        self.placed.note(int(value))
                    break
        await self._app(scope, receive, send)

    async def _list(self, send: Send) -> None:
        body = json.dumps({"prefixes": self.placed.listing()}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
