"""A database's schema as text, to compare one made now with one made by the
code before (`make.py` writes those with it). Standard library and psycopg
only: it runs with either checkout's `inferd`."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psycopg


def sqlite_schema(path: Path) -> str:
    """Every table's columns and keys, every index and trigger, the versions."""
    conn = sqlite3.connect(path)
    lines = []
    objects = "SELECT name, type, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    for name, kind, sql in conn.execute(objects + " ORDER BY type, name"):
        lines.append(f"{kind} {name} {' '.join((sql or '').split()) if kind != 'table' else ''}")
        if kind == "table":
            lines.append(f"  strict {'STRICT' in sql}")
            lines += [f"  column {r}" for r in conn.execute(f"PRAGMA table_xinfo({name})")]
            lines += [
                f"  foreign key {r}" for r in conn.execute(f"PRAGMA foreign_key_list({name})")
            ]
    lines += [f"version {r}" for r in conn.execute("SELECT version, name FROM schema_migrations")]
    conn.close()
    return "\n".join(lines) + "\n"


def postgres_schema(server: Any, url: str) -> str:
    dump = subprocess.run(
        [str(server.bin_dir / "pg_dump"), "--schema-only", "--no-owner", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # Settings, comments and the dump's restrict key vary by pg_dump version and run.
    varying = ("--", "\\", "SET ", "SELECT pg_catalog.set_config")
    kept = [line for line in dump.splitlines() if line.strip() and not line.startswith(varying)]
    with psycopg.connect(url) as conn:
        versions = conn.execute("SELECT version, name FROM schema_migrations ORDER BY 1").fetchall()
    return "\n".join(kept + [f"version {v}" for v in versions]) + "\n"
