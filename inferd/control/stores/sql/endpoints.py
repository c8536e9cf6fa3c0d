"""Endpoints and their tokens (`EndpointStore`, `TokenStore`, the quota's
reads of a project's endpoints), and their named client tokens
(`ClientTokenStore`): digests only. Every client token write says
`ChangeKind.TOKEN` for the endpoint, as a re-issued owner token does, so
each instance's token cache re-reads that endpoint's tokens and a revoked
one stops working everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from inferd.control.accounts.quota import EndpointShape
from inferd.control.model import (
    ChangeKind,
    ClientToken,
    DuplicateClientToken,
    DuplicateName,
    Endpoint,
    EndpointChanges,
    EndpointGone,
    TooManyClientTokens,
)
from inferd.control.paging import EndpointFilter, Page, page_of
from inferd.control.stores.sql.database import Tx, Violation
from inferd.control.stores.sql.repository import Repository, Where
from inferd.control.stores.sql.tables import CLIENT_TOKENS, ENDPOINTS

_ACTIVE_TOKENS = (
    "SELECT t.endpoint_id, t.token_hash FROM endpoint_tokens t"
    " JOIN endpoints e ON e.id = t.endpoint_id"
    " WHERE t.revoked_at IS NULL AND e.deleting_at IS NULL"
)
_OF_LIVE_ENDPOINT = "endpoint_id IN (SELECT id FROM endpoints WHERE deleting_at IS NULL)"
_ADD_TOKEN = "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at) VALUES (?, ?, ?)"


class Endpoints(Repository):
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
        return await self._get(ENDPOINTS, endpoint_id)

    async def list_endpoints(self) -> list[Endpoint]:
        return await self._find(ENDPOINTS)

    async def page_endpoint_ids(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[str]:
        if where.selects_nothing():
            return Page([], None)
        position = self._dialect.position("endpoints")
        query = Where(f"{position} > ?", after).add("model_name = ?", where.model_name)
        query.add("location_name = ?", where.location_name)
        if where.project_ids is not None:
            query.among("project_id", sorted(where.project_ids))
        if where.name_prefix is not None:
            condition, values = self._dialect.starts_with("name", where.name_prefix)
            query.add(condition, *values)
        text = f"SELECT {position}, id FROM endpoints{query} ORDER BY {position} LIMIT ?"
        rows = await self._db.rows(text, (*query.params, limit + 1))
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
            return ENDPOINTS.record(self._dialect, row)

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
            self._live_endpoint(tx, endpoint_id, exclusive=True)
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


class ClientTokens(Repository):
    async def add_client_token(self, token: ClientToken, *, limit: int) -> None:
        def check(tx: Tx) -> None:
            self._live_endpoint(tx, token.endpoint_id, exclusive=True)
            count = tx.one(
                "SELECT count(*) FROM endpoint_client_tokens WHERE endpoint_id = ?",
                (token.endpoint_id,),
            )
            if count is not None and int(count[0]) >= limit:
                raise TooManyClientTokens(token.endpoint_id)

        # The key (endpoint, name); a digest collision of random tokens does not happen.
        duplicate = DuplicateClientToken(token.name)
        await self._add(
            CLIENT_TOKENS,
            token,
            ChangeKind.TOKEN,
            token.endpoint_id,
            duplicate=duplicate,
            check=check,
        )

    async def client_tokens(self, endpoint_id: str | None = None) -> list[ClientToken]:
        where = Where(_OF_LIVE_ENDPOINT).add("endpoint_id = ?", endpoint_id)
        return await self._find(CLIENT_TOKENS, where)

    async def delete_client_token(self, endpoint_id: str, name: str) -> bool:
        kind = ChangeKind.TOKEN
        return await self._delete(CLIENT_TOKENS, endpoint_id, name, kind=kind, change=endpoint_id)

    async def touch_client_tokens(self, last_used: Mapping[tuple[str, str], datetime]) -> None:
        await self._touch(CLIENT_TOKENS, last_used)
