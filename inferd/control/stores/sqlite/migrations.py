"""Versioned, ordered schema migrations of the SQLite store.

Each migration runs in its own transaction together with the row that
records it in `schema_migrations`, so a crash leaves the schema at one
version or the next, never half-way. To change the schema, append a
`Migration` with the next version number; never edit a released one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from inferd.control.accounts.sqlite import ACCOUNT_TABLES_SQLITE
from inferd.control.model import SchemaTooNew

__all__ = ["MIGRATIONS", "Migration", "SchemaTooNew", "latest_version", "migrate"]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


_V1 = Migration(
    1,
    "endpoints, endpoint tokens, admin keys, meta",
    (
        # STRICT: a wrong type is an error, not a silent conversion.
        """
        CREATE TABLE endpoints (
            id                TEXT PRIMARY KEY,
            name              TEXT NOT NULL UNIQUE,
            model_name        TEXT NOT NULL,
            model_kind        TEXT NOT NULL CHECK (model_kind IN ('chat', 'image')),
            gpu_type          TEXT NOT NULL,
            gpu_count         INTEGER NOT NULL CHECK (gpu_count >= 1),
            location_name     TEXT NOT NULL,
            min_replicas      INTEGER NOT NULL CHECK (min_replicas >= 0),
            max_replicas      INTEGER NOT NULL CHECK (max_replicas >= 1
                                                      AND max_replicas >= min_replicas),
            retention_seconds INTEGER NOT NULL CHECK (retention_seconds >= 0),
            -- Price of one replica-hour, fixed when the GPU settings are chosen.
            hourly_price      REAL NOT NULL CHECK (hourly_price >= 0),
            currency          TEXT NOT NULL,
            created_at        TEXT NOT NULL,
            updated_at        TEXT NOT NULL,
            -- Set when deletion starts; replicas drain while it is set.
            deleting_at       TEXT,
            -- Bumped when the GPU settings change, so replicas of an older
            -- generation can be replaced.
            generation        INTEGER NOT NULL DEFAULT 1
        ) STRICT
        """,
        """
        CREATE TABLE endpoint_tokens (
            id          INTEGER PRIMARY KEY,
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            token_hash  BLOB NOT NULL UNIQUE,
            created_at  TEXT NOT NULL,
            revoked_at  TEXT
        ) STRICT
        """,
        # At most one active token per endpoint, enforced by the database.
        """
        CREATE UNIQUE INDEX endpoint_tokens_one_active
            ON endpoint_tokens (endpoint_id) WHERE revoked_at IS NULL
        """,
        """
        CREATE TABLE admin_keys (
            id         INTEGER PRIMARY KEY,
            key_hash   BLOB NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        ) STRICT
        """,
        """
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT
        """,
    ),
)

_V2 = Migration(
    2,
    "replicas",
    (
        # What a restarted control plane needs to adopt replicas that kept
        # running (pid, GPUs, secret digest) and to show their last state.
        """
        CREATE TABLE replicas (
            id          TEXT PRIMARY KEY,
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            generation  INTEGER NOT NULL,
            gpu_type    TEXT NOT NULL,
            gpu_count   INTEGER NOT NULL CHECK (gpu_count >= 1),
            -- Physical GPU indices, comma-separated; empty on CPU.
            gpu_ids     TEXT NOT NULL,
            pid         INTEGER NOT NULL,
            secret_hash BLOB NOT NULL,
            status      TEXT NOT NULL,
            reason      TEXT,
            url         TEXT,
            created_at  TEXT NOT NULL,
            updated_at  TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX replicas_by_endpoint ON replicas (endpoint_id)",
    ),
)

