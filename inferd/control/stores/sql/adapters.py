"""LoRA adapters of endpoints and what each served (`AdapterStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from inferd.control.model import Adapter, AdapterUsage, ChangeKind, DuplicateAdapter
from inferd.control.stores.sql.database import Repository, Tx
from inferd.control.stores.sql.tables import ADAPTER_USAGE, ADAPTERS


class Adapters(Repository):
    async def add_adapter(self, adapter: Adapter) -> None:
        def write(tx: Tx) -> None:
            self._live_endpoint(tx, adapter.endpoint_id)
            tx.execute(ADAPTERS.insert, ADAPTERS.values(self._dialect, adapter))
            tx.changed(ChangeKind.ADAPTER, adapter.endpoint_id)

        await self._write_new(write, DuplicateAdapter(adapter.name))

    async def list_adapters(self, endpoint_id: str | None = None) -> list[Adapter]:
        where, params = (
            ("", ()) if endpoint_id is None else (" WHERE endpoint_id = ?", (endpoint_id,))
        )
        order = self._dialect.position("endpoint_adapters")
        rows = await self._db.rows(f"{ADAPTERS.select}{where} ORDER BY {order}", params)
        return [ADAPTERS.record(self._dialect, r) for r in rows]

    async def delete_adapter(self, endpoint_id: str, name: str) -> bool:
        return await self._delete_named("endpoint_adapters", ChangeKind.ADAPTER, endpoint_id, name)

    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None:
        """Added to the stored sums (several instances' figures add up)."""
        if not rows:
            return
        statement = ADAPTER_USAGE.insert + (
            " ON CONFLICT (endpoint_id, adapter, hour) DO UPDATE SET"
            " requests = adapter_usage_hourly.requests + excluded.requests,"
            " prompt_tokens = adapter_usage_hourly.prompt_tokens + excluded.prompt_tokens,"
            " completion_tokens ="
            " adapter_usage_hourly.completion_tokens + excluded.completion_tokens"
        )
        values = [ADAPTER_USAGE.values(self._dialect, r) for r in rows]
        await self._db.write(lambda tx: tx.many(statement, values))

    async def adapter_usage(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        rows = await self._db.rows(
            f"{ADAPTER_USAGE.select} WHERE endpoint_id = ? AND adapter = ? ORDER BY hour",
            (endpoint_id, adapter),
        )
        return [ADAPTER_USAGE.record(self._dialect, r) for r in rows]
