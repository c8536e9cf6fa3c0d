"""A doorbell between parts built one after the other, that says what changed.

The registry notices replica changes and the reconciler acts on them, but
the registry is built first (the reconciler needs it). Instead of a callback
filled in later, both get this object at construction: the registry rings,
the reconciler waits. A ring names the endpoint that changed; the
reconciler takes the set rung since its last look and reconciles those
(a per-endpoint work queue, as Kubernetes controllers keep), not every
endpoint on every ring.
"""

from __future__ import annotations

import asyncio

from inferd.aio import wait_event


class Wakeup:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._changed: set[str] = set()
        self._everything = False

    def ring(self, endpoint_id: str = "") -> None:
        """Something about `endpoint_id` changed (no id: about everything):
        act now, not at the next tick."""
        if endpoint_id:
            self._changed.add(endpoint_id)
        else:
            self._everything = True
        self._event.set()

    def take(self) -> tuple[set[str], bool]:
        """What was rung since the last `take`: the endpoint ids, and
        whether everything should be looked at."""
        changed, self._changed = self._changed, set()
        everything, self._everything = self._everything, False
        self._event.clear()
        return changed, everything

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> None:
        """Until rung, or `timeout` seconds."""
        await wait_event(self._event, timeout)
