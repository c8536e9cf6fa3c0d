"""Endpoints' named client tokens (`ClientTokenStore`): digests only.

Every write says `ChangeKind.TOKEN` for the endpoint, as a re-issued owner
token does, so each instance's token cache re-reads that endpoint's tokens
and a revoked one stops working everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from inferd.control.model import (
    ChangeKind,
    ClientToken,
    DuplicateClientToken,
    TooManyClientTokens,
)
from inferd.control.stores.sql.database import Repository, Tx
from inferd.control.stores.sql.tables import CLIENT_TOKENS, TIME

_LIVE = " JOIN endpoints e ON e.id = t.endpoint_id WHERE e.deleting_at IS NULL"


class ClientTokens(Repository):
    async def add_client_token(self, token: ClientToken, *, limit: int) -> None:
        """Store it, unless the endpoint is gone or being deleted
        (`EndpointGone`), has one of that name (`DuplicateClientToken`) or
        has `limit` already (`TooManyClientTokens`)."""

        def write(tx: Tx) -> None:
            self._live_endpoint(tx, token.endpoint_id, exclusive=True)
            count = tx.one(
                "SELECT count(*) FROM endpoint_client_tokens WHERE endpoint_id = ?",
                (token.endpoint_id,),
            )
            if count is not None and int(count[0]) >= limit:
                raise TooManyClientTokens(token.endpoint_id)
            tx.execute(CLIENT_TOKENS.insert, CLIENT_TOKENS.values(self._dialect, token))
            tx.changed(ChangeKind.TOKEN, token.endpoint_id)

        # The key (endpoint, name); a digest collision of random tokens does not happen.
        await self._write_new(write, DuplicateClientToken(token.name))

    async def client_tokens(self, endpoint_id: str | None = None) -> list[ClientToken]:
        """The client tokens of one endpoint, or of every endpoint not being
        deleted, oldest first."""
        columns = ", ".join(f"t.{c.name}" for c in CLIENT_TOKENS.columns)
        query = f"SELECT {columns} FROM endpoint_client_tokens t{_LIVE}"
        params: tuple[str, ...] = ()
        if endpoint_id is not None:
            query += " AND t.endpoint_id = ?"
            params = (endpoint_id,)
        order = self._dialect.position("endpoint_client_tokens")
        rows = await self._db.rows(f"{query} ORDER BY t.{order}", params)
        return [CLIENT_TOKENS.record(self._dialect, r) for r in rows]

    async def delete_client_token(self, endpoint_id: str, name: str) -> bool:
        return await self._delete_named(
            "endpoint_client_tokens", ChangeKind.TOKEN, endpoint_id, name
        )

    async def touch_client_tokens(self, last_used: Mapping[tuple[str, str], datetime]) -> None:
        """Record when each (endpoint id, name) was last used (never moved back)."""
        rows = []
        for (endpoint_id, name), at in last_used.items():
            stamp = self._dialect.encode(TIME.storage, at)
            rows.append((stamp, endpoint_id, name, stamp))
        if rows:
            await self._db.write(lambda tx: tx.many(
                "UPDATE endpoint_client_tokens SET last_used_at = ? WHERE endpoint_id = ?"
                " AND name = ? AND (last_used_at IS NULL OR last_used_at < ?)",
                rows,
            ))  # fmt: skip
