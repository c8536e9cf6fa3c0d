"""Keeping an in-memory copy fresh from a store's change feed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from inferd.control.model import Change, ChangeKind, StoreClosed, StoreUnavailable

logger = logging.getLogger(__name__)

MAX_RETRY_S = 5.0


async def follow(
    feed: AsyncIterator[Change],
    apply: Callable[[Change], Awaitable[None]],
    reload: Callable[[], Awaitable[None]],
    *,
    what: str,
    retry_s: float = 0.5,
) -> None:
    """Apply each change from `feed`; on `RESYNC`, or when applying fails
    because the database is away, `reload` everything, retrying until the
    database answers (meanwhile the copy serves what it had). Returns when
    the feed ends or the store is closed under it (shutting down)."""
    async for change in feed:
        if change.kind is not ChangeKind.RESYNC:
            try:
                await apply(change)
                continue
            except StoreClosed:
                return
            except StoreUnavailable as exc:
                logger.warning("%s: cannot read a change (%s); reloading", what, exc.detail)
        delay = retry_s
        while True:
            try:
                await reload()
                break
            except StoreClosed:
                return
            except StoreUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_S)
