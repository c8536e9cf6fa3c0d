BEGIN TRANSACTION;
CREATE TABLE adapter_usage_hourly (
            endpoint_id       TEXT NOT NULL,
            adapter           TEXT NOT NULL,
            hour              TEXT NOT NULL,
            requests          INTEGER NOT NULL DEFAULT 0,
            prompt_tokens     INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (endpoint_id, adapter, hour)
        ) STRICT
        ;
INSERT INTO "adapter_usage_hourly" VALUES('00000000-0000-4000-8000-000000000001','sql','2026-11-01T12:00:00.000Z',3,30,40);
CREATE TABLE admin_keys (
            id         INTEGER PRIMARY KEY,
            key_hash   BLOB NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        ) STRICT
        ;
INSERT INTO "admin_keys" VALUES(1,X'6161616161616161616161616161616161616161616161616161616161616161','2026-11-01T12:00:00.123Z',NULL);
CREATE TABLE audit_log (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         TEXT NOT NULL,
        project_id TEXT,
        actor      TEXT NOT NULL,
        action     TEXT NOT NULL,
        target     TEXT NOT NULL,
        detail     TEXT NOT NULL
    ) STRICT
    ;
INSERT INTO "audit_log" VALUES(1,'2026-11-01T12:00:00.123Z','team','user:ann','endpoint.create','endpoint:00000000-0000-4000-8000-000000000001','{"name": "chat"}');
CREATE TABLE changes (
            seq  INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            key  TEXT NOT NULL
        ) STRICT
        ;
INSERT INTO "changes" VALUES(1,'account','user:ann');
INSERT INTO "changes" VALUES(2,'endpoint','00000000-0000-4000-8000-000000000001');
INSERT INTO "changes" VALUES(3,'token','00000000-0000-4000-8000-000000000001');
INSERT INTO "changes" VALUES(4,'replica','r-1');
INSERT INTO "changes" VALUES(5,'adapter','00000000-0000-4000-8000-000000000001');
INSERT INTO "changes" VALUES(6,'admin_key','');
CREATE TABLE endpoint_adapters (
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            name        TEXT NOT NULL,
            source      TEXT NOT NULL,
            rank        INTEGER NOT NULL CHECK (rank >= 1),
            base_model  TEXT,
            created_at  TEXT NOT NULL,
            PRIMARY KEY (endpoint_id, name)
        ) STRICT
        ;
INSERT INTO "endpoint_adapters" VALUES('00000000-0000-4000-8000-000000000001','sql','/adapters/sql',8,'tiny-chat','2026-11-01T12:00:00.123Z');
CREATE TABLE endpoint_tokens (
            id          INTEGER PRIMARY KEY,
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            token_hash  BLOB NOT NULL UNIQUE,
            created_at  TEXT NOT NULL,
            revoked_at  TEXT
        ) STRICT
        ;
INSERT INTO "endpoint_tokens" VALUES(1,'00000000-0000-4000-8000-000000000001',X'7474747474747474747474747474747474747474747474747474747474747474','2026-11-01T12:00:00.123Z',NULL);
CREATE TABLE "endpoints" (
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
            project_id        TEXT NOT NULL DEFAULT 'default', engine_settings TEXT NOT NULL DEFAULT '{}',
            UNIQUE (project_id, name)
        ) STRICT
        ;
INSERT INTO "endpoints" VALUES('00000000-0000-4000-8000-000000000001','chat','tiny-chat','chat','cpu',1,'local',1,2,60,1.25,'USD','2026-11-01T12:00:00.123Z','2026-11-01T12:00:00.123Z',NULL,1,'team','{"maxLoras":2}');
CREATE TABLE memberships (
        project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
        user_id    TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        role       TEXT NOT NULL CHECK (role IN ('admin', 'developer', 'viewer')),
        created_at TEXT NOT NULL,
        PRIMARY KEY (project_id, user_id)
    ) STRICT
    ;
INSERT INTO "memberships" VALUES('team','ann','admin','2026-11-01T12:00:00.123Z');
CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT
        ;
CREATE TABLE model_profiles (
            model_name  TEXT NOT NULL,
            gpu_type    TEXT NOT NULL,
            gpu_count   INTEGER NOT NULL CHECK (gpu_count >= 1),
            document    TEXT NOT NULL,
            measured_at TEXT NOT NULL,
            PRIMARY KEY (model_name, gpu_type, gpu_count)
        ) STRICT
        ;
CREATE TABLE projects (
        id         TEXT PRIMARY KEY,
        created_at TEXT NOT NULL,
        -- {"endpoints": int|null, "replicas": int|null, "gpus": {type: int}}
        quota      TEXT NOT NULL DEFAULT '{}'
    , quota_limit TEXT NOT NULL DEFAULT '{}') STRICT
    ;
INSERT INTO "projects" VALUES('default','2026-11-27T10:39:29.514Z','{}','{}');
INSERT INTO "projects" VALUES('team','2026-11-01T12:00:00.123Z','{"endpoints": 3, "gpus": {"A100": 8}, "replicas": null}','{"endpoints": null, "gpus": {}, "replicas": 9}');
CREATE TABLE registered_models (
            name       TEXT PRIMARY KEY,
            project_id TEXT,
            document   TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) STRICT
        ;
