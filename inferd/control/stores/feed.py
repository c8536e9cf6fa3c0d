"""Fan-out of store changes to subscribers, from any thread to any event loop.

A store publishes each change it learns of (its own commits, or another
writer's seen through the database) to every subscription; a subscriber
iterates its own with `async for`. Publishing never blocks: a subscriber
that falls far behind gets its backlog replaced by one `RESYNC`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator

from inferd.control.model import Change, ChangeKind

MAX_BACKLOG = 10_000


class Subscription(AsyncIterator[Change]):
    def __init__(self, hub: ChangeHub) -> None:
        self._hub = hub
        self._lock = threading.Lock()
        self._items: deque[Change] = deque()
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def push(self, change: Change) -> None:
        with self._lock:
            if self._closed:
                return
            if len(self._items) >= MAX_BACKLOG:
                self._items.clear()
                change = Change(ChangeKind.RESYNC)
            self._items.append(change)
            self._wake_locked()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake_locked()

    def _wake_locked(self) -> None:
        waiter, loop = self._waiter, self._loop
        if waiter is None or loop is None:
            return
        self._waiter = None
        # RuntimeError: that loop is closed, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, waiter)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Change:
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                if self._closed:
                    raise StopAsyncIteration
                self._loop = asyncio.get_running_loop()
                waiter = self._loop.create_future()
                self._waiter = waiter
            try:
                await waiter
            except asyncio.CancelledError:
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None
                raise

    async def aclose(self) -> None:
        self._hub.unsubscribe(self)
        self.close()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ChangeHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription] = []
        self._closed = False

    def subscribe(self) -> Subscription:
        subscription = Subscription(self)
        with self._lock:
            if self._closed:
                subscription.close()
            else:
                self._subscriptions.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    @property
    def subscribed(self) -> bool:
        return bool(self._subscriptions)

    def publish(self, change: Change) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.push(change)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.close()
