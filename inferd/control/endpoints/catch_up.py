"""Reading one endpoint from the store when a request names one this
instance has not heard of yet.

Each instance keeps endpoints and their tokens in memory, fresh from the
store's change feed. A client that creates an endpoint through one instance
and calls it at once through another (behind a load balancer) can arrive
before the feed has told the second one: without this it would be refused
with a 401 (or a 404) for an endpoint that exists. So a request whose token
or endpoint the copy does not know reads that one endpoint's rows once
before it is answered.

Unknown ids must not become a way to load the database: reads for one id
are shared by every request waiting on it, and at most `max_reads` ids are
read at a time; beyond that a request is answered from memory as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from inferd.control.model import StoreClosed, StoreUnavailable

logger = logging.getLogger(__name__)

# Far above any id inferd makes; longer ones are not worth a read.
_MAX_ID_CHARS = 64


class Refreshable(Protocol):
    async def refresh(self, endpoint_id: str) -> None:
        """Read this endpoint's rows from the store now."""
        ...


class EndpointCatchUp:
    def __init__(self, copies: Sequence[Refreshable], *, max_reads: int = 4) -> None:
        """`copies`: what the gateway reads of an endpoint (its tokens, its
        record), refreshed in this order."""
        self._copies = copies
        self._max_reads = max_reads
        self._reading: dict[str, asyncio.Future[None]] = {}
        self.reads = 0  # store reads made, for tests and curiosity

    async def __call__(self, endpoint_id: str) -> None:
        """Bring this endpoint's token and record up to the store's; returns
        at once when too many reads are under way already."""
        if not endpoint_id or len(endpoint_id) > _MAX_ID_CHARS:
            return
        pending = self._reading.get(endpoint_id)
        if pending is None:
            if len(self._reading) >= self._max_reads:
                return
            pending = asyncio.ensure_future(self._read(endpoint_id))
            self._reading[endpoint_id] = pending
            pending.add_done_callback(lambda _: self._reading.pop(endpoint_id, None))
        # Shielded: one waiter's cancellation (its client left) must not
        # cancel the read the others wait on.
        await asyncio.shield(pending)

    async def _read(self, endpoint_id: str) -> None:
        self.reads += 1
        try:
            for copy in self._copies:
                await copy.refresh(endpoint_id)
        except (StoreUnavailable, StoreClosed) as exc:
            # Answered from memory, as without a read; the feed catches up.
            logger.debug("catch-up read of endpoint %s failed: %s", endpoint_id, exc)
