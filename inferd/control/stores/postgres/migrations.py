"""Versioned, ordered schema migrations of the PostgreSQL store.

Same rules as the SQLite ones (append only, each migration and its
`schema_migrations` row in one transaction, a newer schema refused). The
history is its own: PostgreSQL support starts at the schema SQLite reached
in its version 3. Each transaction begins by taking one advisory lock, so
several control planes starting at once apply each migration once: the
others wait, then see it done.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from inferd.control.accounts.postgres import ACCOUNT_TABLES_POSTGRES
from inferd.control.model import SchemaTooNew

# pg_advisory_xact_lock key: any constant shared by every inferd.
MIGRATION_LOCK = 0x1F_E7D0_0001


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


_V1 = Migration(
    1,
    "endpoints, tokens, admin keys, replicas, change log, meta",
    (
        # Integers are BIGINT: the API bounds them to 64 bits, as SQLite stores them.
        """
        CREATE TABLE endpoints (
            id                TEXT PRIMARY KEY,
            name              TEXT NOT NULL,
            model_name        TEXT NOT NULL,
            model_kind        TEXT NOT NULL CHECK (model_kind IN ('chat', 'image')),
            gpu_type          TEXT NOT NULL,
            gpu_count         BIGINT NOT NULL CHECK (gpu_count >= 1),
            location_name     TEXT NOT NULL,
            min_replicas      BIGINT NOT NULL CHECK (min_replicas >= 0),
            max_replicas      BIGINT NOT NULL CHECK (max_replicas >= 1
                                                     AND max_replicas >= min_replicas),
            retention_seconds BIGINT NOT NULL CHECK (retention_seconds >= 0),
            hourly_price      DOUBLE PRECISION NOT NULL CHECK (hourly_price >= 0),
            currency          TEXT NOT NULL,
            created_at        TIMESTAMPTZ NOT NULL,
            updated_at        TIMESTAMPTZ NOT NULL,
            deleting_at       TIMESTAMPTZ,
            generation        BIGINT NOT NULL DEFAULT 1,
            project_id        TEXT NOT NULL DEFAULT 'default',
            -- Creation order, for lists (oldest first).
            seq               BIGINT GENERATED ALWAYS AS IDENTITY,
            CONSTRAINT endpoints_name_key UNIQUE (name)
        )
        """,
        """
        CREATE TABLE endpoint_tokens (
            id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            token_hash  BYTEA NOT NULL UNIQUE,
            created_at  TIMESTAMPTZ NOT NULL,
            revoked_at  TIMESTAMPTZ
        )
        """,
        # At most one active token per endpoint, enforced by the database.
        """
        CREATE UNIQUE INDEX endpoint_tokens_one_active
            ON endpoint_tokens (endpoint_id) WHERE revoked_at IS NULL
        """,
        """
        CREATE TABLE admin_keys (
            id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            key_hash   BYTEA NOT NULL UNIQUE,
            created_at TIMESTAMPTZ NOT NULL,
            revoked_at TIMESTAMPTZ
        )
        """,
        """
        CREATE TABLE replicas (
            id          TEXT PRIMARY KEY,
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            generation  BIGINT NOT NULL,
            gpu_type    TEXT NOT NULL,
            gpu_count   BIGINT NOT NULL CHECK (gpu_count >= 1),
            secret_hash BYTEA NOT NULL,
            status      TEXT NOT NULL,
            created_at  TIMESTAMPTZ NOT NULL,
            updated_at  TIMESTAMPTZ NOT NULL,
            -- Where it runs, as the launcher describes it (opaque here).
            node        TEXT NOT NULL,
            placement   JSONB NOT NULL,
            reason      TEXT,
            url         TEXT,
            seq         BIGINT GENERATED ALWAYS AS IDENTITY
        )
        """,
        "CREATE INDEX replicas_by_endpoint ON replicas (endpoint_id)",
        # Which record changed, in commit order (writers take one lock just
        # before appending here), for followers that missed a NOTIFY.
        """
        CREATE TABLE changes (
            seq  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            kind TEXT NOT NULL,
            key  TEXT NOT NULL
        )
        """,
        """
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )
        """,
    ),
)

_V2 = Migration(
    2,
    "registered models, measured profiles",
    (
        # One JSON document per record, as in SQLite's version 4.
        """
        CREATE TABLE registered_models (
            name       TEXT PRIMARY KEY,
            project_id TEXT,
            document   JSONB NOT NULL,
            created_at TEXT NOT NULL,
            seq        BIGINT GENERATED ALWAYS AS IDENTITY
        )
        """,
        """
        CREATE TABLE model_profiles (
            model_name  TEXT NOT NULL,
            gpu_type    TEXT NOT NULL,
            gpu_count   BIGINT NOT NULL CHECK (gpu_count >= 1),
            document    JSONB NOT NULL,
            measured_at TEXT NOT NULL,
            PRIMARY KEY (model_name, gpu_type, gpu_count)
        )
        """,
    ),
)

_V3 = Migration(
    3,
    "accounts: projects, users, members, keys, audit log, usage; names unique per project",
    ACCOUNT_TABLES_POSTGRES,
)

_V4 = Migration(
    4,
    "a project's quota limit, set by the operator; its own quota is set by its admins",
    ("ALTER TABLE projects ADD COLUMN quota_limit JSONB NOT NULL DEFAULT '{}'",),
)

_V5 = Migration(
    5,
    "lists read a page at a time in the order of their identity columns",
    (
        "CREATE INDEX endpoints_by_seq ON endpoints (seq)",
        "CREATE INDEX audit_log_by_project_id ON audit_log (project_id, id)",
    ),
)

# IF NOT EXISTS: before this version the coordination created both tables
# itself, on databases a cluster already ran on.
_V6 = Migration(
    6,
    "the coordination of instances: the leader row and the gateways' load",
    (
        """
        CREATE TABLE IF NOT EXISTS inferd_leader (
            id           INTEGER PRIMARY KEY CHECK (id = 1),
            term         BIGINT NOT NULL,
            holder       TEXT,
            since        TIMESTAMPTZ,
            heartbeat_at TIMESTAMPTZ
        )
        """,
        "INSERT INTO inferd_leader (id, term) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
        # UNLOGGED: soft state, republished within an interval after a crash.
        """
        CREATE UNLOGGED TABLE IF NOT EXISTS inferd_gateway_load (
            instance_id     TEXT NOT NULL,
            endpoint_id     TEXT NOT NULL,
            in_flight       INTEGER NOT NULL,
            held            INTEGER NOT NULL,
            last_request_at TIMESTAMPTZ,
            reported_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (instance_id, endpoint_id)
        )
        """,
    ),
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
        "ALTER TABLE endpoints DROP CONSTRAINT endpoints_model_kind_check",
        "ALTER TABLE endpoints ADD CONSTRAINT endpoints_model_kind_check"
        " CHECK (model_kind IN ('chat', 'image', 'embedding', 'rerank'))",
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
            rank        BIGINT NOT NULL CHECK (rank >= 1),
            base_model  TEXT,
            created_at  TIMESTAMPTZ NOT NULL,
            seq         BIGINT GENERATED ALWAYS AS IDENTITY,
            PRIMARY KEY (endpoint_id, name)
        )
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
            hour              TIMESTAMPTZ NOT NULL,
            requests          BIGINT NOT NULL DEFAULT 0,
            prompt_tokens     BIGINT NOT NULL DEFAULT 0,
            completion_tokens BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (endpoint_id, adapter, hour)
        )
        """,
    ),
)

MIGRATIONS: tuple[Migration, ...] = (
    _V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11,
)  # fmt: skip


def latest_version() -> int:
    return MIGRATIONS[-1].version


def migrate(conn: psycopg.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply every pending migration; returns the versions applied (idempotent).
    `conn` must not be in a transaction (autocommit off: each migration is one)."""
    if [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise RuntimeError("migrations must be numbered 1..N in order")
    applied: list[int] = []
    for migration in migrations:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
            newest = int(row[0]) if row else 0
            if newest > migrations[-1].version:
                raise SchemaTooNew(
                    f"database schema version {newest} is newer than this inferd knows "
                    f"({migrations[-1].version}); upgrade inferd"
                )
            done = conn.execute(
                "SELECT 1 FROM schema_migrations WHERE version = %s", (migration.version,)
            ).fetchone()
            if done is not None:
                continue
            for statement in migration.statements:
                conn.execute(statement)  # constant DDL
            conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.version)
    return applied
