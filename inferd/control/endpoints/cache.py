"""This instance's copy of the endpoints, and their rendered records.

Reads are the hot path and are served from memory: the copy is loaded from
the store at start (`load`), written through by the endpoint service on every
change it makes (under `lock`, after the commit), and kept fresh from the
store's change feed (`follow`, under the same lock) so that another instance's
writes to the same database are seen too.

Built before the services that read it (the model service refuses to delete
a model in use; the endpoint service writes through it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from typing import Protocol

from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind, Endpoint


class EndpointSource(Protocol):
    async def list_endpoints(self) -> list[Endpoint]: ...

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None: ...


class EndpointCache:
    def __init__(self, store: EndpointSource) -> None:
        self._store = store
        self._rows: dict[str, Endpoint] = {}
        # Names are unique within a project: (project, name) -> id.
        self._names: dict[tuple[str, str], str] = {}
        # Rendered JSON of each record, with the key of everything it was
        # computed from (see `rendered`). Reads are far more frequent than
        # changes, and a list renders a thousand records; a hit costs a tuple
        # comparison.
        self._rendered: dict[str, tuple[Hashable, bytes]] = {}
        # Held by every write to the copy: the service's (check, commit,
        # write through, with no interleaving) and the feed's.
        self.lock = asyncio.Lock()

    async def load(self) -> None:
        """(Re)load every endpoint from the store."""
        async with self.lock:
            endpoints = await self._store.list_endpoints()
            # Keep the objects that did not change: rendered records are keyed
            # by their identity.
            fresh: dict[str, Endpoint] = {}
            for endpoint in endpoints:
                old = self._rows.get(endpoint.id)
                fresh[endpoint.id] = old if old is not None and old == endpoint else endpoint
            self._rows = fresh
            self._names = {(e.project_id, e.name): e.id for e in self._rows.values()}
            for endpoint_id in [i for i in self._rendered if i not in self._rows]:
                del self._rendered[endpoint_id]

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Apply other writers' changes from `feed` (subscribed before `load`)."""
        await follow(feed, self._apply, self.load, what="endpoint cache")

    async def refresh(self, endpoint_id: str) -> None:
        """Read this one endpoint from the store now, as its next change from
        the feed would."""
        await self._apply(Change(ChangeKind.ENDPOINT, endpoint_id))

    async def _apply(self, change: Change) -> None:
        if change.kind is not ChangeKind.ENDPOINT:
            return
        async with self.lock:
            stored = await self._store.get_endpoint(change.id)
            if stored == self._rows.get(change.id):
                return
            if stored is None:
                self.drop(change.id)
            else:
                self.put(stored)

    # --- reads ---------------------------------------------------------------------

    def rows(self) -> list[Endpoint]:
        """Every endpoint, oldest first."""
        return list(self._rows.values())

    def endpoint_ids(self) -> list[str]:
        return list(self._rows)

    def find(self, endpoint_id: str) -> Endpoint | None:
        return self._rows.get(endpoint_id)

    def find_by_name(self, project_id: str, name: str) -> Endpoint | None:
        endpoint_id = self._names.get((project_id, name))
        return None if endpoint_id is None else self._rows.get(endpoint_id)

    def __len__(self) -> int:
        return len(self._rows)

    # --- writes (under `lock`) -----------------------------------------------------------

    def put(self, row: Endpoint) -> None:
        """Add or replace a row (a new one goes last, as it is newest)."""
        current = self._rows.get(row.id)
        if current is not None and self._names.get((current.project_id, current.name)) == row.id:
            del self._names[(current.project_id, current.name)]
        self._rows[row.id] = row
        self._names[(row.project_id, row.name)] = row.id

    def drop(self, endpoint_id: str) -> None:
        row = self._rows.pop(endpoint_id, None)
        self._rendered.pop(endpoint_id, None)
        if row is not None and self._names.get((row.project_id, row.name)) == endpoint_id:
            del self._names[(row.project_id, row.name)]

    # --- rendered records ----------------------------------------------------------------

    def rendered(self, endpoint_id: str, key: Hashable) -> bytes | None:
        """The record rendered for `key` (everything it is computed from),
        or None when it changed since."""
        cached = self._rendered.get(endpoint_id)
        return cached[1] if cached is not None and cached[0] == key else None

    def keep_rendered(self, endpoint_id: str, key: Hashable, data: bytes) -> None:
        if endpoint_id in self._rows:
            self._rendered[endpoint_id] = (key, data)
