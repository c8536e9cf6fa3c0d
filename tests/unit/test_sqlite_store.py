"""SQLite store: what is SQLite's own (pragmas, migrations, the file).
Behaviour shared by every store is in tests/contract/test_store.py."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from inferd.control.endpoints.tokens import hash_token, new_endpoint_token
from inferd.control.model import Endpoint, EndpointChanges, SchemaTooNew, parse_rfc3339
from inferd.control.stores import open_store, sqlite_path
from inferd.control.stores.sql import migrations
from inferd.control.stores.sql.migrations import Migration, latest_version, migrate
from inferd.control.stores.sql.sqlite_dialect import SqliteDialect
from inferd.control.stores.sql.store import SqliteStore
from tests.records import endpoint_row

NOW = "2025-01-01T00:00:00.000Z"
T0 = parse_rfc3339(NOW)
LATER = parse_rfc3339("2025-01-01T00:05:00.000Z")


def row(name: str = "ep", endpoint_id: str = "00000000-0000-4000-8000-000000000001") -> Endpoint:
    return endpoint_row(
        name=name, id=endpoint_id, max_replicas=1, hourly_price=0.0, created_at=T0, updated_at=T0
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore.open(tmp_path / "state" / "inferd.db")
    yield s
    asyncio.run(s.close())


def test_url_forms(tmp_path: Path) -> None:
    assert sqlite_path("sqlite:////var/lib/inferd.db") == "/var/lib/inferd.db"
    assert sqlite_path("sqlite:///inferd.db") == "inferd.db"
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    assert isinstance(store, SqliteStore) and store.path == tmp_path / "a.db"
    asyncio.run(store.close())


def test_pragmas(store: SqliteStore) -> None:
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL
    assert store.pragma("foreign_keys") == 1
    assert store.integrity_check() == "ok"


def test_migrations_recorded_and_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "inferd.db"
    asyncio.run(SqliteStore.open(path).close())
    dialect = SqliteDialect(path)
    versions = dialect.conn.execute("SELECT version, name FROM schema_migrations").fetchall()
    assert [v for v, _ in versions] == list(range(1, latest_version() + 1))
    assert migrate(dialect) == []  # nothing left to apply
    dialect.close()
    reopened = SqliteStore.open(path)
    assert asyncio.run(reopened.schema_version()) == latest_version()
    asyncio.run(reopened.close())


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in migrations.MIGRATIONS] == list(
        range(1, len(migrations.MIGRATIONS) + 1)
    )


def test_every_engine_fills_every_type_token() -> None:
    # A token missing from an engine's map would reach its database as `<name>`.
    for engine in migrations.DDL_TYPES:
        for migration in migrations.MIGRATIONS:
            for statement in migration.step(engine).statements:
                assert re.search(r"<[a-z_]+>", statement) is None, (engine, migration.version)


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    dialect = SqliteDialect(tmp_path / "x.db")
    conn = dialect.conn
    broken = (
        *migrations.MIGRATIONS,
        Migration(
            latest_version() + 1,
            "broken",
            ("CREATE TABLE half_done (x INTEGER)", "THIS IS NOT SQL"),
        ),
    )
    with pytest.raises(sqlite3.OperationalError):
        migrate(dialect, broken)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half_done" not in tables
    assert "endpoints" in tables  # earlier migrations stay applied
    assert max(r[0] for r in conn.execute("SELECT version FROM schema_migrations")) == (
        latest_version()
    )
    conn.close()


def test_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "inferd.db"
    asyncio.run(SqliteStore.open(path).close())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', ?)", (NOW,))
    conn.close()
    with pytest.raises(SchemaTooNew):
        SqliteStore.open(path)


def test_a_version_2_database_migrates_forward(tmp_path: Path) -> None:
    """A database written before placement and projects existed keeps its
    endpoints, tokens and replicas; pid and GPUs move into the placement."""
    path = tmp_path / "inferd.db"
    dialect = SqliteDialect(path)
    conn = dialect.conn
    migrate(dialect, migrations.MIGRATIONS[:2])
    values = (row().id, "old", "tiny-chat", "chat", "cpu", 1, "local", 0, 1, 60, 0.0, "USD")
    conn.execute(
        "INSERT INTO endpoints (id, name, model_name, model_kind, gpu_type, gpu_count,"
        " location_name, min_replicas, max_replicas, retention_seconds, hourly_price,"
        " currency, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (*values, NOW, NOW),
    )
    digest = hash_token(new_endpoint_token())
    conn.execute(
        "INSERT INTO endpoint_tokens (endpoint_id, token_hash, created_at) VALUES (?, ?, ?)",
        (row().id, digest, NOW),
    )
    conn.execute(
        "INSERT INTO replicas VALUES ('r-1', ?, 1, 'A100', 2, '0,3', 4242, ?, 'ready',"
        " NULL, 'http://127.0.0.1:9', ?, ?)",
        (row().id, b"s" * 32, NOW, NOW),
    )
    conn.close()

    store = SqliteStore.open(path)

    async def check() -> None:
        (endpoint,) = await store.list_endpoints()
        assert endpoint.name == "old" and endpoint.project_id == "default"
        assert endpoint.created_at == T0
        assert await store.active_token_hashes() == {row().id: digest}
        (replica,) = await store.list_replicas()
        assert (replica.node, replica.placement) == ("local", {"pid": "4242", "gpu_ids": "0,3"})
        assert (replica.status, replica.url) == ("ready", "http://127.0.0.1:9")
        await store.close()

    asyncio.run(check())


@pytest.mark.parametrize("version", [3, 4])
def test_a_version_3_or_4_database_migrates_to_accounts(tmp_path: Path, version: int) -> None:
    """Registered models (4) come before accounts (5): a database at either
    keeps its endpoints, gains the accounts' tables, and endpoint names
    become unique per project."""
    path = tmp_path / "inferd.db"
    dialect = SqliteDialect(path)
    conn = dialect.conn
    migrate(dialect, migrations.MIGRATIONS[:version])
    values = (row().id, "old", "tiny-chat", "chat", "cpu", 1, "local", 0, 1, 60, 0.0, "USD")
    conn.execute(
        "INSERT INTO endpoints (id, name, model_name, model_kind, gpu_type, gpu_count,"
        " location_name, min_replicas, max_replicas, retention_seconds, hourly_price,"
        " currency, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (*values, NOW, NOW),
    )
    conn.close()

    store = SqliteStore.open(path)

    async def check() -> None:
        assert await store.schema_version() == latest_version() == 17
        (endpoint,) = await store.list_endpoints()
        assert (endpoint.name, endpoint.project_id) == ("old", "default")
        # Endpoints from before engine settings run with the server's defaults.
        assert endpoint.engine_settings.is_empty()
        # Endpoints from before LoRA run without it, and have no adapters.
        assert endpoint.max_loras == 0 and await store.list_adapters() == []
        assert await store.client_tokens() == []  # only the owner's token, as before
        assert await store.list_models() == []
        # The project that the endpoints already there belong to.
        assert await store.get_project("default") is not None
        other = replace(row(), id="00000000-0000-4000-8000-000000000002", name="old",
                        project_id="team")  # fmt: skip
        await store.insert_endpoint(other, hash_token(new_endpoint_token()))
        assert len(await store.list_endpoints()) == 2
        await store.close()

    asyncio.run(check())


def test_commits_are_durable_and_plain(store: SqliteStore) -> None:
    first, second = new_endpoint_token(), new_endpoint_token()

    async def writes() -> None:
        await store.insert_endpoint(row(), hash_token(first))
        await store.replace_token(row().id, hash_token(second), LATER)

    asyncio.run(writes())
    # Committed: a second, independent connection sees it, as plain values.
    other = sqlite3.connect(store.path)
    assert other.execute("SELECT name, created_at FROM endpoints").fetchall() == [("ep", NOW)]
    states = other.execute(
        "SELECT token_hash, revoked_at FROM endpoint_tokens ORDER BY id"
    ).fetchall()
    # The old token is revoked in the transaction that adds the new one.
    assert states == [(hash_token(first), "2025-01-01T00:05:00.000Z"), (hash_token(second), None)]
    kinds = [r[0] for r in other.execute("SELECT kind FROM changes ORDER BY seq")]
    assert kinds == ["endpoint", "token", "token"]
    other.close()


def test_database_enforces_bounds(store: SqliteStore) -> None:
    async def body() -> None:
        await store.insert_endpoint(row(), hash_token(new_endpoint_token()))
        with pytest.raises(sqlite3.IntegrityError):
            await store.update_endpoint(row().id, EndpointChanges(updated_at=LATER, min_replicas=5))

    asyncio.run(body())


def test_state_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "inferd.db"
    token = new_endpoint_token()

    async def first() -> None:
        s = SqliteStore.open(path)
        await s.insert_endpoint(row(), hash_token(token))
        await s.close()

    async def second() -> None:
        s = SqliteStore.open(path)
        assert await s.get_endpoint(row().id) == row()
        assert await s.active_token_hashes() == {row().id: hash_token(token)}
        await s.close()

    asyncio.run(first())
    asyncio.run(second())
    assert path.stat().st_mode & 0o777 == 0o600  # it holds token digests
