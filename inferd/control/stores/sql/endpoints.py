"""Endpoints and their tokens (`EndpointStore`, `TokenStore`, and the
quota's reads of a project's endpoints)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inferd.control.accounts.quota import EndpointShape
from inferd.control.model import ChangeKind, DuplicateName, Endpoint, EndpointChanges, EndpointGone
from inferd.control.paging import EndpointFilter, Page, page_of
from inferd.control.stores.sql.database import Repository, Tx, Violation
from inferd.control.stores.sql.tables import ENDPOINTS, TIME

_ACTIVE_TOKENS = (
    "SELECT t.endpoint_id, t.token_hash FROM endpoint_tokens t"
    " JOIN endpoints e ON e.id = t.endpoint_id"
    " WHERE t.revoked_at IS NULL AND e.deleting_at IS NULL"
)
_ADD_TOKEN = "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at) VALUES (?, ?, ?)"


class Endpoints(Repository):
    def _time(self, at: datetime) -> Any:
        return self._dialect.encode(TIME.storage, at)

    def _endpoint(self, row: Any) -> Endpoint:
        return ENDPOINTS.record(self._dialect, row)

    async def insert_endpoint(self, endpoint: Endpoint, token_hash: bytes) -> None:
        def write(tx: Tx) -> None:
            tx.execute(ENDPOINTS.insert, ENDPOINTS.values(self._dialect, endpoint))
            tx.execute(_ADD_TOKEN, (endpoint.id, token_hash, self._time(endpoint.created_at)))
            tx.changed(ChangeKind.ENDPOINT, endpoint.id)
            tx.changed(ChangeKind.TOKEN, endpoint.id)

        try:
            await self._db.write(write)
        except Violation as exc:
            if exc.unique and exc.involves("endpoints", "name"):
                raise DuplicateName(endpoint.name) from None
            raise

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        rows = await self._db.rows(ENDPOINTS.select + " WHERE id = ?", (endpoint_id,))
        return self._endpoint(rows[0]) if rows else None

    async def list_endpoints(self) -> list[Endpoint]:
        order = self._dialect.position("endpoints")
        return [
            self._endpoint(r) for r in await self._db.rows(f"{ENDPOINTS.select} ORDER BY {order}")
        ]

    async def page_endpoint_ids(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[str]:
        if where.selects_nothing():
            return Page([], None)
        position = self._dialect.position("endpoints")
        conditions: list[str] = []
        params: list[Any] = []
        if after is not None:
            conditions.append(f"{position} > ?")
            params.append(after)
        if where.project_ids is not None:
            conditions.append(f"project_id IN ({', '.join('?' for _ in where.project_ids)})")
            params.extend(sorted(where.project_ids))
        for column, value in (
            ("model_name", where.model_name),
            ("location_name", where.location_name),
        ):
            if value is not None:
                conditions.append(f"{column} = ?")
                params.append(value)
        if where.name_prefix is not None:
            condition, values = self._dialect.starts_with("name", where.name_prefix)
            conditions.append(condition)
            params.extend(values)
        query = (
            f"SELECT {position}, id FROM endpoints"
            f"{' WHERE ' + ' AND '.join(conditions) if conditions else ''}"
            f" ORDER BY {position} LIMIT ?"
        )
        rows = await self._db.rows(query, (*params, limit + 1))
        return page_of([(int(r[0]), str(r[1])) for r in rows], limit)

    async def count_endpoints(self, project_id: str) -> int:
        rows = await self._db.rows(
            "SELECT count(*) FROM endpoints WHERE project_id = ?", (project_id,)
        )
        return int(rows[0][0])

    async def quota_shapes(self, project_id: str) -> list[EndpointShape]:
        rows = await self._db.rows(
            "SELECT id, gpu_type, gpu_count, min_replicas FROM endpoints"
            " WHERE project_id = ? AND deleting_at IS NULL",
            (project_id,),
        )
        return [EndpointShape(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    async def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> Endpoint:
        values = {**changes.settings(), "updated_at": changes.updated_at}
        assignments = ", ".join(f"{column} = ?" for column in values)
        params = [ENDPOINTS.encode(self._dialect, c, v) for c, v in values.items()]
        return await self._returning(
            f"UPDATE endpoints SET {assignments} WHERE id = ?", (*params, endpoint_id),
            endpoint_id, ChangeKind.ENDPOINT,
        )  # fmt: skip

    async def mark_deleting(self, endpoint_id: str, at: datetime) -> Endpoint:
        return await self._returning(
            "UPDATE endpoints SET deleting_at = COALESCE(deleting_at, ?), updated_at = ?"
            " WHERE id = ?",
            (self._time(at), self._time(at), endpoint_id),
            endpoint_id, ChangeKind.ENDPOINT, ChangeKind.TOKEN,
        )  # fmt: skip

    async def _returning(
        self, statement: str, params: tuple[Any, ...], endpoint_id: str, *kinds: ChangeKind
    ) -> Endpoint:
        def write(tx: Tx) -> Endpoint:
            row = tx.one(f"{statement} RETURNING {ENDPOINTS.names}", params)
            if row is None:
                raise EndpointGone(endpoint_id)
            for kind in kinds:
                tx.changed(kind, endpoint_id)
            return self._endpoint(row)

        return await self._db.write(write)

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        def write(tx: Tx) -> bool:
            replicas = tx.all("SELECT id FROM replicas WHERE endpoint_id = ?", (endpoint_id,))
            # Tokens, replicas and adapters go by cascade.
            if tx.count("DELETE FROM endpoints WHERE id = ?", (endpoint_id,)) == 0:
                return False
            for (replica_id,) in replicas:
                tx.changed(ChangeKind.REPLICA, replica_id)
            tx.changed(ChangeKind.ENDPOINT, endpoint_id)
            tx.changed(ChangeKind.TOKEN, endpoint_id)
            return True

        return await self._db.write(write)

    # --- tokens ----------------------------------------------------------------------------

    async def replace_token(self, endpoint_id: str, token_hash: bytes, at: datetime) -> None:
        def write(tx: Tx) -> None:
            exists = tx.one(
                "SELECT 1 FROM endpoints WHERE id = ? AND deleting_at IS NULL"
                + self._dialect.for_update,
                (endpoint_id,),
            )
            if exists is None:
                raise EndpointGone(endpoint_id)
            tx.execute(
                "UPDATE endpoint_tokens SET revoked_at = ?"
                " WHERE endpoint_id = ? AND revoked_at IS NULL",
                (self._time(at), endpoint_id),
            )
            tx.execute(_ADD_TOKEN, (endpoint_id, token_hash, self._time(at)))
            tx.changed(ChangeKind.TOKEN, endpoint_id)

        await self._db.write(write)

    async def active_token_hashes(self) -> dict[str, bytes]:
        return {r[0]: bytes(r[1]) for r in await self._db.rows(_ACTIVE_TOKENS)}

    async def active_token_hash(self, endpoint_id: str) -> bytes | None:
        rows = await self._db.rows(_ACTIVE_TOKENS + " AND t.endpoint_id = ?", (endpoint_id,))
        return bytes(rows[0][1]) if rows else None
