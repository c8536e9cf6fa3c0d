"""LoRA adapters of endpoints and what each served (`AdapterStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from inferd.control.model import Adapter, AdapterUsage, ChangeKind, DuplicateAdapter
from inferd.control.stores.sql.repository import Repository, Where
from inferd.control.stores.sql.tables import ADAPTER_USAGE, ADAPTERS

# Several instances' figures add up.
_ADD_USAGE = ADAPTER_USAGE.upsert(added=("requests", "prompt_tokens", "completion_tokens"))


class Adapters(Repository):
    async def add_adapter(self, adapter: Adapter) -> None:
        await self._add(
            ADAPTERS, adapter, ChangeKind.ADAPTER, adapter.endpoint_id,
            duplicate=DuplicateAdapter(adapter.name),
            check=lambda tx: self._live_endpoint(tx, adapter.endpoint_id),
        )  # fmt: skip

    async def list_adapters(self, endpoint_id: str | None = None) -> list[Adapter]:
        return await self._find(ADAPTERS, Where("endpoint_id = ?", endpoint_id))

    async def delete_adapter(self, endpoint_id: str, name: str) -> bool:
        kind = ChangeKind.ADAPTER
        return await self._delete(ADAPTERS, endpoint_id, name, kind=kind, change=endpoint_id)

    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None:
        if rows:
            values = [ADAPTER_USAGE.values(self._dialect, r) for r in rows]
            await self._db.write(lambda tx: tx.many(_ADD_USAGE, values))

    async def adapter_usage(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        where = Where("endpoint_id = ? AND adapter = ?", endpoint_id, adapter)
        return await self._find(ADAPTER_USAGE, where, order="hour")
