"""One contract for every store: in-memory, SQLite, and a real PostgreSQL server.

Each test runs against each adapter; what differs between them (a second
process writing the same database, a database server going away) is
tested where it exists.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import load_catalog
from inferd.catalog.inspect import ServingHints
from inferd.catalog.registered import (
    DuplicateModel,
    MeasuredProfile,
    ProfilePoint,
    RegisteredModel,
)
from inferd.control.batches.jsonl import parse_batch_file
from inferd.control.batches.model import (
    WINDOW,
    Batch,
    BatchStatus,
    Capacity,
    Counts,
    RequestState,
    Result,
)
from inferd.control.model import (
    Adapter,
    AdapterUsage,
    Change,
    ChangeKind,
    ClientToken,
    DuplicateAdapter,
    DuplicateClientToken,
    DuplicateName,
    EndpointChanges,
    EndpointGone,
    StoreUnavailable,
    TooManyClientTokens,
)
from inferd.control.paging import EndpointFilter
from inferd.control.ports import Store
from inferd.control.stores import open_store
from inferd.control.stores.memory import MemoryStore
from inferd.testing.postgres import PostgresServer
from tests.records import T0
from tests.records import endpoint_row as endpoint
from tests.records import replica_record as replica

KINDS = ["memory", "sqlite", "postgres"]
SHARED = ["sqlite", "postgres"]  # a second writer on the same database exists


def digest(n: int) -> bytes:
    return bytes([n % 256]) * 31 + bytes([n // 256])


Opener = Callable[[], Store]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """This test's database."""
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'inferd.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()


@pytest.fixture
def opener(store_url: str) -> Iterator[Opener]:
    """Opens a store on this test's database (a second call: a second writer)."""
    url = store_url
    opened: list[Store] = []

    def open_one() -> Store:
        store = open_store(url)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        asyncio.run(store.close())


def run(body: Callable[..., Awaitable[None]], *args: object) -> None:
    asyncio.run(body(*args))  # type: ignore[arg-type]


async def collect(
    feed: AsyncIterator[Change], until: Callable[[list[Change]], bool], timeout: float = 5.0
) -> list[Change]:
    seen: list[Change] = []

    async def read() -> None:
        async for change in feed:
            seen.append(change)
            if until(seen):
                return

    try:
        await asyncio.wait_for(read(), timeout)
    except TimeoutError:
        pytest.fail(f"change feed: expected more within {timeout}s; saw {seen}")
    return seen


# --- endpoints ------------------------------------------------------------------------


def test_endpoint_crud(opener: Opener) -> None:
    async def body(store: Store) -> None:
        a, b = endpoint(1), endpoint(2, at=T0 + timedelta(seconds=1))
        await store.insert_endpoint(b, digest(2))
        await store.insert_endpoint(a, digest(1))
        assert await store.get_endpoint(a.id) == a
        assert await store.get_endpoint("no-such-id") is None
        # Oldest first means the order of creation.
        assert [e.id for e in await store.list_endpoints()] == [b.id, a.id]

        later = T0 + timedelta(minutes=5)
        changed = await store.update_endpoint(
            a.id, EndpointChanges(updated_at=later, min_replicas=1, generation=2, gpu_count=2)
        )
        assert changed == replace(a, min_replicas=1, generation=2, gpu_count=2, updated_at=later)
        assert await store.get_endpoint(a.id) == changed
        with pytest.raises(EndpointGone):
            await store.update_endpoint("gone", EndpointChanges(updated_at=later))

        deleting = await store.mark_deleting(a.id, later)
        assert deleting.deleting_at == later
        again = await store.mark_deleting(a.id, later + timedelta(seconds=1))
        assert again.deleting_at == later  # the first time it started counts
        with pytest.raises(EndpointGone):
            await store.mark_deleting("gone", later)

        assert await store.delete_endpoint(a.id) is True
        assert await store.delete_endpoint(a.id) is False
        assert await store.get_endpoint(a.id) is None
        assert [e.id for e in await store.list_endpoints()] == [b.id]

    run(body, opener())


