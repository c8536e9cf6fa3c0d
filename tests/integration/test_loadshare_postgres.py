"""The shared load table and the wake-up notification on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from inferd.control.cluster import postgres as loadshare
from inferd.control.cluster.lease import LeaseSettings
from inferd.control.cluster.loadshare import LocalLoad, max_age, remote_samples
from inferd.control.cluster.postgres import WAKE_CHANNEL, Postgres
from inferd.testing.postgres import PostgresServer


@pytest.fixture
def db(postgres_server: PostgresServer) -> str:
    return postgres_server.create_migrated_database()


async def connect(url: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


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


def test_the_leader_listens_again_after_losing_its_connection(db: str) -> None:
    """Wake-ups sent while it was not listening are gone: it reads the table
    again on reconnecting, and hears the next wake-up."""

    async def scenario() -> None:
        woken: list[str] = []
        leader = Postgres(
            db,
            "a",
            traffic=list,
            on_remote_load=lambda sample: None,
            on_wake=woken.append,
            interval_s=0.2,
            lease=LeaseSettings(retry_s=0.1, check_s=0.2, check_timeout_s=1.0),
        )

        class Duties:
            async def start(self, term: int) -> None: ...

            async def stop(self) -> None: ...

        await leader.start(Duties())
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as admin:

            async def listeners() -> int:
                cursor = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'"
                )
                row = await cursor.fetchone()
                return int(row[0]) if row else 0

            deadline = time.monotonic() + 10
            while await listeners() == 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # its first read of the table is done
            # Held without a notification (as one sent while nobody
            # listened): found by the read after reconnecting.
            await loadshare.publish(admin, "b", [LocalLoad("missed", 0, 1, None)], 0.0)
            assert "missed" not in woken
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            )
            while "missed" not in woken:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await admin.execute("SELECT pg_notify(%s, 'after')", (WAKE_CHANNEL,))
            while "after" not in woken:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        await leader.stop()

    asyncio.run(scenario())
