"""The reconciler's copy of the endpoints, kept fresh from the store's change
feed: it reads memory on every pass instead of the whole table, and each
endpoint that changes (through any instance) rings the reconciler with its
id, so that only that endpoint is looked at."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind, Endpoint


class EndpointSource(Protocol):
    async def list_endpoints(self) -> list[Endpoint]: ...

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None: ...


class FollowedEndpoints:
    def __init__(self, store: EndpointSource, on_change: Callable[[str], None]) -> None:
        """`on_change`: called with the id of each endpoint that changed, and
        with "" after a reload (anything may have changed)."""
        self._store = store
        self._on_change = on_change
        self._rows: dict[str, Endpoint] = {}

    async def __call__(self) -> Sequence[Endpoint]:
        """Every endpoint, oldest first (as `list_endpoints`)."""
        return list(self._rows.values())

    async def load(self) -> None:
        self._rows = {row.id: row for row in await self._store.list_endpoints()}
        self._on_change("")

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Apply the changes from `feed` (subscribed before `load`)."""
        await follow(feed, self._apply, self.load, what="reconciler's endpoints")

    async def _apply(self, change: Change) -> None:
        if change.kind is not ChangeKind.ENDPOINT:
            return
        stored = await self._store.get_endpoint(change.id)
        if stored == self._rows.get(change.id):
            return
        if stored is None:
            self._rows.pop(change.id, None)
        else:
            self._rows[stored.id] = stored  # a new one goes last, as it is newest
        self._on_change(change.id)