CREATE TABLE replicas (
            id          TEXT PRIMARY KEY,
            endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
            generation  INTEGER NOT NULL,
            gpu_type    TEXT NOT NULL,
            gpu_count   INTEGER NOT NULL CHECK (gpu_count >= 1),
            -- Physical GPU indices, comma-separated; empty on CPU.
            secret_hash BLOB NOT NULL,
            status      TEXT NOT NULL,
            reason      TEXT,
            url         TEXT,
            created_at  TEXT NOT NULL,
            updated_at  TEXT NOT NULL
        , node TEXT NOT NULL DEFAULT 'local', placement TEXT NOT NULL DEFAULT '{}') STRICT
        ;
INSERT INTO "replicas" VALUES('r-1','00000000-0000-4000-8000-000000000001',1,'cpu',1,X'7373737373737373737373737373737373737373737373737373737373737373','ready',NULL,'http://127.0.0.1:9','2026-11-01T12:00:00.123Z','2026-11-01T12:00:00.123Z','local','{"pid": "42"}');
CREATE TABLE schema_migrations ( version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT;
INSERT INTO "schema_migrations" VALUES(1,'endpoints, endpoint tokens, admin keys, meta','2026-11-27T10:39:29.430Z');
INSERT INTO "schema_migrations" VALUES(2,'replicas','2026-11-27T10:39:29.438Z');
INSERT INTO "schema_migrations" VALUES(3,'projects, replica placement as data, change log','2026-11-27T10:39:29.460Z');
INSERT INTO "schema_migrations" VALUES(4,'registered models, measured profiles','2026-11-27T10:39:29.489Z');
INSERT INTO "schema_migrations" VALUES(5,'accounts: projects, users, members, keys, audit log, usage; names unique per project','2026-11-27T10:39:29.516Z');
INSERT INTO "schema_migrations" VALUES(6,'a project''s quota limit, set by the operator; its own quota is set by its admins','2026-11-27T10:39:29.546Z');
INSERT INTO "schema_migrations" VALUES(7,'a management key may be limited to one project (NULL: every project of its user)','2026-11-27T10:39:29.562Z');
INSERT INTO "schema_migrations" VALUES(8,'endpoints of embedding and rerank models','2026-11-27T10:39:29.575Z');
INSERT INTO "schema_migrations" VALUES(9,'an endpoint''s engine settings','2026-11-27T10:39:29.598Z');
INSERT INTO "schema_migrations" VALUES(10,'LoRA adapters registered on endpoints','2026-11-27T10:39:29.614Z');
INSERT INTO "schema_migrations" VALUES(11,'what each LoRA adapter served, per hour','2026-11-27T10:39:29.626Z');
CREATE TABLE usage_hourly (
        endpoint_id       TEXT NOT NULL,
        project_id        TEXT NOT NULL,
        hour              TEXT NOT NULL,
        gpu_type          TEXT NOT NULL,
        gpu_count         INTEGER NOT NULL,
        replica_seconds   REAL NOT NULL DEFAULT 0,
        requests          INTEGER NOT NULL DEFAULT 0,
        prompt_tokens     INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0,
        images            INTEGER NOT NULL DEFAULT 0,
        cost              REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (endpoint_id, hour, gpu_type, gpu_count)
    ) STRICT
    ;
INSERT INTO "usage_hourly" VALUES('00000000-0000-4000-8000-000000000001','team','2026-11-01T12:00:00.000Z','cpu',1,12.5,3,30,40,0,0.01);
CREATE TABLE user_keys (
        id           TEXT PRIMARY KEY,
        user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        name         TEXT NOT NULL,
        key_hash     BLOB NOT NULL UNIQUE,
        hint         TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        last_used_at TEXT,
        revoked_at   TEXT
    , project_id TEXT) STRICT
    ;
INSERT INTO "user_keys" VALUES('k1','ann','laptop',X'6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B6B','ik_ab...wxyz','2026-11-01T12:00:00.123Z','2026-11-01T13:00:00.123Z',NULL,'team');
CREATE TABLE users (
        id         TEXT PRIMARY KEY,
        created_at TEXT NOT NULL
    ) STRICT
    ;
INSERT INTO "users" VALUES('ann','2026-11-01T12:00:00.123Z');
CREATE UNIQUE INDEX endpoint_tokens_one_active
            ON endpoint_tokens (endpoint_id) WHERE revoked_at IS NULL
        ;
CREATE INDEX replicas_by_endpoint ON replicas (endpoint_id);
CREATE INDEX memberships_by_user ON memberships (user_id);
CREATE INDEX user_keys_by_user ON user_keys (user_id);
CREATE INDEX audit_log_by_project ON audit_log (project_id, at);
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE INDEX usage_hourly_by_project ON usage_hourly (project_id, hour);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('changes',6);
INSERT INTO "sqlite_sequence" VALUES('audit_log',1);
COMMIT;
