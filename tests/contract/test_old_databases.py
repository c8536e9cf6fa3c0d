"""A database written by the code before the SQL core opens, migrates and
reads the same with the code now.

`old_databases/*.sql` are dumps of databases that `old_databases/make.py`
wrote through the store port with the stores of commit 2d2ceec (SQLite's
own, PostgreSQL's own); each test loads one into a fresh database, opens it
with `open_store` and reads every kind of record back.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from inferd.control.accounts.model import AuditAction, Membership, Project, User, UserKey
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Role
from inferd.control.model import Adapter, AdapterUsage, Change, ChangeKind
from inferd.control.stores import open_store
from inferd.control.stores.sql.migrations import latest_version
from inferd.testing.postgres import PostgresServer
from tests.contract.old_databases.schema import postgres_schema, sqlite_schema

DUMPS = Path(__file__).parent / "old_databases"
T0 = datetime(2026, 11, 1, 12, 0, 0, 123000, tzinfo=UTC)
HOUR = T0.replace(minute=0, second=0, microsecond=0)
ENDPOINT = "00000000-0000-4000-8000-000000000001"


@pytest.fixture(params=["sqlite", "postgres"])
def old_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    dump = (DUMPS / f"{request.param}.sql").read_text()
    if request.param == "sqlite":
        conn = sqlite3.connect(tmp_path / "old.db")
        conn.executescript(dump)
        conn.close()
        return f"sqlite:///{tmp_path / 'old.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(dump)  # a dump: many statements, no parameters
    return url


def test_an_old_database_reads_the_same(old_url: str) -> None:
    async def body() -> None:
        store = open_store(old_url)
        assert await store.schema_version() == latest_version()
        (endpoint,) = await store.list_endpoints()
        assert (endpoint.id, endpoint.name, endpoint.project_id) == (ENDPOINT, "chat", "team")
        assert (endpoint.created_at, endpoint.hourly_price) == (T0, 1.25)
        assert endpoint.max_loras == 2
        assert await store.active_token_hashes() == {ENDPOINT: b"t" * 32}
        (replica,) = await store.list_replicas()
        assert (replica.id, replica.status, replica.placement) == ("r-1", "ready", {"pid": "42"})
        assert (replica.secret_hash, replica.created_at) == (b"s" * 32, T0)
        assert await store.list_adapters(ENDPOINT) == [
            Adapter(ENDPOINT, "sql", "/adapters/sql", 8, T0, base_model="tiny-chat")
        ]
        assert await store.adapter_usage(ENDPOINT, "sql") == [
            AdapterUsage(ENDPOINT, "sql", HOUR, 3, 30, 40)
        ]
        limit = Quota(replicas=9)
        assert await store.get_project("team") == Project(
            "team", T0, Quota(endpoints=3, gpus={"A100": 8}), limit
        )
        assert await store.get_user("ann") == User("ann", T0)
        assert await store.members_of("team") == [Membership("team", "ann", Role.ADMIN, T0)]
        key = UserKey("k1", "ann", "laptop", b"k" * 32, "ik_ab...wxyz", T0,
                      T0 + timedelta(hours=1), None, "team")  # fmt: skip
        assert await store.keys_of("ann") == [key]
        (entry,) = await store.audit("team")
        assert (entry.at, entry.action, entry.detail) == (
            T0,
            AuditAction.ENDPOINT_CREATE,
            {"name": "chat"},
        )
        (usage,) = await store.usage(project_id="team")
        assert (usage.hour, usage.replica_seconds, usage.requests) == (HOUR, 12.5, 3)
        assert await store.admin_key_hashes() == [b"a" * 32]
        # And it takes writes as before: the change log goes on from where it was.
        feed = store.changes()
        assert await store.delete_endpoint(ENDPOINT)
        seen = await asyncio.wait_for(_until_endpoint(feed), 5)
        assert seen == ENDPOINT and await store.list_adapters() == []
        await store.close()

    asyncio.run(body())


async def _until_endpoint(feed: AsyncIterator[Change]) -> str:
    async for change in feed:
        if change.kind is ChangeKind.ENDPOINT:
            return str(change.id)
    raise AssertionError("the feed ended")


def test_a_new_database_gets_the_schema_it_got_before(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The one migration list builds what each engine's own list built:
    `old_databases/schema.*` were taken from databases the code before the
    SQL core created."""
    path = tmp_path / "new.db"
    asyncio.run(open_store(f"sqlite:///{path}").close())
    assert sqlite_schema(path) == (DUMPS / "schema-sqlite.txt").read_text()
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database()
    asyncio.run(open_store(url).close())
    assert postgres_schema(server, url) == (DUMPS / "schema-postgres.sql").read_text()