def test_times_and_types_round_trip_exactly(opener: Opener) -> None:
    async def body(store: Store) -> None:
        e = replace(endpoint(1), hourly_price=0.1 + 0.2, retention_seconds=2**62, project_id="p1")
        await store.insert_endpoint(e, digest(1))
        got = await store.get_endpoint(e.id)
        assert got == e
        assert got is not None and got.created_at.tzinfo is not None
        assert got.created_at.utcoffset() == timedelta(0)

    run(body, opener())


def test_engine_settings_are_stored_and_changed(opener: Opener) -> None:
    async def body(store: Store) -> None:
        tuned = EngineSettings.model_validate(
            {
                "maxModelLen": 1024,
                "kvCacheDtype": "fp8",
                "enablePrefixCaching": False,
                "speculativeDecoding": {"draftModel": "tiny-chat", "numSpeculativeTokens": 3},
            }
        )
        plain, with_settings = endpoint(1), replace(endpoint(2), engine_settings=tuned)
        await store.insert_endpoint(plain, digest(1))
        await store.insert_endpoint(with_settings, digest(2))
        assert (await store.get_endpoint(plain.id)) == plain
        assert plain.engine_settings.is_empty()
        assert (await store.get_endpoint(with_settings.id)) == with_settings
        later = T0 + timedelta(minutes=1)
        fewer = EngineSettings.model_validate({"maxNumSeqs": 4})
        changed = await store.update_endpoint(
            with_settings.id, EndpointChanges(updated_at=later, engine_settings=fewer, generation=2)
        )
        assert changed.engine_settings == fewer and changed.generation == 2
        assert [e.engine_settings for e in await store.list_endpoints()] == [
            EngineSettings(),
            fewer,
        ]

    run(body, opener())


def test_every_model_kind_is_stored(opener: Opener) -> None:
    async def body(store: Store) -> None:
        for n, (model, kind) in enumerate(
            [("tiny-chat", "chat"), ("tiny-sdxl", "image"), ("tiny-embed", "embedding"),
             ("tiny-rerank", "rerank")],
            start=1,
        ):  # fmt: skip
            row = endpoint(n, f"ep-{kind}", model_name=model, model_kind=kind)
            await store.insert_endpoint(row, digest(n))
            assert await store.get_endpoint(row.id) == row

    run(body, opener())


def test_duplicate_name_is_refused_and_writes_nothing(opener: Opener) -> None:
    async def body(store: Store) -> None:
        await store.insert_endpoint(endpoint(1, "same"), digest(1))
        with pytest.raises(DuplicateName):
            await store.insert_endpoint(endpoint(2, "same"), digest(2))
        assert [e.id for e in await store.list_endpoints()] == [endpoint(1).id]
        assert await store.active_token_hashes() == {endpoint(1).id: digest(1)}
        # The name is free again once its endpoint is deleted.
        await store.delete_endpoint(endpoint(1).id)
        await store.insert_endpoint(endpoint(2, "same"), digest(2))

    run(body, opener())


# --- tokens and admin keys -------------------------------------------------------------


def test_tokens(opener: Opener) -> None:
    async def body(store: Store) -> None:
        a, b = endpoint(1), endpoint(2)
        await store.insert_endpoint(a, digest(1))
        await store.insert_endpoint(b, digest(2))
        assert await store.active_token_hashes() == {a.id: digest(1), b.id: digest(2)}
        await store.replace_token(a.id, digest(3), T0)
        assert await store.active_token_hash(a.id) == digest(3)
        assert await store.active_token_hash("gone") is None
        with pytest.raises(EndpointGone):
            await store.replace_token("gone", digest(4), T0)
        # Deletion started: the token stops working and cannot be re-issued.
        await store.mark_deleting(b.id, T0)
        assert await store.active_token_hashes() == {a.id: digest(3)}
        with pytest.raises(EndpointGone):
            await store.replace_token(b.id, digest(5), T0)
        await store.delete_endpoint(a.id)
        assert await store.active_token_hashes() == {}

    run(body, opener())


