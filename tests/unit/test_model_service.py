"""Registered models over the in-memory store: a second control plane's
catalog follows the first's registrations, measurements and deletions
through the change feed. No sleeps: the feed is drained by yielding."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from inferd.api.management import RegisterModelRequest
from inferd.catalog import load_catalog
from inferd.catalog.registered import MeasuredProfile, ProfilePoint
from inferd.catalog.support import EngineSupport
from inferd.control.accounts.roles import OPERATOR
from inferd.control.model_service import ModelService
from inferd.control.stores.memory import MemoryStore
from inferd.errors import BadRequest, Conflict
from tests.support import eventually

SUPPORT = EngineSupport.fixed({"LlamaForCausalLM"}, set())
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}  # fmt: skip


def service(store: MemoryStore) -> ModelService:
    return ModelService(store, load_catalog(), list, support=SUPPORT, offline=True)


settle = eventually


def test_a_second_instance_follows_registrations(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**CONFIG, "architectures": ["Nope"]}))
    (other / "chat_template.jinja").write_text("{{ messages }}")
    resolved = str(tmp_path.resolve())

    async def body() -> None:
        store = MemoryStore()
        writer, reader = service(store), service(store)
        feed = store.changes()
        await reader.load()
        following = asyncio.ensure_future(reader.follow(feed))

        await writer.register(OPERATOR, RegisterModelRequest(source=str(tmp_path), name="mine"))
        await settle(lambda: "mine" in reader.catalog.models)
        assert reader.describe("mine")["architecture"]["kvHeads"] == 2
        assert reader.catalog.models.get("mine").source == resolved

        profile = MeasuredProfile("mine", "L4", 1, "chat", 10, 10,
                                  (ProfilePoint(1, 4, 50.0, 0.1, 0.02),), "2026-11-23")  # fmt: skip
        await writer.record_profile(OPERATOR, profile)
        await settle(lambda: reader.profiles() == [profile])

        with pytest.raises(Conflict, match="already exists"):
            await writer.register(OPERATOR, RegisterModelRequest(source=str(tmp_path), name="mine"))
        with pytest.raises(Conflict, match="catalog model"):
            await writer.delete(OPERATOR, "tiny-chat")
        with pytest.raises(BadRequest, match="not in vLLM's model registry"):
            await writer.register(OPERATOR, RegisterModelRequest(source=str(other), name="other"))

        await writer.delete(OPERATOR, "mine")
        await settle(lambda: "mine" not in reader.catalog.models)
        await store.close()
        await following

    asyncio.run(body())


class SlowListing(MemoryStore):
    """A store whose model listing is taken at once but answered only when
    `release` is set: a reload's read in flight while a registration runs."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def list_models(self):  # type: ignore[no-untyped-def]
        snapshot = await super().list_models()
        await self.release.wait()
        return snapshot


def test_a_reload_in_flight_does_not_undo_a_registration(tmp_path: Path) -> None:
    """The change feed's reload read the store before this instance's
    registration committed and applied that older list after it: the model
    just registered answered 404 until the next change."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")

    async def body() -> None:
        store = SlowListing()
        models = service(store)
        reload = asyncio.ensure_future(models.load())
        await asyncio.sleep(0)
        register = asyncio.ensure_future(
            models.register(OPERATOR, RegisterModelRequest(source=str(tmp_path), name="mine"))
        )
        # Without the lock around the reload's read, the registration
        # finishes meanwhile (its file reads run in a thread); with it, it
        # waits for the reload. Either way, then the listing is answered.
        for _ in range(200):
            if register.done():
                break
            await asyncio.sleep(0.005)
        store.release.set()
        await asyncio.gather(reload, register)
        assert models.describe("mine")["name"] == "mine"
        await models.delete(OPERATOR, "mine")  # the answer that was a 404

    asyncio.run(body())
