"""The endpoint service over the in-memory store: its copy follows another
writer's changes through the change feed, and a store that is away makes
writes answer 503 while reads go on from memory. No sleeps: the feed is
drained by yielding to the loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.catalog import load_catalog
from inferd.control.accounts.metering import UsageMeter
from inferd.control.accounts.model import utc_now
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.project_guard import ProjectGuard
from inferd.control.accounts.roles import OPERATOR
from inferd.control.accounts.service import AccountService
from inferd.control.endpoints.cache import EndpointCache
from inferd.control.endpoints.reads import EndpointReads
from inferd.control.endpoints.records import EndpointRuntime, ReplicaStatus, ReplicaView
from inferd.control.endpoints.service import EndpointCommands
from inferd.control.endpoints.tokens import TokenVerifier
from inferd.control.model import StoreUnavailable
from inferd.control.model_service import ModelService
from inferd.control.paging import EndpointFilter
from inferd.control.stores.memory import MemoryStore
from tests.support import eventually

CATALOG = load_catalog()


@dataclass(frozen=True)
class Endpoints:
    """The reads and the commands over one copy, as `compose` builds them."""

    reads: EndpointReads
    commands: EndpointCommands
    verifier: TokenVerifier


async def service(store: MemoryStore) -> Endpoints:
    accounts = AccountService(store, PrincipalResolver(store, lambda key: False), utc_now)
    await accounts.ensure_default_project()
    cache = EndpointCache(store)
    verifier = TokenVerifier(store)
    reads = EndpointReads(store, cache, CATALOG, UsageMeter(), public_url="http://inferd.test")
    commands = EndpointCommands(
        reads,
        store,
        cache,
        CATALOG,
        verifier,
        accounts,
        ProjectGuard(store),
        ModelService(store, CATALOG, cache.rows),
        default_location="local",
        max_replicas_cap=4,
    )
    return Endpoints(reads, commands, verifier)


settle = eventually


def test_a_second_service_on_the_same_store_follows_the_first() -> None:
    async def body() -> None:
        store = MemoryStore()
        writer, reader = await service(store), await service(store)
        feeds = [store.changes(), store.changes()]
        await reader.reads.load()
        await reader.verifier.load()
        following = [
            asyncio.ensure_future(reader.reads.follow(feeds[0])),
            asyncio.ensure_future(reader.verifier.follow(feeds[1])),
        ]

        record, token = await writer.commands.create(
            OPERATOR,
            CreateEndpointRequest(name="shared", modelName="tiny-chat", minReplicas=0),
            None,
        )
        endpoint_id = record["id"]
        await settle(lambda: reader.reads.find(endpoint_id) is not None)
        assert reader.reads.find_by_name("shared") is not None
        await settle(lambda: reader.verifier.verify(endpoint_id, token))

        await writer.commands.update(OPERATOR, endpoint_id, UpdateEndpointRequest(maxReplicas=3))
        await settle(lambda: reader.reads.row(endpoint_id).max_replicas == 3)
        assert reader.reads.record(endpoint_id)["maxReplicas"] == 3

        new_token = await writer.commands.reissue_token(OPERATOR, endpoint_id)
        await settle(lambda: reader.verifier.verify(endpoint_id, new_token))
        assert not reader.verifier.verify(endpoint_id, token)

        await writer.commands.delete(OPERATOR, endpoint_id)
        await settle(lambda: reader.reads.find(endpoint_id) is None)
        assert reader.reads.find_by_name("shared") is None
        assert not reader.verifier.verify(endpoint_id, new_token)

        await store.close()
        await asyncio.gather(*following)  # the feeds end with the store

    asyncio.run(body())


def test_store_away_writes_refused_reads_served_then_back() -> None:
    async def body() -> None:
        store = MemoryStore()
        svc = await service(store)
        record, _ = await svc.commands.create(
            OPERATOR, CreateEndpointRequest(name="kept", modelName="tiny-chat"), None
        )

        store.unavailable = True
        assert svc.reads.record(record["id"])["name"] == "kept"
        assert svc.reads.get_json(OPERATOR, record["id"]).startswith(b'{"id":')
        with pytest.raises(StoreUnavailable) as refused:
            await svc.commands.create(
                OPERATOR, CreateEndpointRequest(name="later", modelName="tiny-chat"), None
            )
        assert refused.value.status == 503 and "Retry-After" in refused.value.headers()
        with pytest.raises(StoreUnavailable):
            await svc.commands.update(OPERATOR, record["id"], UpdateEndpointRequest(maxReplicas=2))
        # Nothing half-applied in memory either.
        assert svc.reads.record(record["id"])["maxReplicas"] == 1
        assert svc.reads.find_by_name("later") is None

        store.unavailable = False
        await svc.commands.create(
            OPERATOR, CreateEndpointRequest(name="later", modelName="tiny-chat"), None
        )
        assert [e.name for e in await store.list_endpoints()] == ["kept", "later"]

    asyncio.run(body())


def test_the_lists_status_filter_says_what_the_record_says() -> None:
    """While lost replicas are replaced the record says `initializing`; the
    list filtered by status must find the endpoint under that status too."""

    async def body() -> None:
        svc = await service(MemoryStore())
        record, _ = await svc.commands.create(
            OPERATOR, CreateEndpointRequest(name="back", modelName="tiny-chat", minReplicas=1), None
        )
        lost = EndpointRuntime(
            (ReplicaView(1, ReplicaStatus.FAILED, reason="node lost"),),
            replacing="replacing lost replica r-1: node lost",
        )
        svc.reads.runtime_of = lambda endpoint_id: lost
        assert svc.reads.record(record["id"])["status"] == "initializing"
        found, _ = await svc.reads.page_json(OPERATOR, EndpointFilter(), "initializing", None, 10)
        assert found.startswith(b'{"id":"' + record["id"].encode())
        missed, _ = await svc.reads.page_json(OPERATOR, EndpointFilter(), "failed", None, 10)
        assert missed == b""

    asyncio.run(body())


def test_a_create_places_the_endpoint_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recommender runs once per create: its placement is the one the
    quota is checked on and the one written."""
    from inferd.control.endpoints import placement

    calls: list[str] = []
    real = placement.recommend

    def counted(*args: object, **kwargs: object) -> object:
        calls.append("recommend")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(placement, "recommend", counted)

    async def body() -> None:
        svc = await service(MemoryStore())
        record, _ = await svc.commands.create(
            OPERATOR, CreateEndpointRequest(name="once", modelName="tiny-chat"), None
        )
        assert calls == ["recommend"]
        assert (record["gpuType"], record["projectId"]) == (
            svc.reads.row(record["id"]).gpu_type,
            "default",
        )

    asyncio.run(body())
