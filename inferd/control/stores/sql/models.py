"""Registered models and measured profiles (`ModelStore`, `ProfileStore`)."""

from __future__ import annotations

from inferd.catalog.registered import DuplicateModel, MeasuredProfile, RegisteredModel
from inferd.control.model import ChangeKind
from inferd.control.stores.sql.database import Violation
from inferd.control.stores.sql.repository import Repository
from inferd.control.stores.sql.tables import MODELS, PROFILES

_PUT_PROFILE = PROFILES.upsert(replaced=("document", "measured_at"))


class Models(Repository):
    async def add_model(self, model: RegisteredModel) -> None:
        try:
            await self._add(MODELS, model, ChangeKind.MODEL, model.name)
        except Violation:
            raise DuplicateModel(model.name) from None

    async def get_model(self, name: str) -> RegisteredModel | None:
        return await self._get(MODELS, name)

    async def list_models(self) -> list[RegisteredModel]:
        return await self._find(MODELS)

    async def delete_model(self, name: str) -> bool:
        return await self._delete(MODELS, name, kind=ChangeKind.MODEL, change=name)

    async def put_profile(self, profile: MeasuredProfile) -> None:
        values = PROFILES.values(self._dialect, profile)
        await self._change(_PUT_PROFILE, values, ChangeKind.MODEL)

    async def list_profiles(self) -> list[MeasuredProfile]:
        return await self._find(PROFILES)
