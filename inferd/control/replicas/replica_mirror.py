"""Keeps an instance's registry in step with the replicas in the shared store.

With several instances, a replica reports to whichever instance it reaches
(the one that launched it, else another one or the load balancer), yet every
instance routes to it and the leader watches its liveness. The store is
where they meet:

- `follow()` reads the replicas again on every replica change of the store's
  change feed (and on a resync), and brings them into this registry: new
  ones are added, known ones move forward (the registry's own rules: a
  control-plane verdict such as `draining` or `failed` stands), and ones
  the store no longer holds leave. A replica turning ready here releases
  the requests this instance holds for its endpoint. The leader's
  `unresponsive` mark comes with the row: this instance routes around the
  replica too, and shows it.

What a replica reports to this instance is written by the registry itself
(`Registry.flush`), the one writer of replica rows.

A replica this instance removed itself (the leader reaped it) is not
brought back by a read that still finds its row before the delete lands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Protocol

from inferd.control.model import Change, ChangeKind, ReplicaRecord, StoreUnavailable
from inferd.control.ports import ReplicaHandle
from inferd.control.replicas.registry import Registry, Replica, unresponsive_mark
from inferd.vocab import ReplicaStatus

logger = logging.getLogger(__name__)


class ReplicaSource(Protocol):
    async def list_replicas(self) -> list[ReplicaRecord]: ...

    def changes(self) -> AsyncIterator[Change]: ...


# What tells one write of a replica's row from the next. `updated_at` alone
# does not: two writes in the same millisecond (the leader marking a replica
# unresponsive just after writing its last report) carry the same time, and
# the mark would be taken for the row already seen.
RowVersion = tuple[datetime, str, str | None, str | None, str | None]


def row_version(record: ReplicaRecord) -> RowVersion:
    return (
        record.updated_at,
        record.status,
        record.reason,
        record.url,
        unresponsive_mark(record),
    )


def replica_from_record(record: ReplicaRecord) -> Replica:
    return Replica(
        replica_id=record.id,
        endpoint_id=record.endpoint_id,
        generation=record.generation,
        gpu_type=record.gpu_type,
        gpu_count=record.gpu_count,
        secret_digest=record.secret_hash,
        handle=ReplicaHandle(record.id, record.node, dict(record.placement)),
        status=ReplicaStatus(record.status),
        reason=record.reason,
        url=record.url,
        unresponsive_since_wall=unresponsive_mark(record),
    )


class ReplicaMirror:
    def __init__(self, store: ReplicaSource, registry: Registry) -> None:
        self._store = store
        self._registry = registry
        # Replica id -> the record's version when last read.
        self._seen: dict[str, RowVersion] = {}
        self._reload_lock = asyncio.Lock()

    async def follow(self) -> None:
        """Runs until the feed ends (the store closed); subscribes, then
        reads, so no change is missed in between."""
        feed = self._store.changes()
        await self._reload_until_read()
        async for change in feed:
            if change.kind in (ChangeKind.REPLICA, ChangeKind.RESYNC):
                await self._reload_until_read()

    async def _reload_until_read(self) -> None:
        delay = 0.2
        while True:
            try:
                await self.reload()
                return
            except StoreUnavailable:
                # Meanwhile the registry serves what it had.
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def reload(self) -> None:
        async with self._reload_lock:
            records = await self._store.list_replicas()
            stored = {record.id for record in records}
            for record in records:
                self._merge(record)
            for replica in self._registry.all():
                rid = replica.replica_id
                if rid in self._seen and rid not in stored:
                    self._registry.forget(rid)
            for rid in list(self._seen):
                if rid not in stored:
                    del self._seen[rid]

    def _merge(self, record: ReplicaRecord) -> None:
        before = self._seen.get(record.id)
        version = row_version(record)
        self._seen[record.id] = version
        known = self._registry.get(record.id)
        status = ReplicaStatus(record.status)
        if known is None:
            if before is None and status not in ReplicaStatus.gone():
                self._registry.add(replica_from_record(record))
            return
        self._registry.observe(
            record.id,
            status,
            record.reason,
            record.url,
            newer=before is not None and version != before,
            unresponsive_since=unresponsive_mark(record),
        )
