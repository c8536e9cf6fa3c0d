"""asyncio helpers the control plane, the gateway and the replica share."""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Until `event` is set (True) or `timeout` seconds passed (False).

    Not `asyncio.wait_for(event.wait(), timeout)`: on Python 3.11 that
    returns normally, swallowing the cancellation, when its task is cancelled
    just as the event is set (the inner wait done, its callback not yet run).
    A loop that waits that way then outlives `task.cancel()`, and whoever
    awaits the task after cancelling it waits forever (an app's shutdown hung
    until a test's 600 s timeout). `asyncio.wait` never swallows it."""
    if event.is_set():
        return True
    waiting = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait((waiting,), timeout=timeout)
    finally:
        waiting.cancel()
    return bool(done)
