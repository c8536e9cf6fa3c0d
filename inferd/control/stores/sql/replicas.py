"""Replicas (`ReplicaStore`): written by the leader only, each write fenced
with its term in the write's own transaction (the dialect's `fence`), so a
deposed leader's late write changes nothing."""

from __future__ import annotations

from datetime import datetime

from inferd.control.model import ChangeKind, EndpointGone, ReplicaRecord
from inferd.control.stores.sql.database import Tx, Violation
from inferd.control.stores.sql.repository import Repository
from inferd.control.stores.sql.tables import REPLICAS


class Replicas(Repository):
    async def insert_replica(self, record: ReplicaRecord, *, term: int | None = None) -> None:
        def write(tx: Tx) -> None:
            tx.fence(term)
            tx.execute(REPLICAS.insert, REPLICAS.values(self._dialect, record))
            tx.changed(ChangeKind.REPLICA, record.id)

        try:
            await self._db.write(write)
        except Violation as exc:
            if not exc.unique:  # its endpoint is gone
                raise EndpointGone(record.endpoint_id) from None
            raise

    async def update_replica(
        self, replica_id: str, *, status: str, reason: str | None, url: str | None, at: datetime,
        unresponsive_since: datetime | None = None, term: int | None = None,
    ) -> None:  # fmt: skip
        """No-op if the replica is not stored (as `delete_replica`)."""
        await self._change(
            "UPDATE replicas SET status = ?, reason = ?, url = ?, unresponsive_since = ?,"
            " updated_at = ? WHERE id = ?",
            (status, reason, url, self._time(unresponsive_since), self._time(at), replica_id),
            ChangeKind.REPLICA, replica_id, term=term,
        )  # fmt: skip

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        await self._delete(
            REPLICAS, replica_id, kind=ChangeKind.REPLICA, change=replica_id, term=term
        )

    async def confirm_term(self, term: int) -> None:
        await self._db.read(lambda tx: tx.fence(term))

    async def list_replicas(self) -> list[ReplicaRecord]:
        return await self._find(REPLICAS)
