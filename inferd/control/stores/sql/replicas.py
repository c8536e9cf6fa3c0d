"""Replicas (`ReplicaStore`): written by the leader only, each write fenced
with its term in the write's own transaction (the dialect's `fence`), so a
deposed leader's late write changes nothing."""

from __future__ import annotations

from datetime import datetime

from inferd.control.model import ChangeKind, EndpointGone, ReplicaRecord
from inferd.control.stores.sql.database import Repository, Tx, Violation
from inferd.control.stores.sql.tables import REPLICAS, TIME


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
        self,
        replica_id: str,
        *,
        status: str,
        reason: str | None,
        url: str | None,
        at: datetime,
        unresponsive_since: datetime | None = None,
        term: int | None = None,
    ) -> None:
        encode = self._dialect.encode
        marked = None if unresponsive_since is None else encode(TIME.storage, unresponsive_since)
        params = (status, reason, url, marked, encode(TIME.storage, at), replica_id)
        await self._replica_write(
            "UPDATE replicas SET status = ?, reason = ?, url = ?, unresponsive_since = ?,"
            " updated_at = ? WHERE id = ?",
            params, replica_id, term,
        )  # fmt: skip

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        await self._replica_write(
            "DELETE FROM replicas WHERE id = ?", (replica_id,), replica_id, term
        )

    async def _replica_write(
        self, statement: str, params: tuple[object, ...], replica_id: str, term: int | None
    ) -> None:
        """No-op if the replica is not stored."""

        def write(tx: Tx) -> None:
            tx.fence(term)
            if tx.count(statement, params):
                tx.changed(ChangeKind.REPLICA, replica_id)

        await self._db.write(write)

    async def confirm_term(self, term: int) -> None:
        await self._db.read(lambda tx: tx.fence(term))

    async def list_replicas(self) -> list[ReplicaRecord]:
        order = self._dialect.position("replicas")
        rows = await self._db.rows(f"{REPLICAS.select} ORDER BY {order}")
        return [REPLICAS.record(self._dialect, r) for r in rows]
