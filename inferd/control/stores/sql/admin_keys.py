"""Admin keys (`AdminKeyStore`): digests only, oldest first."""

from __future__ import annotations

from datetime import datetime

from inferd.control.model import ChangeKind
from inferd.control.stores.sql.database import Tx
from inferd.control.stores.sql.repository import Repository


class AdminKeys(Repository):
    async def admin_key_hashes(self) -> list[bytes]:
        rows = await self._db.rows(
            "SELECT key_hash FROM admin_keys WHERE revoked_at IS NULL ORDER BY id"
        )
        return [bytes(r[0]) for r in rows]

    async def add_admin_key(
        self, key_hash: bytes, at: datetime, *, revoke_others: bool = False
    ) -> None:
        stamp = self._time(at)

        def write(tx: Tx) -> None:
            if revoke_others:
                tx.execute(
                    "UPDATE admin_keys SET revoked_at = ? WHERE revoked_at IS NULL", (stamp,)
                )
            tx.execute(
                "INSERT INTO admin_keys (key_hash, created_at) VALUES (?, ?)", (key_hash, stamp)
            )
            tx.changed(ChangeKind.ADMIN_KEY)

        await self._db.write(write)
