"""Adapters of the registered-model and profile ports (`inferd.catalog.registered`):
in memory (tests, and a server run without a database) and SQLite (the
control plane's own file, tables from migration 3).

The SQLite adapter keeps its own connection to the control plane's WAL
database (readers and one writer at a time are what WAL is for) and runs
each call in a worker thread, so a commit's fsync never stalls the event loop.
Rows hold one JSON document of the record's documented fields.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from anyio import to_thread

from inferd.catalog.registered import DuplicateModel, MeasuredProfile, RegisteredModel


class MemoryModelStore:
    """Both ports, in memory."""

    def __init__(self) -> None:
        self._models: dict[str, RegisteredModel] = {}
        self._profiles: dict[tuple[str, str, int], MeasuredProfile] = {}

    async def add_model(self, model: RegisteredModel) -> None:
        if model.name in self._models:
            raise DuplicateModel(model.name)
        self._models[model.name] = model

    async def get_model(self, name: str) -> RegisteredModel | None:
        return self._models.get(name)

    async def list_models(self) -> list[RegisteredModel]:
        return list(self._models.values())

    async def delete_model(self, name: str) -> bool:
        return self._models.pop(name, None) is not None

    async def put_profile(self, profile: MeasuredProfile) -> None:
        self._profiles[profile.key] = profile

    async def list_profiles(self) -> list[MeasuredProfile]:
        return list(self._profiles.values())


class SqliteModelStore:
    """Both ports, in the control plane's SQLite file (already migrated by
    `inferd.control.store.Store.open`)."""

    def __init__(self, path: Path | str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _write(self, sql: str, params: tuple[object, ...]) -> int:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._conn.execute(sql, params)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return cursor.rowcount

    def _read(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[str]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _add(self, model: RegisteredModel) -> None:
        try:
            self._write(
                "INSERT INTO registered_models (name, project_id, document, created_at)"
                " VALUES (?, ?, ?, ?)",
                (model.name, model.project_id, json.dumps(model.to_dict()), model.created_at),
            )
        except sqlite3.IntegrityError:
            raise DuplicateModel(model.name) from None

    async def add_model(self, model: RegisteredModel) -> None:
        await to_thread.run_sync(self._add, model)

    async def get_model(self, name: str) -> RegisteredModel | None:
        rows = await to_thread.run_sync(
            self._read, "SELECT document FROM registered_models WHERE name = ?", (name,)
        )
        return RegisteredModel.from_dict(json.loads(rows[0][0])) if rows else None

    async def list_models(self) -> list[RegisteredModel]:
        rows = await to_thread.run_sync(
            self._read, "SELECT document FROM registered_models ORDER BY created_at, name"
        )
        return [RegisteredModel.from_dict(json.loads(r[0])) for r in rows]

    async def delete_model(self, name: str) -> bool:
        count = await to_thread.run_sync(
            self._write, "DELETE FROM registered_models WHERE name = ?", (name,)
        )
        return count > 0

    async def put_profile(self, profile: MeasuredProfile) -> None:
        await to_thread.run_sync(
            self._write,
            "INSERT INTO model_profiles (model_name, gpu_type, gpu_count, document, measured_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (model_name, gpu_type, gpu_count)"
            " DO UPDATE SET document = excluded.document, measured_at = excluded.measured_at",
            (
                profile.model_name,
                profile.gpu_type,
                profile.gpu_count,
                json.dumps(profile.to_dict()),
                profile.measured_at,
            ),
        )

    async def list_profiles(self) -> list[MeasuredProfile]:
        rows = await to_thread.run_sync(
            self._read, "SELECT document FROM model_profiles ORDER BY model_name, gpu_type"
        )
        return [MeasuredProfile.from_dict(json.loads(r[0])) for r in rows]
