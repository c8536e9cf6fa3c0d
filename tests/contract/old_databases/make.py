"""Writes the files of tests/contract/test_old_databases.py with whatever
`inferd` is on the path (run with the code before the SQL core, 2d2ceec):

    git worktree add /tmp/before 2d2ceec
    PYTHONPATH=/tmp/before python tests/contract/old_databases/make.py

a database of every kind of record, written through the store port, dumped
as SQL (`sqlite.sql`, `postgres.sql`), and the schema a new database gets
(`schema-*`)."""

import asyncio
import sqlite3
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from inferd.api.engine_settings import EngineSettings
from inferd.control.accounts.model import (
    AuditAction,
    AuditEntry,
    Membership,
    Project,
    UsageDelta,
    User,
    UserKey,
)
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Role
from inferd.control.model import Adapter, AdapterUsage, Endpoint, ReplicaRecord
from inferd.control.stores import open_store

T0 = datetime(2026, 11, 1, 12, 0, 0, 123000, tzinfo=UTC)


async def main(url):
    s = open_store(url)
    await s.create_project(
        Project("team", T0, Quota(endpoints=3, gpus={"A100": 8}), Quota(replicas=9))
    )
    await s.create_user(User("ann", T0))
    await s.put_membership(Membership("team", "ann", Role.ADMIN, T0))
    await s.add_key(
        UserKey(
            "k1",
            "ann",
            "laptop",
            b"k" * 32,
            "ik_ab...wxyz",
            T0,
            T0 + timedelta(hours=1),
            None,
            "team",
        )
    )
    ep = Endpoint(
        id="00000000-0000-4000-8000-000000000001",
        name="chat",
        model_name="tiny-chat",
        model_kind="chat",
        gpu_type="cpu",
        gpu_count=1,
        location_name="local",
        min_replicas=1,
        max_replicas=2,
        retention_seconds=60,
        hourly_price=1.25,
        currency="USD",
        created_at=T0,
        updated_at=T0,
        project_id="team",
        engine_settings=EngineSettings.from_json('{"maxLoras": 2}'),
    )
    await s.insert_endpoint(ep, b"t" * 32)
    await s.insert_replica(
        ReplicaRecord(
            "r-1",
            ep.id,
            1,
            "cpu",
            1,
            b"s" * 32,
            "ready",
            T0,
            T0,
            "local",
            {"pid": "42"},
            None,
            "http://127.0.0.1:9",
        )
    )
    await s.add_adapter(Adapter(ep.id, "sql", "/adapters/sql", 8, T0, base_model="tiny-chat"))
    await s.add_adapter_usage(
        [AdapterUsage(ep.id, "sql", T0.replace(minute=0, second=0, microsecond=0), 3, 30, 40)]
    )
    await s.add_usage(
        [
            UsageDelta(
                ep.id,
                "team",
                T0.replace(minute=0, second=0, microsecond=0),
                "cpu",
                1,
                12.5,
                3,
                30,
                40,
                0,
                0.01,
            )
        ]
    )
    await s.append_audit(
        AuditEntry(
            T0,
            "team",
            "user:ann",
            AuditAction.ENDPOINT_CREATE,
            f"endpoint:{ep.id}",
            {"name": "chat"},
        )
    )
    await s.add_admin_key(b"a" * 32, T0)
    await s.close()


HERE = Path(__file__).parent
sys.path.append(str(HERE))
from schema import postgres_schema, sqlite_schema  # noqa: E402

from inferd.testing.postgres import start_postgres  # noqa: E402

tmp = Path(tempfile.mkdtemp())
asyncio.run(main(f"sqlite:///{tmp}/old.db"))
conn = sqlite3.connect(tmp / "old.db")
(HERE / "sqlite.sql").write_text("\n".join(conn.iterdump()) + "\n")
asyncio.run(open_store(f"sqlite:///{tmp}/new.db").close())
(HERE / "schema-sqlite.txt").write_text(sqlite_schema(tmp / "new.db"))
server = start_postgres()
try:
    url = server.create_database()
    asyncio.run(main(url))
    dump = subprocess.run(
        [str(server.bin_dir / "pg_dump"), "--no-owner", "--no-privileges", "--inserts", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kept = [line for line in dump.splitlines() if not line.startswith(("\\", "--"))]
    (HERE / "postgres.sql").write_text("\n".join(kept) + "\n")
    url = server.create_database()
    asyncio.run(open_store(url).close())
    (HERE / "schema-postgres.sql").write_text(postgres_schema(server, url))
finally:
    server.destroy()