_V3 = Migration(
    3,
    "projects, replica placement as data, change log",
    (
        # Every endpoint belongs to a project; existing ones to the default.
        "ALTER TABLE endpoints ADD COLUMN project_id TEXT NOT NULL DEFAULT 'default'",
        # Where a replica runs is the launcher's business: a node name and
        # an opaque placement (JSON object of strings). The local launcher
        # keeps its process id and GPU indices there.
        "ALTER TABLE replicas ADD COLUMN node TEXT NOT NULL DEFAULT 'local'",
        "ALTER TABLE replicas ADD COLUMN placement TEXT NOT NULL DEFAULT '{}'",
        """
        UPDATE replicas SET placement = json_object(
            'pid', CAST(pid AS TEXT), 'gpu_ids', gpu_ids)
        """,
        "ALTER TABLE replicas DROP COLUMN pid",
        "ALTER TABLE replicas DROP COLUMN gpu_ids",
        # Which record changed, in commit order (writers are serialised), so
        # that every process on this file can follow the others' writes.
        """
        CREATE TABLE changes (
            seq  INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            key  TEXT NOT NULL
        ) STRICT
        """,
    ),
)

_V4 = Migration(
    4,
    "registered models, measured profiles",
    (
        # One JSON document per record (the documented fields of
        # GET /inference/models and of a profile), so that a newly derived
        # fact needs no migration.
        """
        CREATE TABLE registered_models (
            name       TEXT PRIMARY KEY,
            project_id TEXT,
            document   TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) STRICT
        """,
        """
        CREATE TABLE model_profiles (
            model_name  TEXT NOT NULL,
            gpu_type    TEXT NOT NULL,
            gpu_count   INTEGER NOT NULL CHECK (gpu_count >= 1),
            document    TEXT NOT NULL,
            measured_at TEXT NOT NULL,
            PRIMARY KEY (model_name, gpu_type, gpu_count)
        ) STRICT
        """,
    ),
)

_V5 = Migration(
    5,
    "accounts: projects, users, members, keys, audit log, usage; names unique per project",
    (
        *ACCOUNT_TABLES_SQLITE,
        # Endpoint names are unique within a project. SQLite cannot drop a
        # column's UNIQUE, so the table is rebuilt; `migrate` runs with
        # foreign keys off, so dropping the old table cascades nothing.
        """
        CREATE TABLE endpoints_v5 (
            id                TEXT PRIMARY KEY,
            name              TEXT NOT NULL,
            model_name        TEXT NOT NULL,
            model_kind        TEXT NOT NULL CHECK (model_kind IN ('chat', 'image')),
            gpu_type          TEXT NOT NULL,
            gpu_count         INTEGER NOT NULL CHECK (gpu_count >= 1),
            location_name     TEXT NOT NULL,
            min_replicas      INTEGER NOT NULL CHECK (min_replicas >= 0),
            max_replicas      INTEGER NOT NULL CHECK (max_replicas >= 1
                                                      AND max_replicas >= min_replicas),
            retention_seconds INTEGER NOT NULL CHECK (retention_seconds >= 0),
            hourly_price      REAL NOT NULL CHECK (hourly_price >= 0),
            currency          TEXT NOT NULL,
            created_at        TEXT NOT NULL,
            updated_at        TEXT NOT NULL,
            deleting_at       TEXT,
            generation        INTEGER NOT NULL DEFAULT 1,
            project_id        TEXT NOT NULL DEFAULT 'default',
            UNIQUE (project_id, name)
        ) STRICT
        """,
        "INSERT INTO endpoints_v5 SELECT * FROM endpoints",
        "DROP TABLE endpoints",
        "ALTER TABLE endpoints_v5 RENAME TO endpoints",
    ),
)

_V6 = Migration(
    6,
    "a project's quota limit, set by the operator; its own quota is set by its admins",
    ("ALTER TABLE projects ADD COLUMN quota_limit TEXT NOT NULL DEFAULT '{}'",),
)

_V7 = Migration(
    7,
    "a management key may be limited to one project (NULL: every project of its user)",
    ("ALTER TABLE user_keys ADD COLUMN project_id TEXT",),
)

