"""`wait_event`: an event wait with a timeout that a cancellation always ends."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from inferd.aio import wait_event


async def cancelled_as_the_event_is_set(wait: Callable[[asyncio.Event], Awaitable[object]]) -> str:
    """A loop waiting on an event, cancelled in every loop iteration between
    the event being set and its waiter noticing: how the loop ended."""
    event = asyncio.Event()

    async def loop_until_cancelled() -> None:
        while True:
            await wait(event)
            event.clear()

    for spins in range(0, 6):
        task = asyncio.ensure_future(loop_until_cancelled())
        await asyncio.sleep(0)
        event.set()
        for _ in range(spins):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait((task,), timeout=0.5)
        if not done:
            task.cancel()  # a second cancel ends what the first could not
            await asyncio.wait((task,), timeout=0.5)
            return f"outlived its cancel (set {spins} iterations before it)"
        assert task.cancelled()
    return "cancelled"


def test_a_cancel_as_the_event_is_set_ends_the_wait() -> None:
    ended = asyncio.run(cancelled_as_the_event_is_set(lambda e: wait_event(e, 10)))
    assert ended == "cancelled"


def test_the_race_is_real_with_wait_for_before_python_3_12() -> None:
    """The reason for `wait_event`: Python 3.11's `wait_for` swallows it
    (3.12 rewrote `wait_for` on `asyncio.timeout`)."""
    ended = asyncio.run(cancelled_as_the_event_is_set(lambda e: asyncio.wait_for(e.wait(), 10)))
    if sys.version_info < (3, 12):
        assert ended.startswith("outlived its cancel"), ended
    else:
        assert ended == "cancelled"


@pytest.mark.parametrize(("set_first", "expected"), [(True, True), (False, False)])
def test_it_says_whether_the_event_was_set(set_first: bool, expected: bool) -> None:
    async def scenario() -> bool:
        event = asyncio.Event()
        if set_first:
            asyncio.get_running_loop().call_later(0.01, event.set)
        return await wait_event(event, 0.2)

    assert asyncio.run(scenario()) is expected
