"""SQLite store: pragmas, migrations, endpoints, tokens, admin keys."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from inferd.control import migrations
from inferd.control.migrations import Migration, SchemaTooNew, latest_version, migrate
from inferd.control.store import DuplicateName, EndpointRow, Store
from inferd.control.tokens import hash_token, new_endpoint_token

NOW = "2025-01-01T00:00:00.000Z"


def row(name: str = "ep", endpoint_id: str = "00000000-0000-4000-8000-000000000001") -> EndpointRow:
    return EndpointRow(
        id=endpoint_id,
        name=name,
        model_name="tiny-chat",
        model_kind="chat",
        gpu_type="cpu",
        gpu_count=1,
        location_name="local",
        min_replicas=0,
        max_replicas=1,
        retention_seconds=600,
        hourly_price=0.0,
        currency="USD",
        created_at=NOW,
        updated_at=NOW,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "state" / "inferd.db")
    yield s
    s.close()


def test_pragmas(store: Store) -> None:
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL
    assert store.pragma("foreign_keys") == 1
    assert store.integrity_check() == "ok"


def test_migrations_recorded_and_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "inferd.db"
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    versions = conn.execute("SELECT version, name FROM schema_migrations").fetchall()
    assert [v for v, _ in versions] == list(range(1, latest_version() + 1))
    assert migrate(conn, lambda: NOW) == []  # nothing left to apply
    conn.close()
    reopened = Store.open(path)
    assert reopened.schema_version() == latest_version()
    reopened.close()


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in migrations.MIGRATIONS] == list(
        range(1, len(migrations.MIGRATIONS) + 1)
    )


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    broken = (
        *migrations.MIGRATIONS,
        Migration(
            latest_version() + 1,
            "broken",
            ("CREATE TABLE half_done (x INTEGER)", "THIS IS NOT SQL"),
        ),
    )
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, lambda: NOW, broken)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half_done" not in tables
    assert "endpoints" in tables  # earlier migrations stay applied
    assert max(r[0] for r in conn.execute("SELECT version FROM schema_migrations")) == (
        latest_version()
    )
    conn.close()


def test_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "inferd.db"
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', ?)", (NOW,))
    conn.close()
    with pytest.raises(SchemaTooNew):
        Store.open(path)


def test_endpoint_roundtrip_and_durable_commit(store: Store) -> None:
    token = new_endpoint_token()
    store.insert_endpoint(row(), hash_token(token))
    assert store.get_endpoint(row().id) == row()
    assert store.list_endpoints() == [row()]
    # Committed: a second, independent connection sees it.
    assert store.path is not None
    other = sqlite3.connect(store.path)
    assert other.execute("SELECT name FROM endpoints").fetchall() == [("ep",)]
    other.close()


def test_duplicate_name(store: Store) -> None:
    store.insert_endpoint(row(), hash_token(new_endpoint_token()))
    with pytest.raises(DuplicateName):
        store.insert_endpoint(
            row(endpoint_id="00000000-0000-4000-8000-000000000002"),
            hash_token(new_endpoint_token()),
        )
    assert len(store.list_endpoints()) == 1


def test_update(store: Store) -> None:
    store.insert_endpoint(row(), hash_token(new_endpoint_token()))
    updated = store.update_endpoint(row().id, max_replicas=3, updated_at="later")
    assert updated == replace(row(), max_replicas=3, updated_at="later")
    assert store.get_endpoint(row().id) == updated
    with pytest.raises(KeyError):
        store.update_endpoint("missing", max_replicas=2)
    with pytest.raises(ValueError):
        store.update_endpoint(row().id, name="renamed")
    # The database enforces the bounds too.
    with pytest.raises(sqlite3.IntegrityError):
        store.update_endpoint(row().id, min_replicas=5)


def test_replace_token_revokes_previous_in_same_transaction(store: Store) -> None:
    first, second = new_endpoint_token(), new_endpoint_token()
    store.insert_endpoint(row(), hash_token(first))
    store.replace_token(row().id, hash_token(second), "later")
    assert store.active_token_hashes() == {row().id: hash_token(second)}
    assert store.path is not None
    conn = sqlite3.connect(store.path)
    states = conn.execute(
        "SELECT token_hash, revoked_at FROM endpoint_tokens ORDER BY id"
    ).fetchall()
    conn.close()
    assert states == [(hash_token(first), "later"), (hash_token(second), None)]
    with pytest.raises(KeyError):
        store.replace_token("missing", hash_token(new_endpoint_token()), "later")


def test_delete_cascades_to_tokens(store: Store) -> None:
    store.insert_endpoint(row(), hash_token(new_endpoint_token()))
    store.mark_deleting(row().id, "later")
    assert store.active_token_hashes() == {}  # a deleting endpoint admits no one
    assert store.delete_endpoint(row().id)
    assert not store.delete_endpoint(row().id)
    assert store.get_endpoint(row().id) is None
    assert store._query("SELECT COUNT(*) FROM endpoint_tokens") == [(0,)]


def test_admin_keys_and_meta(store: Store) -> None:
    assert store.admin_key_hashes() == []
    store.add_admin_key(b"a" * 32, NOW)
    store.add_admin_key(b"b" * 32, NOW)
    assert store.admin_key_hashes() == [b"a" * 32, b"b" * 32]
    store.add_admin_key(b"c" * 32, NOW, revoke_others=True)
    assert store.admin_key_hashes() == [b"c" * 32]
    assert store.get_meta("k") is None
    store.set_meta("k", "1")
    store.set_meta("k", "2")
    assert store.get_meta("k") == "2"


def test_state_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "inferd.db"
    token = new_endpoint_token()
    s = Store.open(path)
    s.insert_endpoint(row(), hash_token(token))
    s.close()
    s = Store.open(path)
    assert s.get_endpoint(row().id) == row()
    assert s.active_token_hashes() == {row().id: hash_token(token)}
    s.close()
