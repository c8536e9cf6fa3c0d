"""Registered models and measured profiles (`ModelStore`, `ProfileStore`)."""

from __future__ import annotations

from inferd.catalog.registered import DuplicateModel, MeasuredProfile, RegisteredModel
from inferd.control.model import ChangeKind
from inferd.control.stores.sql.database import Repository, Tx, Violation
from inferd.control.stores.sql.tables import MODELS, PROFILES


class Models(Repository):
    async def add_model(self, model: RegisteredModel) -> None:
        def write(tx: Tx) -> None:
            tx.execute(MODELS.insert, MODELS.values(self._dialect, model))
            tx.changed(ChangeKind.MODEL, model.name)

        try:
            await self._db.write(write)
        except Violation:
            raise DuplicateModel(model.name) from None

    async def get_model(self, name: str) -> RegisteredModel | None:
        rows = await self._db.rows(MODELS.select + " WHERE name = ?", (name,))
        return MODELS.record(self._dialect, rows[0]) if rows else None

    async def list_models(self) -> list[RegisteredModel]:
        order = self._dialect.position("registered_models")
        rows = await self._db.rows(f"{MODELS.select} ORDER BY {order}")
        return [MODELS.record(self._dialect, r) for r in rows]

    async def delete_model(self, name: str) -> bool:
        def write(tx: Tx) -> bool:
            deleted = tx.count("DELETE FROM registered_models WHERE name = ?", (name,))
            if deleted:
                tx.changed(ChangeKind.MODEL, name)
            return deleted > 0

        return await self._db.write(write)

    async def put_profile(self, profile: MeasuredProfile) -> None:
        statement = PROFILES.insert + (
            " ON CONFLICT (model_name, gpu_type, gpu_count)"
            " DO UPDATE SET document = excluded.document, measured_at = excluded.measured_at"
        )
        values = PROFILES.values(self._dialect, profile)

        def write(tx: Tx) -> None:
            tx.execute(statement, values)
            tx.changed(ChangeKind.MODEL, "")

        await self._db.write(write)

    async def list_profiles(self) -> list[MeasuredProfile]:
        order = self._dialect.position("model_profiles")
        rows = await self._db.rows(f"{PROFILES.select} ORDER BY {order}")
        return [PROFILES.record(self._dialect, r) for r in rows]
