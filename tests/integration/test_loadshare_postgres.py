"""The shared load table and the wake-up notification on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from inferd.control import loadshare
from inferd.control.loadshare import (
    WAKE_CHANNEL,
    Listener,
    LocalLoad,
    max_age,
    remote_samples,
)
from inferd.testing_postgres import PostgresServer


@pytest.fixture
def db(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


async def connect(url: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await loadshare.ensure_schema(conn)
    return conn


def test_the_leader_sums_what_every_instance_published(db: str) -> None:
    async def scenario() -> None:
        a, b = await connect(db), await connect(db)
        mono = time.monotonic()
        await loadshare.publish(a, "a", [LocalLoad("e1", 2, 1, mono - 5.0)], mono)
        await loadshare.publish(
            b, "b", [LocalLoad("e1", 3, 0, mono - 1.0), LocalLoad("e2", 0, 0, None)], mono
        )
        reports, db_now = await loadshare.read_reports(a)
        # As the leader (a third instance) reads them, on its own clock.
        samples = remote_samples(reports, "leader", db_now, 100.0, max_age(1.0))
        by_key = {(s.source, s.endpoint_id): s for s in samples}
        assert set(by_key) == {("a", "e1"), ("b", "e1"), ("b", "e2")}
        assert (by_key["a", "e1"].in_flight, by_key["a", "e1"].held) == (2, 1)
        assert by_key["b", "e1"].in_flight == 3
        # b's last request, one second before the read.
        last = by_key["b", "e1"].last_request_at
        assert last is not None and abs((100.0 - last) - 1.0) < 0.5
        assert by_key["b", "e2"].last_request_at is None
        # A second round replaces the rows instead of adding to them.
        await loadshare.publish(a, "a", [LocalLoad("e1", 0, 0, mono - 5.0)], mono)
        reports, db_now = await loadshare.read_reports(a)
        samples = remote_samples(reports, "leader", db_now, 100.0, 3.0)
        assert sum(s.in_flight for s in samples if s.endpoint_id == "e1") == 3
        await loadshare.forget_instance(b, "b")
        reports, _ = await loadshare.read_reports(a)
        assert {r.instance_id for r in reports} == {"a"}
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_a_held_request_wakes_the_listener_with_its_row_written(db: str) -> None:
    async def scenario() -> None:
        conn = await connect(db)
        woken: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

        async def on_notify(channel: str, payload: str) -> None:
            # The row is committed together with the notification.
            reports, _ = await loadshare.read_reports(conn)
            held = sum(r.held for r in reports if r.endpoint_id == payload)
            await woken.put((payload, held))

        listener = Listener(db, [WAKE_CHANNEL], on_notify, lambda: None)
        listener.start()
        await asyncio.wait_for(listener.connected.wait(), 10)
        sent = time.monotonic()
        await loadshare.publish_and_wake(conn, "a", LocalLoad("e7", 0, 1, sent), sent)
        got = await asyncio.wait_for(woken.get(), 5)
        assert got == ("e7", 1)
        assert time.monotonic() - sent < 1.0
        await listener.stop()
        await conn.close()

    asyncio.run(scenario())


def test_the_listener_resyncs_after_losing_its_connection(db: str) -> None:
    async def scenario() -> None:
        resyncs: list[float] = []
        notes: list[str] = []
        listener = Listener(
            db,
            [WAKE_CHANNEL],
            lambda channel, payload: notes.append(payload),
            lambda: resyncs.append(time.monotonic()),
            retry_s=0.1,
        )
        listener.start()
        await asyncio.wait_for(listener.connected.wait(), 10)
        assert len(resyncs) == 1
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            )
            deadline = time.monotonic() + 10
            while len(resyncs) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await admin.execute("SELECT pg_notify(%s, 'after')", (WAKE_CHANNEL,))
            while not notes:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        assert notes == ["after"]
        await listener.stop()

    asyncio.run(scenario())