_V8 = Migration(
    8,
    "endpoints of embedding and rerank models",
    (
        # SQLite cannot change a CHECK constraint: the table is rebuilt (as in
        # version 5; `migrate` runs with foreign keys off).
        """
        CREATE TABLE endpoints_v8 (
            id                TEXT PRIMARY KEY,
            name              TEXT NOT NULL,
            model_name        TEXT NOT NULL,
            model_kind        TEXT NOT NULL
                              CHECK (model_kind IN ('chat', 'image', 'embedding', 'rerank')),
            gpu_type          TEXT NOT NULL,
            gpu_count         INTEGER NOT NULL CHECK (gpu_count >= 1),
            location_name     TEXT NOT NULL,
            min_replicas      INTEGER NOT NULL CHECK (min_replicas >= 0),
            max_replicas      INTEGER NOT NULL CHECK (max_replicas >= 1
                                                      AND max_replicas >= min_replicas),
            retention_seconds INTEGER NOT NULL CHECK (retention_seconds >= 0),
            hourly_price      REAL NOT NULL CHECK (hourly_price >= 0),
            currency          TEXT NOT NULL,
            created_at        TEXT NOT NULL,
            updated_at        TEXT NOT NULL,
            deleting_at       TEXT,
            generation        INTEGER NOT NULL DEFAULT 1,
            project_id        TEXT NOT NULL DEFAULT 'default',
            UNIQUE (project_id, name)
        ) STRICT
        """,
        "INSERT INTO endpoints_v8 SELECT * FROM endpoints",
        "DROP TABLE endpoints",
        "ALTER TABLE endpoints_v8 RENAME TO endpoints",
    ),
)

_V9 = Migration(
    9,
    "an endpoint's engine settings",
    # A JSON document validated by `EngineSettings` on both ways; '{}': the
    # server's defaults, which is what every endpoint before had.
    ("ALTER TABLE endpoints ADD COLUMN engine_settings TEXT NOT NULL DEFAULT '{}'",),
)

_V10 = Migration(
    10,
    "LoRA adapters registered on endpoints",
    (
        """
        CREATE TABLE endpoint_adapters (
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            name        TEXT NOT NULL,
            source      TEXT NOT NULL,
            rank        INTEGER NOT NULL CHECK (rank >= 1),
            base_model  TEXT,
            created_at  TEXT NOT NULL,
            PRIMARY KEY (endpoint_id, name)
        ) STRICT
        """,
    ),
)

_V11 = Migration(
    11,
    "what each LoRA adapter served, per hour",
    (
        # No reference to endpoints: usage outlives an adapter and its
        # endpoint, as the endpoint's own usage does.
        """
        CREATE TABLE adapter_usage_hourly (
            endpoint_id       TEXT NOT NULL,
            adapter           TEXT NOT NULL,
            hour              TEXT NOT NULL,
            requests          INTEGER NOT NULL DEFAULT 0,
            prompt_tokens     INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (endpoint_id, adapter, hour)
        ) STRICT
        """,
    ),
)

MIGRATIONS: tuple[Migration, ...] = (
    _V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11,
)  # fmt: skip


def latest_version() -> int:
    return MIGRATIONS[-1].version


def _check_order(migrations: tuple[Migration, ...]) -> None:
    expected = list(range(1, len(migrations) + 1))
    if [m.version for m in migrations] != expected:
        raise RuntimeError("migrations must be numbered 1..N in order")


def applied_versions(conn: sqlite3.Connection) -> list[int]:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT"
    )
    return [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]


def migrate(
    conn: sqlite3.Connection,
    now: Callable[[], str],
    migrations: tuple[Migration, ...] = MIGRATIONS,
) -> list[int]:
    """Apply every pending migration; returns the versions applied (idempotent).

    `conn` must be in autocommit mode (`isolation_level=None`): transactions
    are opened here explicitly.
    """
    _check_order(migrations)
    done = set(applied_versions(conn))
    newest = max(done, default=0)
    if newest > migrations[-1].version:
        raise SchemaTooNew(
            f"database schema version {newest} is newer than this inferd knows "
            f"({migrations[-1].version}); upgrade inferd"
        )
    applied: list[int] = []
    for migration in migrations:
        if migration.version in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-check under the write lock: another process may have won.
            row = conn.execute(
                "SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)
            ).fetchone()
            if row is None:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.name, now()),
                )
                applied.append(migration.version)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return applied
