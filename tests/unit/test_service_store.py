"""The endpoint service over the in-memory store: its copy follows another
writer's changes through the change feed, and a store that is away makes
writes answer 503 while reads go on from memory. No sleeps: the feed is
drained by yielding to the loop."""

from __future__ import annotations

import asyncio

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
from inferd.control.endpoints.records import EndpointRuntime, ReplicaStatus, ReplicaView
from inferd.control.endpoints.service import EndpointService
from inferd.control.endpoints.tokens import TokenVerifier
from inferd.control.model import StoreUnavailable
from inferd.control.model_service import ModelService
from inferd.control.paging import EndpointFilter
from inferd.control.stores.memory import MemoryStore
from tests.support import eventually

CATALOG = load_catalog()


async def service(store: MemoryStore) -> EndpointService:
    accounts = AccountService(store, PrincipalResolver(store, lambda key: False), utc_now)
    await accounts.ensure_default_project()
    cache = EndpointCache(store)
    return EndpointService(
        store,
        cache,
        CATALOG,
        TokenVerifier(store),
        accounts,
        ProjectGuard(store),
        UsageMeter(),
        ModelService(store, CATALOG, cache.rows),
        public_url="http://inferd.test",
        default_location="local",
        max_replicas_cap=4,
    )


settle = eventually


def test_a_second_service_on_the_same_store_follows_the_first() -> None:
    async def body() -> None:
        store = MemoryStore()
        writer, reader = await service(store), await service(store)
        feeds = [store.changes(), store.changes()]
        await reader.load()
        await reader.verifier.load()
        following = [
            asyncio.ensure_future(reader.follow(feeds[0])),
            asyncio.ensure_future(reader.verifier.follow(feeds[1])),
        ]

        record, token = await writer.create(
            OPERATOR,
            CreateEndpointRequest(name="shared", modelName="tiny-chat", minReplicas=0),
            None,
        )
        endpoint_id = record["id"]
        await settle(lambda: reader.find(endpoint_id) is not None)
        assert reader.find_by_name("shared") is not None
        await settle(lambda: reader.verifier.verify(endpoint_id, token))

        await writer.update(OPERATOR, endpoint_id, UpdateEndpointRequest(maxReplicas=3))
        await settle(lambda: reader.row(endpoint_id).max_replicas == 3)
        assert reader.record(endpoint_id)["maxReplicas"] == 3

        new_token = await writer.reissue_token(OPERATOR, endpoint_id)
        await settle(lambda: reader.verifier.verify(endpoint_id, new_token))
        assert not reader.verifier.verify(endpoint_id, token)

        await writer.delete(OPERATOR, endpoint_id)
        await settle(lambda: reader.find(endpoint_id) is None)
        assert reader.find_by_name("shared") is None
        assert not reader.verifier.verify(endpoint_id, new_token)

        await store.close()
        await asyncio.gather(*following)  # the feeds end with the store

    asyncio.run(body())


def test_store_away_writes_refused_reads_served_then_back() -> None:
    async def body() -> None:
        store = MemoryStore()
        svc = await service(store)
        record, _ = await svc.create(
            OPERATOR, CreateEndpointRequest(name="kept", modelName="tiny-chat"), None
        )

        store.unavailable = True
        assert svc.record(record["id"])["name"] == "kept"
        assert svc.get_json(OPERATOR, record["id"]).startswith(b'{"id":')
        with pytest.raises(StoreUnavailable) as refused:
            await svc.create(
                OPERATOR, CreateEndpointRequest(name="later", modelName="tiny-chat"), None
            )
        assert refused.value.status == 503 and "Retry-After" in refused.value.headers()
        with pytest.raises(StoreUnavailable):
            await svc.update(OPERATOR, record["id"], UpdateEndpointRequest(maxReplicas=2))
        # Nothing half-applied in memory either.
        assert svc.record(record["id"])["maxReplicas"] == 1
        assert svc.find_by_name("later") is None

        store.unavailable = False
        await svc.create(OPERATOR, CreateEndpointRequest(name="later", modelName="tiny-chat"), None)
        assert [e.name for e in await store.list_endpoints()] == ["kept", "later"]

    asyncio.run(body())


def test_the_lists_status_filter_says_what_the_record_says() -> None:
    """While lost replicas are replaced the record says `initializing`; the
    list filtered by status must find the endpoint under that status too."""

    async def body() -> None:
        svc = await service(MemoryStore())
        record, _ = await svc.create(
            OPERATOR, CreateEndpointRequest(name="back", modelName="tiny-chat", minReplicas=1), None
        )
        lost = EndpointRuntime(
            (ReplicaView(1, ReplicaStatus.FAILED, reason="node lost"),),
            replacing="replacing lost replica r-1: node lost",
        )
        svc.runtime_of = lambda endpoint_id: lost
        assert svc.record(record["id"])["status"] == "initializing"
        found, _ = await svc.page_json(OPERATOR, EndpointFilter(), "initializing", None, 10)
        assert found.startswith(b'{"id":"' + record["id"].encode())
        missed, _ = await svc.page_json(OPERATOR, EndpointFilter(), "failed", None, 10)
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
        record, _ = await svc.create(
            OPERATOR, CreateEndpointRequest(name="once", modelName="tiny-chat"), None
        )
        assert calls == ["recommend"]
        assert (record["gpuType"], record["projectId"]) == (
            svc.row(record["id"]).gpu_type,
            "default",
        )

    asyncio.run(body())
