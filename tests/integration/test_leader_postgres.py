"""Leader election and fencing on a real PostgreSQL: what only the
`Postgres` coordination has (a session that dies, a server restart, the
store's fenced writes). What every adapter does is in
tests/contract/test_coordination.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta

import psycopg
import pytest

from inferd.control.cluster.lease import LeaseSettings
from inferd.control.cluster.ports import Deposed
from inferd.control.cluster.postgres import Postgres, check_term_sync, fenced, read_leader
from inferd.control.model import StoreUnavailable
from inferd.control.ports import Store
from inferd.control.stores import open_store
from inferd.testing.postgres import PostgresServer
from tests.records import T0, endpoint_row, replica_record
from tests.timings import HANG_S, record_timing

FAST = LeaseSettings(retry_s=0.1, check_s=0.2, check_timeout_s=1.0)


class Duties:
    def __init__(self) -> None:
        self.events: list[tuple[str, int | None]] = []

    async def start(self, term: int) -> None:
        self.events.append(("start", term))

    async def stop(self) -> None:
        self.events.append(("stop", None))


@pytest.fixture
def db(postgres_server: PostgresServer) -> str:
    return postgres_server.create_migrated_database()


class Election:
    """The election part of a `Postgres` coordination (no load to share)."""

    def __init__(self, url: str, name: str, duties: Duties) -> None:
        self.duties = duties
        self.coordination = Postgres(
            url,
            name,
            traffic=list,
            on_remote_load=lambda sample: None,
            on_wake=lambda endpoint_id: None,
            lease=FAST,
        )

    def start(self) -> None:
        self._joining = asyncio.ensure_future(self.coordination.start(self.duties))

    async def stop(self) -> None:
        await self.coordination.stop()

    @property
    def leading(self) -> bool:
        return self.coordination.term is not None

    @property
    def term(self) -> int | None:
        return self.coordination.term


async def until(predicate: object, timeout: float = 10.0) -> float:
    """Seconds until `predicate()` holds (fails the test past `timeout`)."""
    start = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_one_leader_and_a_new_term_on_hand_over(db: str) -> None:
    async def scenario() -> None:
        duties_a, duties_b = Duties(), Duties()
        a = Election(db, "a", duties_a)
        b = Election(db, "b", duties_b)
        a.start()
        await until(lambda: a.leading)
        b.start()
        await asyncio.sleep(0.5)  # several tries by b
        assert a.term == 1 and not b.leading
        info = b.coordination.leader()
        assert (info.holder, info.term) == ("a", 1)
        await a.stop()
        assert duties_a.events == [("start", 1), ("stop", None)]
        took = await until(lambda: b.leading, timeout=HANG_S)
        record_timing("leader: hand-over after a stop", took)
        assert b.term == 2 and duties_b.events == [("start", 2)]
        await b.stop()

    asyncio.run(scenario())


def test_a_leader_whose_session_dies_stops_leading(db: str) -> None:
    async def scenario() -> None:
        duties_a, duties_b = Duties(), Duties()
        a = Election(db, "a", duties_a)
        b = Election(db, "b", duties_b)
        a.start()
        await until(lambda: a.leading)
        b.start()
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'inferd-leader a'"
            )
        await until(lambda: not a.leading, timeout=FAST.lease_s + 1)
        assert duties_a.events[-1] == ("stop", None)
        await until(lambda: b.leading or a.leading)
        leaders = [e for e in (a, b) if e.leading]
        assert len(leaders) == 1 and leaders[0].term == 2
        await a.stop()
        await b.stop()

    asyncio.run(scenario())


def test_a_deposed_leaders_write_is_refused(db: str) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            await conn.execute("CREATE TABLE decisions (what text)")
            await conn.execute("UPDATE inferd_leader SET term = 5 WHERE id = 1")
            async with fenced(conn, 5):
                await conn.execute("INSERT INTO decisions VALUES ('by term 5')")
            await conn.execute("UPDATE inferd_leader SET term = 6 WHERE id = 1")
            with pytest.raises(Deposed) as refused:
                async with fenced(conn, 5):
                    await conn.execute("INSERT INTO decisions VALUES ('late, by term 5')")
            assert (refused.value.writer_term, refused.value.current_term) == (5, 6)
            rows = await (await conn.execute("SELECT what FROM decisions")).fetchall()
            assert rows == [("by term 5",)]

    asyncio.run(scenario())


def test_a_new_term_waits_for_a_fenced_write_in_progress(db: str) -> None:
    """The check and the write are one: a term taken while a fenced write
    is open begins only after that write committed."""

    async def scenario() -> None:
        async with (
            await psycopg.AsyncConnection.connect(db, autocommit=True) as writer,
            await psycopg.AsyncConnection.connect(db, autocommit=True) as usurper,
        ):
            order: list[str] = []

            async def bump() -> None:
                await usurper.execute("UPDATE inferd_leader SET term = term + 1 WHERE id = 1")
                order.append("new term")

            async with fenced(writer, 0):
                bumping = asyncio.ensure_future(bump())
                await asyncio.sleep(0.3)
                assert order == []  # blocked by the fenced transaction
                order.append("write committed")
            await bumping
            assert order == ["write committed", "new term"]
            info = await read_leader(writer)
            assert info is not None and info.term == 1

    asyncio.run(scenario())


def test_leadership_returns_after_a_postgres_restart(postgres_server: PostgresServer) -> None:
    db = postgres_server.create_migrated_database()

    async def scenario() -> None:
        duties = Duties()
        a = Election(db, "a", duties)
        a.start()
        await until(lambda: a.leading)
        await asyncio.to_thread(postgres_server.stop, "fast")
        await until(lambda: not a.leading, timeout=FAST.lease_s + 1)
        await asyncio.to_thread(postgres_server.start)
        await until(lambda: a.leading, timeout=15)
        assert a.term == 2
        assert duties.events == [("start", 1), ("stop", None), ("start", 2)]
        await a.stop()

    asyncio.run(scenario())


class StoreDuties(Duties):
    """Duties that read the store as they start, as the replica duty does."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.failed = 0

    async def start(self, term: int) -> None:
        try:
            await self.store.list_replicas()
        except Exception:
            self.failed += 1
            raise
        await super().start(term)


