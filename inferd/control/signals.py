"""A doorbell between parts built one after the other.

The registry notices replica changes and the reconciler acts on them, but
the registry is built first (the reconciler needs it). Instead of a callback
filled in later, both get this object at construction: the registry rings,
the reconciler waits.
"""

from __future__ import annotations

import asyncio
import contextlib


class Wakeup:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ring(self, endpoint_id: str = "") -> None:
        """Something about `endpoint_id` changed: act now, not at the next tick."""
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> None:
        """Until rung, or `timeout` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