def test_admin_keys(opener: Opener) -> None:
    async def body(store: Store) -> None:
        assert await store.admin_key_hashes() == []
        await store.add_admin_key(digest(1), T0)
        await store.add_admin_key(digest(2), T0)
        assert await store.admin_key_hashes() == [digest(1), digest(2)]
        await store.add_admin_key(digest(3), T0, revoke_others=True)
        assert await store.admin_key_hashes() == [digest(3)]

    run(body, opener())


# --- replicas ---------------------------------------------------------------------------


def test_replicas(opener: Opener) -> None:
    async def body(store: Store) -> None:
        e = endpoint(1)
        await store.insert_endpoint(e, digest(1))
        r1, r2 = replica(1, e.id), replica(2, e.id)
        await store.insert_replica(r1)
        await store.insert_replica(r2)
        assert await store.list_replicas() == [r1, r2]
        later = T0 + timedelta(seconds=3)
        await store.update_replica(
            r1.id, status="ready", reason=None, url="http://127.0.0.1:9", at=later
        )
        await store.update_replica("r-gone", status="ready", reason=None, url=None, at=later)
        got = await store.list_replicas()
        assert got[0] == replace(r1, status="ready", url="http://127.0.0.1:9", updated_at=later)
        assert got[0].placement == {"pid": "1001", "gpu_ids": ""}
        # The leader's unresponsive mark travels on the row, and goes with
        # the next write that does not carry it (the replica was heard).
        marked = T0 + timedelta(seconds=4, milliseconds=250)
        await store.update_replica(
            r1.id, status="ready", reason=None, url="http://127.0.0.1:9", at=later,
            unresponsive_since=marked,
        )  # fmt: skip
        assert (await store.list_replicas())[0].unresponsive_since == marked
        await store.update_replica(
            r1.id, status="ready", reason=None, url="http://127.0.0.1:9", at=later
        )
        assert (await store.list_replicas())[0].unresponsive_since is None
        await store.delete_replica(r2.id)
        await store.delete_replica(r2.id)
        assert [r.id for r in await store.list_replicas()] == [r1.id]
        with pytest.raises(EndpointGone):
            await store.insert_replica(replica(3, "no-such-endpoint"))
        # An endpoint's replicas go with it.
        await store.delete_endpoint(e.id)
        assert await store.list_replicas() == []

    run(body, opener())


# --- change feed ---------------------------------------------------------------------------


def test_change_feed_delivers_every_kind(opener: Opener) -> None:
    async def body(store: Store) -> None:
        feed = store.changes()
        e = endpoint(1)
        await store.insert_endpoint(e, digest(1))
        await store.replace_token(e.id, digest(2), T0)
        await store.add_admin_key(digest(3), T0)
        await store.insert_replica(replica(1, e.id))
        await store.update_endpoint(e.id, EndpointChanges(updated_at=T0, min_replicas=1))
        await store.delete_endpoint(e.id)
        expected = [
            Change(ChangeKind.ENDPOINT, e.id),
            Change(ChangeKind.TOKEN, e.id),
            Change(ChangeKind.TOKEN, e.id),
            Change(ChangeKind.ADMIN_KEY, ""),
            Change(ChangeKind.REPLICA, replica(1, e.id).id),
            Change(ChangeKind.ENDPOINT, e.id),
        ]
        seen = await collect(feed, lambda s: len(s) >= len(expected) + 3)
        assert seen[: len(expected)] == expected
        # Deletion names the endpoint, its token and its replicas.
        assert set(seen[len(expected) :]) == {
            Change(ChangeKind.ENDPOINT, e.id),
            Change(ChangeKind.TOKEN, e.id),
            Change(ChangeKind.REPLICA, replica(1, e.id).id),
        }

    run(body, opener())


@pytest.mark.parametrize("kind", SHARED)
def test_change_feed_sees_another_writer(opener: Opener) -> None:
    async def body(reader: Store, writer: Store) -> None:
        feed = reader.changes()
        e = endpoint(7)
        await writer.insert_endpoint(e, digest(7))
        seen = await collect(feed, lambda s: Change(ChangeKind.TOKEN, e.id) in s)
        assert Change(ChangeKind.ENDPOINT, e.id) in seen
        assert await reader.get_endpoint(e.id) == e

    run(body, opener(), opener())


