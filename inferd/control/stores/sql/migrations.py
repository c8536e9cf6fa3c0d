"""The schema's migrations: one ordered list, versioned, append only.

Each migration runs in its own transaction together with the row that
records it in `schema_migrations`, so a crash leaves the schema at one
version or the next; a database newer than this list is refused. To change
the schema, append a `Migration` with the next version (never edit a
released one). Its statements are the same text on every engine, with
`<type>` tokens each engine fills in (`<time>`: TEXT in SQLite, TIMESTAMPTZ
in PostgreSQL; see `DDL_TYPES`); an engine's own `Step` only where its DDL
really differs.

The two engines' histories began apart (PostgreSQL support started at the
schema SQLite reached in its version 3): versions 1 to 6 and 8 are each
engine's own steps, kept as released, written with the same tokens and
sharing the statements both engines ran (at their own versions).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.control.model import SchemaTooNew, utc_now
from inferd.control.stores.sql.database import Dialect, Tx

__all__ = ["MIGRATIONS", "Migration", "SchemaTooNew", "Step", "latest_version", "migrate"]


@dataclass(frozen=True)
class Step:
    name: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str = ""  # of the statements every engine runs
    statements: tuple[str, ...] = ()
    sqlite: Step | None = None  # an engine's own, where its DDL differs
    postgres: Step | None = None

    def step(self, engine: str) -> Step:
        """What `engine` runs, its `<type>` tokens filled in."""
        step: Step = getattr(self, engine) or Step(self.name, self.statements)
        statements = []
        for text in step.statements:
            for token, ddl in DDL_TYPES[engine].items():
                text = text.replace(f"<{token}>", ddl)
            statements.append(text)
        return Step(step.name, tuple(statements))


# Each engine's DDL for the tokens. <rowid>: a key SQLite may reuse after the
# newest row is deleted; <serial>: one it never reuses; <seq>: PostgreSQL's
# creation order (SQLite's rowid is one).
_IDENTITY_KEY = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
DDL_TYPES = {
    "sqlite": {
        "int": "INTEGER", "real": "REAL", "time": "TEXT", "bytes": "BLOB", "json": "TEXT",
        "strict": "STRICT", "seq": "", "rowid": "INTEGER PRIMARY KEY",
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "now": "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    },
    "postgres": {
        "int": "BIGINT", "real": "DOUBLE PRECISION", "time": "TIMESTAMPTZ", "bytes": "BYTEA",
        "json": "JSONB", "strict": "", "seq": ", seq BIGINT GENERATED ALWAYS AS IDENTITY",
        "rowid": _IDENTITY_KEY, "serial": _IDENTITY_KEY, "now": "now()",
    },
}  # fmt: skip


# --- statements both engines ran, at their own versions ----------------------------------------

_KINDS_V1 = "'chat', 'image'"
_PROJECT_ID = "project_id TEXT NOT NULL DEFAULT 'default'"
_OF_ENDPOINT = "endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE"


def _endpoints(table: str, kinds: str, name: str, *more: str) -> str:
    """The endpoints table as one version created it; `more`: the columns
    and constraints after `generation`. `hourly_price`: of one replica-hour,
    fixed when the GPU settings are chosen; `deleting_at`: set when deletion
    starts (replicas drain while it is set); `generation`: bumped when the
    GPU settings change, so that replicas of an older one can be replaced."""
    return f"""CREATE TABLE {table} (id TEXT PRIMARY KEY, name {name},
        model_name TEXT NOT NULL, model_kind TEXT NOT NULL CHECK (model_kind IN ({kinds})),
        gpu_type TEXT NOT NULL, gpu_count <int> NOT NULL CHECK (gpu_count >= 1),
        location_name TEXT NOT NULL, min_replicas <int> NOT NULL CHECK (min_replicas >= 0),
        max_replicas <int> NOT NULL CHECK (max_replicas >= 1 AND max_replicas >= min_replicas),
        retention_seconds <int> NOT NULL CHECK (retention_seconds >= 0),
        hourly_price <real> NOT NULL CHECK (hourly_price >= 0), currency TEXT NOT NULL,
        created_at <time> NOT NULL, updated_at <time> NOT NULL, deleting_at <time>,
        generation <int> NOT NULL DEFAULT 1{"".join(f", {m}" for m in more)}) <strict>"""


def _rebuilt_endpoints(version: int, kinds: str) -> tuple[str, ...]:
    """SQLite can neither drop a column's UNIQUE nor change a CHECK: the
    table is rebuilt. `migrate` runs with foreign keys off, so dropping the
    old table cascades nothing."""
    table = f"endpoints_v{version}"
    return (
        _endpoints(table, kinds, "TEXT NOT NULL", _PROJECT_ID, "UNIQUE (project_id, name)"),
        f"INSERT INTO {table} SELECT * FROM endpoints",
        "DROP TABLE endpoints",
        f"ALTER TABLE {table} RENAME TO endpoints",
    )


_TOKENS_AND_KEYS = (
    f"""CREATE TABLE endpoint_tokens (id <rowid>, {_OF_ENDPOINT},
        token_hash <bytes> NOT NULL UNIQUE, created_at <time> NOT NULL, revoked_at <time>
    ) <strict>""",
    # At most one active token per endpoint, enforced by the database.
    "CREATE UNIQUE INDEX endpoint_tokens_one_active"
    " ON endpoint_tokens (endpoint_id) WHERE revoked_at IS NULL",
    """CREATE TABLE admin_keys (id <rowid>, key_hash <bytes> NOT NULL UNIQUE,
        created_at <time> NOT NULL, revoked_at <time>) <strict>""",
)
_REPLICAS_BY_ENDPOINT = "CREATE INDEX replicas_by_endpoint ON replicas (endpoint_id)"
# Which record changed, in commit order (SQLite's writers are serialised;
# PostgreSQL's take one lock just before appending here), so that every
# instance can follow the others' writes.
_CHANGES = "CREATE TABLE changes (seq <serial>, kind TEXT NOT NULL, key TEXT NOT NULL) <strict>"
_META = "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) <strict>"

# One JSON document per record (the documented fields of GET
# /inference/models and of a profile), so that a newly derived fact needs no
# migration.
_MODELS = Step(
    "registered models, measured profiles",
    (
        """CREATE TABLE registered_models (name TEXT PRIMARY KEY, project_id TEXT,
            document <json> NOT NULL, created_at TEXT NOT NULL<seq>) <strict>""",
        """CREATE TABLE model_profiles (model_name TEXT NOT NULL, gpu_type TEXT NOT NULL,
            gpu_count <int> NOT NULL CHECK (gpu_count >= 1), document <json> NOT NULL,
            measured_at TEXT NOT NULL, PRIMARY KEY (model_name, gpu_type, gpu_count)) <strict>""",
    ),
)
_COUNTS = "<int> NOT NULL DEFAULT 0"


def _accounts(append_only: tuple[str, ...], unique_per_project: tuple[str, ...]) -> Step:
    """Projects, users, members, keys, audit log and usage, with each
    engine's way of keeping the audit log append-only and of making endpoint
    names unique per project. A project's quota: {"endpoints": int|null,
    "replicas": int|null, "gpus": {type: int}}. Usage has no reference to
    endpoints: it and its cost outlive a deleted endpoint."""
    return Step(
        "accounts: projects, users, members, keys, audit log, usage; names unique per project",
        (
            """CREATE TABLE projects (id TEXT PRIMARY KEY, created_at <time> NOT NULL,
                quota <json> NOT NULL DEFAULT '{}') <strict>""",
            "INSERT INTO projects (id, created_at) VALUES ('default', <now>)",
            "CREATE TABLE users (id TEXT PRIMARY KEY, created_at <time> NOT NULL) <strict>",
            """CREATE TABLE memberships (
                project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
                user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
                role TEXT NOT NULL CHECK (role IN ('admin', 'developer', 'viewer')),
                created_at <time> NOT NULL, PRIMARY KEY (project_id, user_id)) <strict>""",
            "CREATE INDEX memberships_by_user ON memberships (user_id)",
            """CREATE TABLE user_keys (id TEXT PRIMARY KEY,
                user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
                name TEXT NOT NULL, key_hash <bytes> NOT NULL UNIQUE, hint TEXT NOT NULL,
                created_at <time> NOT NULL, last_used_at <time>, revoked_at <time>) <strict>""",
            "CREATE INDEX user_keys_by_user ON user_keys (user_id)",
            """CREATE TABLE audit_log (id <serial>, at <time> NOT NULL, project_id TEXT,
                actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,
                detail <json> NOT NULL) <strict>""",
            "CREATE INDEX audit_log_by_project ON audit_log (project_id, at)",
            *append_only,
            f"""CREATE TABLE usage_hourly (endpoint_id TEXT NOT NULL, project_id TEXT NOT NULL,
                hour <time> NOT NULL, gpu_type TEXT NOT NULL, gpu_count <int> NOT NULL,
                replica_seconds <real> NOT NULL DEFAULT 0, requests {_COUNTS},
                prompt_tokens {_COUNTS}, completion_tokens {_COUNTS}, images {_COUNTS},
                cost <real> NOT NULL DEFAULT 0,
                PRIMARY KEY (endpoint_id, hour, gpu_type, gpu_count)) <strict>""",
            "CREATE INDEX usage_hourly_by_project ON usage_hourly (project_id, hour)",
            *unique_per_project,
        ),
    )


_QUOTA_LIMIT = Step(
    "a project's quota limit, set by the operator; its own quota is set by its admins",
    ("ALTER TABLE projects ADD COLUMN quota_limit <json> NOT NULL DEFAULT '{}'",),
)
_MORE_KINDS = "endpoints of embedding and rerank models"
_APPEND_ONLY = "BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"


# --- the list -----------------------------------------------------------------------------------

# fmt: off
MIGRATIONS: tuple[Migration, ...] = (
    # PostgreSQL: integers are BIGINT (the API bounds them to 64 bits, as
    # SQLite stores them); `seq` is creation order, for lists (oldest first).
    # A replica's node and placement: where it runs, as the launcher
    # describes it (opaque here).
    Migration(1, sqlite=Step("endpoints, endpoint tokens, admin keys, meta", (
        _endpoints("endpoints", _KINDS_V1, "TEXT NOT NULL UNIQUE"), *_TOKENS_AND_KEYS, _META,
    )), postgres=Step("endpoints, tokens, admin keys, replicas, change log, meta", (
        _endpoints("endpoints", _KINDS_V1, "TEXT NOT NULL", _PROJECT_ID,
                   "seq BIGINT GENERATED ALWAYS AS IDENTITY",
                   "CONSTRAINT endpoints_name_key UNIQUE (name)"),
        *_TOKENS_AND_KEYS,
        f"""CREATE TABLE replicas (id TEXT PRIMARY KEY, {_OF_ENDPOINT},
            generation BIGINT NOT NULL, gpu_type TEXT NOT NULL,
            gpu_count BIGINT NOT NULL CHECK (gpu_count >= 1), secret_hash BYTEA NOT NULL,
            status TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL,
            node TEXT NOT NULL, placement JSONB NOT NULL, reason TEXT, url TEXT,
            seq BIGINT GENERATED ALWAYS AS IDENTITY)""",
        _REPLICAS_BY_ENDPOINT, _CHANGES, _META,
    ))),
    # SQLite: what a restarted control plane needs to adopt replicas that
    # kept running (pid, GPUs, secret digest) and to show their last state;
    # gpu_ids: physical GPU indices, comma-separated, empty on CPU.
    Migration(2, sqlite=Step("replicas", (
        f"""CREATE TABLE replicas (id TEXT PRIMARY KEY, {_OF_ENDPOINT},
            generation INTEGER NOT NULL, gpu_type TEXT NOT NULL,
            gpu_count INTEGER NOT NULL CHECK (gpu_count >= 1), gpu_ids TEXT NOT NULL,
            pid INTEGER NOT NULL, secret_hash BLOB NOT NULL, status TEXT NOT NULL, reason TEXT,
            url TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL) STRICT""",
        _REPLICAS_BY_ENDPOINT,
    )), postgres=_MODELS),
    # SQLite: every endpoint belongs to a project (existing ones to the
    # default). Where a replica runs is the launcher's business: a node name
    # and an opaque placement (JSON object of strings); the local launcher
    # keeps its process id and GPU indices there.
    Migration(3, sqlite=Step("projects, replica placement as data, change log", (
        f"ALTER TABLE endpoints ADD COLUMN {_PROJECT_ID}",
        "ALTER TABLE replicas ADD COLUMN node TEXT NOT NULL DEFAULT 'local'",
        "ALTER TABLE replicas ADD COLUMN placement TEXT NOT NULL DEFAULT '{}'",
        "UPDATE replicas SET placement = json_object('pid', CAST(pid AS TEXT), 'gpu_ids', gpu_ids)",
        "ALTER TABLE replicas DROP COLUMN pid",
        "ALTER TABLE replicas DROP COLUMN gpu_ids",
        _CHANGES,
    )), postgres=_accounts((
        # The function's text is kept as released: PostgreSQL stores it as
        # written, white space included.
        "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$"
        "\n    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$",
        "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log"
        " FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()",
    ), (
        "ALTER TABLE endpoints DROP CONSTRAINT endpoints_name_key",
        "ALTER TABLE endpoints ADD CONSTRAINT endpoints_name_key UNIQUE (project_id, name)",
    ))),
    Migration(4, sqlite=_MODELS, postgres=_QUOTA_LIMIT),
    Migration(5, sqlite=_accounts((
        f"CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log {_APPEND_ONLY}",
        f"CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log {_APPEND_ONLY}",
    ), _rebuilt_endpoints(5, _KINDS_V1)), postgres=Step(
        "lists read a page at a time in the order of their identity columns", (
            "CREATE INDEX endpoints_by_seq ON endpoints (seq)",
            "CREATE INDEX audit_log_by_project_id ON audit_log (project_id, id)",
        ))),
    # PostgreSQL, IF NOT EXISTS: before this version the coordination created
    # both tables itself, on databases a cluster already ran on. The
    # gateways' load is UNLOGGED: soft state, republished within an interval
    # after a crash.
    Migration(6, sqlite=_QUOTA_LIMIT, postgres=Step(
        "the coordination of instances: the leader row and the gateways' load", (
            """CREATE TABLE IF NOT EXISTS inferd_leader (id INTEGER PRIMARY KEY CHECK (id = 1),
                term BIGINT NOT NULL, holder TEXT, since TIMESTAMPTZ, heartbeat_at TIMESTAMPTZ)""",
            "INSERT INTO inferd_leader (id, term) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
            """CREATE UNLOGGED TABLE IF NOT EXISTS inferd_gateway_load (
                instance_id TEXT NOT NULL, endpoint_id TEXT NOT NULL, in_flight INTEGER NOT NULL,
                held INTEGER NOT NULL, last_request_at TIMESTAMPTZ,
                reported_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                PRIMARY KEY (instance_id, endpoint_id))""",
        ))),
    Migration(7, "a management key may be limited to one project (NULL: every project of its user)",
              ("ALTER TABLE user_keys ADD COLUMN project_id TEXT",)),
    Migration(8, sqlite=Step(
        _MORE_KINDS, _rebuilt_endpoints(8, "'chat', 'image', 'embedding', 'rerank'"),
    ), postgres=Step(_MORE_KINDS, (
        "ALTER TABLE endpoints DROP CONSTRAINT endpoints_model_kind_check",
        "ALTER TABLE endpoints ADD CONSTRAINT endpoints_model_kind_check"
        " CHECK (model_kind IN ('chat', 'image', 'embedding', 'rerank'))",
    ))),
    # A JSON document validated by `EngineSettings` on both ways; '{}': the
    # server's defaults, which is what every endpoint before had.
    Migration(9, "an endpoint's engine settings",
              ("ALTER TABLE endpoints ADD COLUMN engine_settings TEXT NOT NULL DEFAULT '{}'",)),
    Migration(10, "LoRA adapters registered on endpoints", (
        f"""CREATE TABLE endpoint_adapters ({_OF_ENDPOINT}, name TEXT NOT NULL,
            source TEXT NOT NULL, rank <int> NOT NULL CHECK (rank >= 1), base_model TEXT,
            created_at <time> NOT NULL<seq>, PRIMARY KEY (endpoint_id, name)) <strict>""",
    )),
    # No reference to endpoints: usage outlives an adapter and its endpoint,
    # as the endpoint's own usage does.
    Migration(11, "what each LoRA adapter served, per hour", (
        f"""CREATE TABLE adapter_usage_hourly (endpoint_id TEXT NOT NULL, adapter TEXT NOT NULL,
            hour <time> NOT NULL, requests {_COUNTS}, prompt_tokens {_COUNTS},
            completion_tokens {_COUNTS}, PRIMARY KEY (endpoint_id, adapter, hour)) <strict>""",
    )),
    # A file is an endpoint's (deleted with it) and counted against its
    # project's quota. Its content is kept in chunks of rows, the same on
    # both engines, read and written a chunk at a time, and gone by cascade
    # (PostgreSQL's large objects are neither). A request's row holds its
    # body until it has run, then its result line (what the output or error
    # file holds), written with its state in one statement.
    Migration(12, "the Batch API: files, batches and each request's result", (
        f"""CREATE TABLE batch_files (id TEXT PRIMARY KEY, {_OF_ENDPOINT},
            project_id TEXT NOT NULL,
            purpose TEXT NOT NULL CHECK (purpose IN ('batch', 'batch_output')),
            filename TEXT NOT NULL, bytes <int> NOT NULL, created_at <time> NOT NULL,
            lines <int> NOT NULL DEFAULT 0, batch_id TEXT, holds TEXT<seq>,
            CHECK (holds IS NULL OR holds IN ('done', 'failed'))) <strict>""",
        "CREATE INDEX batch_files_project ON batch_files (project_id)",
        "CREATE INDEX batch_files_endpoint ON batch_files (endpoint_id)",
        """CREATE TABLE batch_file_chunks (
            file_id TEXT NOT NULL REFERENCES batch_files(id) ON DELETE CASCADE,
            seq <int> NOT NULL, data <bytes> NOT NULL, PRIMARY KEY (file_id, seq)) <strict>""",
        f"""CREATE TABLE batches (id TEXT PRIMARY KEY, {_OF_ENDPOINT},
            project_id TEXT NOT NULL, url TEXT NOT NULL, input_file_id TEXT NOT NULL,
            status TEXT NOT NULL, created_at <time> NOT NULL, expires_at <time> NOT NULL,
            metadata <json> NOT NULL, times <json> NOT NULL, output_file_id TEXT,
            error_file_id TEXT, errors <json> NOT NULL, total <int> NOT NULL,
            completed {_COUNTS}, failed {_COUNTS}, output_bytes {_COUNTS}, error_bytes {_COUNTS},
            requests {_COUNTS}, prompt_tokens {_COUNTS}, completion_tokens {_COUNTS},
            cost <real> NOT NULL DEFAULT 0<seq>,
            CHECK (status IN ('validating', 'in_progress', 'finalizing', 'completed',
                              'failed', 'expired', 'cancelling', 'cancelled'))) <strict>""",
        "CREATE INDEX batches_endpoint ON batches (endpoint_id)",
        "CREATE INDEX batches_status ON batches (status)",
        """CREATE TABLE batch_requests (
            batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
            idx <int> NOT NULL, custom_id TEXT NOT NULL, body <bytes> NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'failed')),
            line TEXT, PRIMARY KEY (batch_id, idx)) <strict>""",
    )),
    # Deleted with their endpoint; a revoked token's row is deleted (its name
    # may be given again).
    Migration(13, "named client tokens of endpoints, beside the owner's token", (
        f"""CREATE TABLE endpoint_client_tokens ({_OF_ENDPOINT}, name TEXT NOT NULL,
            token_hash <bytes> NOT NULL UNIQUE, hint TEXT NOT NULL, created_at <time> NOT NULL,
            weight <real> NOT NULL CHECK (weight > 0),
            requests_per_minute <int> CHECK (requests_per_minute >= 1),
            last_used_at <time><seq>, PRIMARY KEY (endpoint_id, name)) <strict>""",
    )),
    # '': the endpoint owner's token, which is what created every batch
    # before (the name of a client token otherwise; its requests run as that
    # client).
    Migration(14, "the client token that created each batch",
              ("ALTER TABLE batches ADD COLUMN client TEXT NOT NULL DEFAULT ''",)),
    # Set by the leader when it stops hearing a replica serve, cleared by
    # whichever instance hears it again; NULL: heard lately.
    Migration(15, "a replica's unresponsive mark, for every instance's routing",
              ("ALTER TABLE replicas ADD COLUMN unresponsive_since <time>",)),
    # One row per (endpoint, client) with a rate limit that was used lately:
    # the bucket's level and when it was last refilled (epoch seconds). No
    # key to the endpoint: rows idle for minutes are deleted, and a missing
    # row is a full bucket.
    Migration(16, "client tokens' rate-limit buckets, shared by every instance", (
        """CREATE TABLE rate_limit_buckets (endpoint_id TEXT NOT NULL, client TEXT NOT NULL,
            level <real> NOT NULL, at <real> NOT NULL,
            PRIMARY KEY (endpoint_id, client)) <strict>""",
    )),
    # 'wake' (wake it at zero, keep a replica up while it runs: what every
    # batch did before) or 'running' (only replicas up anyway).
    Migration(17, "what each batch may do to its endpoint's replicas",
              ("ALTER TABLE batches ADD COLUMN capacity TEXT NOT NULL DEFAULT 'wake'",)),
)
# fmt: on


# The bookkeeping table, as each engine's history created it.
SCHEMA_MIGRATIONS = {
    "sqlite": "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
    " name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT",
    "postgres": "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
    " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
}


def latest_version() -> int:
    return MIGRATIONS[-1].version


def migrate(dialect: Dialect, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply every pending migration; returns the versions applied
    (idempotent). Each in `dialect.migrating()`, a transaction exclusive
    across processes, in which what is applied is read again."""
    if [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise RuntimeError("migrations must be numbered 1..N in order")
    applied: list[int] = []
    for migration in migrations:
        with dialect.migrating() as conn:
            tx = Tx(conn, dialect)
            tx.execute(SCHEMA_MIGRATIONS[dialect.name])
            (newest,) = tx.one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations") or (0,)
            if newest > migrations[-1].version:
                raise SchemaTooNew(
                    f"database schema version {newest} is newer than this inferd knows "
                    f"({migrations[-1].version}); upgrade inferd"
                )
            if tx.one("SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)):
                continue
            step = migration.step(dialect.name)
            for statement in step.statements:
                conn.execute(statement)  # constant DDL, not in the driver's placeholder form
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, step.name, dialect.encode("time", utc_now())),
            )
            applied.append(migration.version)
    return applied
