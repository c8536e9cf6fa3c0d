"""The registered-model and profile ports, against every adapter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from inferd.catalog import load_catalog
from inferd.catalog.inspect import ServingHints
from inferd.catalog.model_stores import MemoryModelStore, SqliteModelStore
from inferd.catalog.registered import (
    DuplicateModel,
    MeasuredProfile,
    ProfilePoint,
    RegisteredModel,
)
from inferd.control.store import Store


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    if request.param == "memory":
        yield MemoryModelStore()
        return
    path = tmp_path / "inferd.db"
    Store.open(path).close()  # creates and migrates the file
    sqlite = SqliteModelStore(path)
    yield sqlite
    sqlite.close()


def _model(name: str, project: str | None = None) -> RegisteredModel:
    spec = load_catalog().models.get("qwen2.5-0.5b-instruct")
    return RegisteredModel(
        spec=replace(spec, name=name, source="/models/" + name),
        project_id=project,
        revision=None,
        architecture_class="Qwen2ForCausalLM",
        hints=ServingHints("tokenizer_config.json", "hermes", None),
        created_at=f"2026-11-23T10:00:0{len(name) % 10}.000Z",
    )


def test_models_round_trip(store: MemoryModelStore) -> None:
    async def run() -> None:
        a, b = _model("a"), _model("bb", project="p1")
        await store.add_model(a)
        await store.add_model(b)
        with pytest.raises(DuplicateModel):
            await store.add_model(_model("a"))
        assert await store.get_model("a") == a
        assert await store.get_model("missing") is None
        assert [m.name for m in await store.list_models()] == ["a", "bb"]
        assert (await store.get_model("bb")) == b
        assert await store.delete_model("a") is True
        assert await store.delete_model("a") is False
        assert [m.name for m in await store.list_models()] == ["bb"]

    asyncio.run(run())


def test_profiles_replace_per_model_gpu_and_count(store: MemoryModelStore) -> None:
    async def run() -> None:
        def profile(gpu: str, point: ProfilePoint, at: str) -> MeasuredProfile:
            return MeasuredProfile("m", gpu, 1, "chat", 512, 128, (point,), at)

        first = profile("H100-80GB", ProfilePoint(1, 8, 90.0, 0.05, 0.011), "2026-11-23T10:00Z")
        second = profile("H100-80GB", ProfilePoint(4, 8, 300.0, 0.08, 0.013), "2026-11-23T11:00Z")
        other = profile("L4", ProfilePoint(1, 8, 20.0, 0.2, 0.05), "2026-11-23T11:00Z")
        for p in (first, second, other):
            await store.put_profile(p)
        assert sorted(await store.list_profiles(), key=lambda p: p.gpu_type) == [second, other]

    asyncio.run(run())