@pytest.mark.parametrize("kind", SHARED)
def test_concurrent_writers(opener: Opener) -> None:
    async def body(a: Store, b: Store) -> None:
        # One name, two writers at once: exactly one wins.
        results = await asyncio.gather(
            a.insert_endpoint(endpoint(1, "contested"), digest(1)),
            b.insert_endpoint(endpoint(2, "contested"), digest(2)),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["DuplicateName", "NoneType"]
        # Many distinct writes from both: every one kept, none twice.
        await asyncio.gather(
            *((a if n % 2 else b).insert_endpoint(endpoint(n), digest(n)) for n in range(10, 40))
        )
        names = [e.name for e in await a.list_endpoints()]
        assert len(names) == 31
        assert sorted(names) == sorted({*names})
        assert len(await b.active_token_hashes()) == 31

    run(body, opener(), opener())


# --- pages -------------------------------------------------------------------------------


async def walk(store: Store, where: EndpointFilter, limit: int) -> list[list[str]]:
    """Every page of `where`, as ids, following the positions."""
    pages: list[list[str]] = []
    after: int | None = None
    while True:
        page = await store.page_endpoint_ids(where, after, limit)
        assert len(page.items) <= limit
        pages.append(list(page.items))
        if page.after is None:
            return pages
        assert after is None or page.after > after  # positions only move forward
        after = page.after


def test_pages_hold_every_endpoint_once_in_order(opener: Opener) -> None:
    async def body(store: Store) -> None:
        for n in range(1, 8):
            await store.insert_endpoint(endpoint(n), digest(n))
        everything = [e.id for e in await store.list_endpoints()]
        pages = await walk(store, EndpointFilter(), 3)
        assert [len(p) for p in pages] == [3, 3, 1]
        assert [i for p in pages for i in p] == everything
        # A limit the list fills exactly: the last full page says nothing follows.
        assert await walk(store, EndpointFilter(), 7) == [everything]
        assert await walk(store, EndpointFilter(), 100) == [everything]
        assert (await store.page_endpoint_ids(EndpointFilter(), None, 3)).after is not None

    run(body, opener())


def test_page_filters(opener: Opener) -> None:
    async def body(store: Store) -> None:
        rows = [
            endpoint(1, "web-a", project_id="p1"),
            endpoint(2, "web-b", project_id="p2", model_name="tiny-sdxl", model_kind="image"),
            endpoint(3, "batch-a", project_id="p1", location_name="eu-west"),
            endpoint(4, "web_c", project_id="p1"),
            endpoint(5, "webhook", project_id="p3", location_name="eu-west"),
        ]
        for n, row in enumerate(rows, start=1):
            await store.insert_endpoint(row, digest(n))

        async def ids(where: EndpointFilter, limit: int = 2) -> list[str]:
            return [i for p in await walk(store, where, limit) for i in p]

        def of(*ns: int) -> list[str]:
            return [endpoint(n).id for n in ns]

        assert await ids(EndpointFilter(project_ids=frozenset({"p1"}))) == of(1, 3, 4)
        assert await ids(EndpointFilter(project_ids=frozenset({"p1", "p3"}))) == of(1, 3, 4, 5)
        assert await ids(EndpointFilter(project_ids=frozenset())) == []
        assert await ids(EndpointFilter(model_name="tiny-sdxl")) == of(2)
        assert await ids(EndpointFilter(location_name="eu-west")) == of(3, 5)
        assert await ids(EndpointFilter(name_prefix="web")) == of(1, 2, 4, 5)
        # A prefix is literal: no wildcards, case counts.
        assert await ids(EndpointFilter(name_prefix="web_")) == of(4)
        assert await ids(EndpointFilter(name_prefix="web%")) == []
        assert await ids(EndpointFilter(name_prefix="WEB")) == []
        both = EndpointFilter(
            project_ids=frozenset({"p1", "p3"}), location_name="eu-west", name_prefix="web"
        )
        assert await ids(both, limit=1) == of(5)

    run(body, opener())


def test_paging_under_concurrent_inserts_and_deletes(kind: str, opener: Opener) -> None:
    """Endpoints present for the whole walk are seen exactly once, in order,
    while another writer (on a database: another connection) inserts and
    deletes between (and during) pages."""

    async def body(reader: Store, writer: Store) -> None:
        stable = [endpoint(n) for n in range(1, 61, 2)]  # present throughout
        doomed = [endpoint(n) for n in range(2, 61, 2)]  # deleted while paging
        for row in sorted([*stable, *doomed], key=lambda r: r.name):
            await writer.insert_endpoint(row, digest(int(row.id[-4:])))
        stable_ids = {e.id for e in stable}
        order = [e.id for e in await reader.list_endpoints() if e.id in stable_ids]
        assert len(order) == len(stable)
        fresh = iter(range(100, 400))

        async def churn() -> None:
            for row in doomed:
                await writer.delete_endpoint(row.id)
                n = next(fresh)
                await writer.insert_endpoint(endpoint(n), digest(n))
                await asyncio.sleep(0)

        seen: list[str] = []
        after: int | None = None
        churning = asyncio.create_task(churn())
        while True:
            page = await reader.page_endpoint_ids(EndpointFilter(), after, 4)
            seen.extend(page.items)
            if page.after is None:
                break
            after = page.after
            await asyncio.sleep(0)
        await churning
        assert len(await reader.list_endpoints()) == 60  # the churn ran to its end
        assert len(seen) == len(set(seen)), "an endpoint appeared twice"
        assert [i for i in seen if i in stable_ids] == order
        known = {*stable_ids, *(e.id for e in doomed), *(endpoint(n).id for n in range(100, 400))}
        assert set(seen) <= known

    reader = opener()
    run(body, reader, opener() if kind in SHARED else reader)


# --- a database that goes away ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["postgres"])
def test_postgres_restart_writes_unavailable_then_recover(
    opener: Opener, postgres_server: PostgresServer
) -> None:
    async def body(store: Store) -> None:
        feed = store.changes()
        await store.insert_endpoint(endpoint(1), digest(1))
        await collect(feed, lambda s: Change(ChangeKind.TOKEN, endpoint(1).id) in s)

        postgres_server.stop()
        try:
            with pytest.raises(StoreUnavailable) as refused:
                await store.insert_endpoint(endpoint(2), digest(2))
            assert refused.value.status == 503
            assert refused.value.headers()["Retry-After"]
        finally:
            postgres_server.start()

        # Back by itself: no reopen, the first write after the restart works.
        deadline = time.monotonic() + 30
        while True:
            try:
                await store.insert_endpoint(endpoint(3), digest(3))
                break
            except StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        assert [e.id for e in await store.list_endpoints()] == [endpoint(1).id, endpoint(3).id]
        # The feed reconnected and replays from its log.
        await collect(feed, lambda s: Change(ChangeKind.TOKEN, endpoint(3).id) in s, timeout=15)

    run(body, opener())


# --- registered models and measured profiles --------------------------------------------


def registered(name: str, project: str | None = None) -> RegisteredModel:
    spec = load_catalog().models.get("qwen2.5-0.5b-instruct")
    return RegisteredModel(
        spec=replace(spec, name=name, source="/models/" + name),
        project_id=project,
        revision=None,
        architecture_class="Qwen2ForCausalLM",
        hints=ServingHints("tokenizer_config.json", "hermes", None),
        created_at="2026-11-23T10:00:00.000Z",
    )


def test_registered_models(opener: Opener) -> None:
    async def body(store: Store) -> None:
        a, b = registered("a"), registered("bb", project="p1")
        await store.add_model(a)
        await store.add_model(b)
        with pytest.raises(DuplicateModel):
            await store.add_model(registered("a", project="p2"))
        assert await store.get_model("a") == a
        assert await store.get_model("bb") == b
        assert await store.get_model("missing") is None
        assert [m.name for m in await store.list_models()] == ["a", "bb"]
        assert await store.delete_model("a") is True
        assert await store.delete_model("a") is False
        assert [m.name for m in await store.list_models()] == ["bb"]

    run(body, opener())


def test_profiles_replace_per_model_gpu_type_and_count(opener: Opener) -> None:
    def profile(gpu: str, point: ProfilePoint, at: str) -> MeasuredProfile:
        return MeasuredProfile("m", gpu, 1, "chat", 512, 128, (point,), at)

    async def body(store: Store) -> None:
        first = profile("H100-80GB", ProfilePoint(1, 8, 90.0, 0.05, 0.011), "2026-11-23T10:00Z")
        second = profile("H100-80GB", ProfilePoint(4, 8, 300.0, 0.08, 0.013), "2026-11-23T11:00Z")
        other = profile("L4", ProfilePoint(1, 8, 20.0, 0.2, 0.05), "2026-11-23T11:00Z")
        for p in (first, second, other):
            await store.put_profile(p)
        assert sorted(await store.list_profiles(), key=lambda p: p.gpu_type) == [second, other]

    run(body, opener())


def test_model_changes_reach_the_feed(opener: Opener) -> None:
    async def body(store: Store) -> None:
        feed = store.changes()
        await store.add_model(registered("a"))
        await store.put_profile(
            MeasuredProfile("a", "L4", 1, "chat", 1, 1, (ProfilePoint(1, 1, 1.0, 0.1, 0.1),))
        )
        await store.delete_model("a")
        await store.delete_model("a")  # nothing deleted: nothing to tell
        expected = [
            Change(ChangeKind.MODEL, "a"),
            Change(ChangeKind.MODEL, ""),
            Change(ChangeKind.MODEL, "a"),
        ]
        assert await collect(feed, lambda s: len(s) >= len(expected)) == expected

    run(body, opener())


def test_replica_writes_under_the_current_leader_term(opener: Opener, kind: str) -> None:
    """A leader's writes carry its term. A single-instance store has no other
    leader and takes any term; PostgreSQL takes the current one (0 here: no
    election has run), refusing others (tests/integration/test_leader_postgres.py)."""

    async def body(store: Store) -> None:
        term = 7
        if kind == "postgres":
            term = 0  # the migrations' leader row
        e = endpoint(1)
        await store.insert_endpoint(e, digest(1))
        r1 = replica(1, e.id)
        await store.insert_replica(r1, term=term)
        later = T0 + timedelta(seconds=3)
        await store.update_replica(
            r1.id, status="ready", reason=None, url=None, at=later, term=term
        )
        assert await store.list_replicas() == [replace(r1, status="ready", updated_at=later)]
        await store.delete_replica(r1.id, term=term)
        assert await store.list_replicas() == []

    run(body, opener())


# --- LoRA adapters --------------------------------------------------------------------


def adapter(endpoint_id: str, name: str, rank: int = 8) -> Adapter:
    return Adapter(endpoint_id, name, f"/adapters/{name}", rank, T0, base_model="base")


def test_adapters_belong_to_their_endpoint(opener: Opener) -> None:
    async def body(store: Store) -> None:
        a = replace(endpoint(1), engine_settings=EngineSettings(maxLoras=4, maxLoraRank=32))
        b = endpoint(2)
        await store.insert_endpoint(a, digest(1))
        await store.insert_endpoint(b, digest(2))
        assert await store.get_endpoint(a.id) == a  # the LoRA settings round-trip
        lora = EngineSettings(maxLoras=2, maxLoraRank=8)
        changed = await store.update_endpoint(
            b.id, EndpointChanges(updated_at=T0, engine_settings=lora)
        )
        assert (changed.max_loras, changed.max_lora_rank) == (2, 8)

        first, second = adapter(a.id, "sql"), adapter(a.id, "poems", rank=16)
        await store.add_adapter(first)
        await store.add_adapter(second)
        await store.add_adapter(adapter(b.id, "sql"))  # another endpoint: another namespace
        with pytest.raises(DuplicateAdapter):
            await store.add_adapter(adapter(a.id, "sql", rank=4))
        with pytest.raises(EndpointGone):
            await store.add_adapter(adapter("no-such-endpoint", "x"))
        assert await store.list_adapters(a.id) == [first, second]
        assert [x.endpoint_id for x in await store.list_adapters()] == [a.id, a.id, b.id]

        assert await store.delete_adapter(a.id, "sql") is True
        assert await store.delete_adapter(a.id, "sql") is False
        assert await store.list_adapters(a.id) == [second]

        await store.mark_deleting(a.id, T0)
        with pytest.raises(EndpointGone):  # no adapter joins an endpoint on its way out
            await store.add_adapter(adapter(a.id, "late"))
        assert await store.delete_endpoint(a.id) is True
        assert [x.endpoint_id for x in await store.list_adapters()] == [b.id]

    run(body, opener())


def test_adapter_changes_reach_the_feed(opener: Opener) -> None:
    async def body(store: Store) -> None:
        e = endpoint(1)
        feed = store.changes()
        await store.insert_endpoint(e, digest(1))
        await store.add_adapter(adapter(e.id, "sql"))
        await store.delete_adapter(e.id, "sql")
        await store.delete_adapter(e.id, "sql")  # nothing deleted: nothing to tell
        expected = [Change(ChangeKind.ADAPTER, e.id), Change(ChangeKind.ADAPTER, e.id)]

        def adapters(seen: list[Change]) -> list[Change]:
            return [c for c in seen if c.kind is ChangeKind.ADAPTER]

        seen = await collect(feed, lambda s: len(adapters(s)) >= len(expected))
        assert adapters(seen) == expected

    run(body, opener())


def test_adapter_usage_adds_up_per_endpoint_adapter_and_hour(opener: Opener) -> None:
    async def body(store: Store) -> None:
        first, second = opener(), store  # two writers (two instances) add up
        hour, later = T0.replace(minute=0), T0.replace(minute=0) + timedelta(hours=1)
        await first.add_adapter_usage([AdapterUsage("e1", "sql", hour, 2, 20, 30)])
        await second.add_adapter_usage(
            [
                AdapterUsage("e1", "sql", hour, 1, 5, 6),
                AdapterUsage("e1", "sql", later, 1, 1, 1),
                AdapterUsage("e1", "poems", hour, 9, 9, 9),
                AdapterUsage("e2", "sql", hour, 7, 7, 7),
            ]
        )
        assert await store.adapter_usage("e1", "sql") == [
            AdapterUsage("e1", "sql", hour, 3, 25, 36),
            AdapterUsage("e1", "sql", later, 1, 1, 1),
        ]
        assert await store.adapter_usage("e1", "none") == []

    store = opener()
    if isinstance(store, MemoryStore):
        # One process's memory: the "second instance" is the same store.
        opener = lambda: store  # noqa: E731
    run(body, store)


def client_token(endpoint_id: str, name: str, n: int, per_minute: int | None = None) -> ClientToken:
    return ClientToken(endpoint_id, name, digest(n), f"infd_ep_...{n:04}", T0, 2.5, per_minute)


def test_client_tokens_belong_to_their_endpoint_and_reach_the_feed(opener: Opener) -> None:
    async def body(store: Store) -> None:
        a, b = endpoint(1), endpoint(2)
        await store.insert_endpoint(a, digest(1))
        await store.insert_endpoint(b, digest(2))
        feed = store.changes()
        first, second = client_token(a.id, "app", 11, 60), client_token(a.id, "cli", 12)
        await store.add_client_token(first, limit=2)
        await store.add_client_token(second, limit=2)
        await store.add_client_token(client_token(b.id, "app", 13), limit=2)
        with pytest.raises(DuplicateClientToken):
            await store.add_client_token(client_token(b.id, "app", 14), limit=5)
        with pytest.raises(TooManyClientTokens):
            await store.add_client_token(client_token(a.id, "third", 15), limit=2)
        with pytest.raises(EndpointGone):
            await store.add_client_token(client_token("no-such-endpoint", "x", 16), limit=2)
        assert await store.client_tokens(a.id) == [first, second]  # every field round-trips
        assert [t.endpoint_id for t in await store.client_tokens()] == [a.id, a.id, b.id]

        used = T0 + timedelta(minutes=5)
        await store.touch_client_tokens({(a.id, "app"): used})
        await store.touch_client_tokens({(a.id, "app"): T0})  # never moved back
        assert (await store.client_tokens(a.id))[0].last_used_at == used

        assert await store.delete_client_token(a.id, "app") is True
        assert await store.delete_client_token(a.id, "app") is False
        assert await store.client_tokens(a.id) == [second]
        await store.mark_deleting(b.id, T0)  # its tokens stop counting as live
        assert [t.name for t in await store.client_tokens()] == ["cli"]
        with pytest.raises(EndpointGone):
            await store.add_client_token(client_token(b.id, "late", 17), limit=5)
        assert await store.delete_endpoint(a.id) is True
        assert await store.client_tokens(a.id) == []

        # The writes told the token cache of both endpoints (a feed may
        # deliver a key's changes coalesced).
        def told(seen: list[Change]) -> set[str]:
            return {c.id for c in seen if c.kind is ChangeKind.TOKEN}

        assert told(await collect(feed, lambda s: told(s) == {a.id, b.id})) == {a.id, b.id}

    run(body, opener())


@pytest.mark.parametrize("kind", SHARED)
def test_two_instances_take_from_one_rate_limit_bucket_and_lose_no_admission(
    opener: Opener,
) -> None:
    """Two writers exchanging at once (each its own key order) neither lose
    an admission nor deadlock; the bucket refills and goes below zero."""
    now = 1_800_000_000.0
    keys = [("ep", "a"), ("ep", "b")]

    async def body(first: Store, second: Store) -> None:
        async def exchange(store: Store, n: int) -> None:
            await store.exchange_rate_spend({k: (1, 60) for k in keys[:: 1 - 2 * (n % 2)]}, now)

        await asyncio.gather(*(exchange((first, second)[n % 2], n) for n in range(30)))
        levels = await second.exchange_rate_spend({k: (0, 60) for k in keys}, now)
        assert levels == {k: pytest.approx(30.0) for k in keys}
        later = await first.exchange_rate_spend({keys[0]: (50, 60)}, now + 10)
        assert later == {keys[0]: pytest.approx(30 + 10 - 50)}

    run(body, opener(), opener())


def test_a_batch_keeps_its_client_and_meters_each_result_once(opener: Opener) -> None:
    """The client that created a batch and its capacity setting round-trip
    (through a move too); a request's usage is
    added to its endpoint's hour with its result, and a second result for
    the same request (a re-run after a failover) is refused and adds none."""

    async def body(store: Store) -> None:
        ep = endpoint(1)
        await store.insert_endpoint(ep, digest(1))
        line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
        batch = Batch(
            "batch_" + "0" * 24, ep.id, ep.project_id, "/v1/chat/completions", "file-x",
            BatchStatus.VALIDATING, T0, T0 + WINDOW, counts=Counts(total=1), client="app",
            capacity=Capacity.RUNNING,
        )  # fmt: skip
        await store.create_batch(batch, parse_batch_file(line, 10))
        assert await store.get_batch(batch.id) == batch  # every field round-trips
        moved = await store.move_batch(
            batch.id, (BatchStatus.VALIDATING,), BatchStatus.IN_PROGRESS, T0, None
        )
        assert moved is not None and moved.capacity is Capacity.RUNNING
        done = Result(0, RequestState.DONE, "{}", 5, 7, 0.0, T0)
        assert await store.record_result(batch.id, done, None) is True
        assert await store.record_result(batch.id, done, None) is False
        (row,) = await store.usage(endpoint_id=ep.id)
        assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 5, 7)
        assert (row.gpu_type, row.gpu_count, row.hour) == (
            ep.gpu_type,
            ep.gpu_count,
            T0.replace(minute=0, second=0, microsecond=0),
        )

    run(body, opener())
