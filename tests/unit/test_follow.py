"""Following a change feed ends cleanly when this process closes its store,
and keeps retrying while the database is only away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind, StoreClosed, StoreUnavailable
from inferd.control.stores.memory import MemoryStore


async def feed_of(*changes: Change) -> AsyncIterator[Change]:
    for change in changes:
        yield change


def test_a_closed_store_ends_the_follower_instead_of_a_retry_loop() -> None:
    reloads = 0

    async def apply(change: Change) -> None:
        raise StoreClosed

    async def reload() -> None:
        nonlocal reloads
        reloads += 1

    change = Change(ChangeKind.TOKEN, "e1")
    asyncio.run(asyncio.wait_for(follow(feed_of(change, change), apply, reload, what="t"), 5))
    assert reloads == 0


def test_an_unavailable_store_is_reloaded_until_it_answers() -> None:
    attempts = 0

    async def apply(change: Change) -> None:
        raise StoreUnavailable("away")

    async def reload() -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise StoreUnavailable("still away")

    change = Change(ChangeKind.TOKEN, "e1")
    asyncio.run(follow(feed_of(change), apply, reload, what="t", retry_s=0.001))
    assert attempts == 3


def test_reading_a_closed_store_says_so() -> None:
    async def body() -> None:
        store = MemoryStore()
        await store.list_endpoints()
        await store.close()
        try:
            await store.list_endpoints()
        except StoreClosed:
            return
        raise AssertionError("a closed store answered")

    asyncio.run(body())