def test_after_an_outage_no_claim_before_the_store_can_serve(
    postgres_server: PostgresServer,
) -> None:
    """While the database is away, `/healthz` names no leader (not this
    instance with `self: false`); once it is back, the instance claims the
    lead only when the store's pool answers, so its duties start at the
    first claim instead of failing and being elected again."""
    db = postgres_server.create_migrated_database()

    async def scenario() -> None:
        store = await asyncio.to_thread(open_store, db)
        duties = StoreDuties(store)
        a = Postgres(
            db,
            "a",
            traffic=list,
            on_remote_load=lambda sample: None,
            on_wake=lambda endpoint_id: None,
            ready=store.schema_version,
            lease=FAST,
        )
        try:
            await a.start(duties)
            await until(lambda: a.term is not None)
            assert a.health()["leader"] == {"instance": "a", "term": 1, "self": True}
            await asyncio.to_thread(postgres_server.stop, "fast")
            await until(lambda: a.term is None, timeout=FAST.lease_s + 1)
            assert a.health()["leader"] == {"instance": None, "term": None, "self": False}
            # The server's parts keep asking the store meanwhile, so its
            # pool backs off reconnecting; tries during the outage claim nothing.
            for _ in range(3):
                with contextlib.suppress(StoreUnavailable):
                    await store.list_replicas()
            assert a.health()["leader"]["instance"] is None
            await asyncio.to_thread(postgres_server.start)
            await until(lambda: len(duties.events) == 3 or duties.failed > 0, timeout=20)
            assert a.term == 2
            assert duties.failed == 0
            assert duties.events == [("start", 1), ("stop", None), ("start", 2)]
            assert a.health()["leader"] == {"instance": "a", "term": 2, "self": True}
        finally:
            await a.stop()
            await store.close()

    asyncio.run(scenario())


def test_the_synchronous_check_fences_a_store_transaction(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE decisions (what text)")
        conn.execute("UPDATE inferd_leader SET term = 2 WHERE id = 1")
        with conn.transaction():
            check_term_sync(conn, 2)
            conn.execute("INSERT INTO decisions VALUES ('by term 2')")
        with pytest.raises(Deposed), conn.transaction():
            check_term_sync(conn, 1)
            conn.execute("INSERT INTO decisions VALUES ('late')")
        assert conn.execute("SELECT what FROM decisions").fetchall() == [("by term 2",)]


def test_a_deposed_leaders_late_replica_write_is_refused_by_the_store(db: str) -> None:
    """Leader A's session dies and B takes over with a higher term; A's
    late replica writes under its old term change nothing, B's go through."""

    async def scenario() -> None:
        store_a, store_b = open_store(db), open_store(db)
        duties_a, duties_b = Duties(), Duties()
        a = Election(db, "a", duties_a)
        b = Election(db, "b", duties_b)
        try:
            a.start()
            await until(lambda: a.leading)
            old_term = a.term
            assert old_term is not None
            e = endpoint_row()
            await store_a.insert_endpoint(e, bytes(32))
            r1 = replica_record(1, e.id)
            await store_a.insert_replica(r1, term=old_term)
            b.start()
            async with await psycopg.AsyncConnection.connect(db, autocommit=True) as admin:
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'inferd-leader a'"
                )
            await until(lambda: b.leading)
            new_term = b.term
            assert new_term is not None and new_term > old_term
            later = T0 + timedelta(seconds=5)

            with pytest.raises(Deposed) as refused:
                await store_a.update_replica(
                    r1.id, status="failed", reason="late", url=None, at=later, term=old_term
                )
            assert (refused.value.writer_term, refused.value.current_term) == (old_term, new_term)
            with pytest.raises(Deposed):
                await store_a.delete_replica(r1.id, term=old_term)
            with pytest.raises(Deposed):
                await store_a.insert_replica(replica_record(2, e.id), term=old_term)
            assert await store_b.list_replicas() == [r1]  # nothing of A's got in
            # Acts that are not store writes (removing a cluster's unrecorded
            # replicas) ask first, and are refused the same way.
            with pytest.raises(Deposed):
                await store_a.confirm_term(old_term)
            await store_b.confirm_term(new_term)

            await store_b.update_replica(
                r1.id,
                status="ready",
                reason=None,
                url="http://127.0.0.1:9",
                at=later,
                term=new_term,
            )
            (row,) = await store_b.list_replicas()
            assert (row.status, row.url, row.updated_at) == ("ready", "http://127.0.0.1:9", later)
            await store_b.delete_replica(r1.id, term=new_term)
            assert await store_b.list_replicas() == []
        finally:
            await a.stop()
            await b.stop()
            await store_a.close()
            await store_b.close()

    asyncio.run(scenario())
