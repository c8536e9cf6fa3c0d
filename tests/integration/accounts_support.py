"""A management API with two projects and users of every role, for the
accounts tests (in-process, real SQLite store)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings

OPERATOR_KEY = "test-operator-key-0123456789"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
OWN, OTHER = "team", "rivals"
ROLES = ("admin", "developer", "viewer")
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class World:
    client: TestClient
    plane: Server
    # A model directory to register models of a project from.
    model_source: str = ""
    # A LoRA adapter of tiny-chat below the same model root.
    adapter_source: str = ""
    keys: dict[str, str] = field(default_factory=dict)  # user -> plaintext key

    def op(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
        headers = OPERATOR if key is None else bearer(key)
        return self.client.request(method, "/inference" + path, headers=headers, **kwargs)

    def ok(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
        resp = self.op(method, path, key, **kwargs)
        assert resp.status_code < 300, resp.text
        return resp.json() if resp.content else None

    def add_member(self, project: str, user: str, role: str) -> str | None:
        body = self.ok("PUT", f"/projects/{project}/members/{user}", json={"role": role})
        created = body["createdKey"]
        if created is not None:
            self.keys[user] = created["key"]
            return str(created["key"])
        return None

    def endpoint(self, project: str, **fields: Any) -> dict[str, Any]:
        body = {"name": unique("ep"), "modelName": "tiny-chat", "minReplicas": 0,
                "projectId": project, **fields}  # fmt: skip
        created: dict[str, Any] = self.ok("POST", "/endpoints", json=body)
        return created

    def model(self, project: str) -> dict[str, Any]:
        body = {"source": self.model_source, "name": unique("model"), "projectId": project}
        registered: dict[str, Any] = self.ok("POST", "/models", json=body)
        return registered

    def new_key(self, user: str) -> dict[str, Any]:
        created: dict[str, Any] = self.ok("POST", f"/users/{user}/keys", json={"name": "spare"})
        return created


@pytest.fixture
def world(tmp_path: Path, tiny_chat_dir: Path, tiny_lora_dir: Path) -> Iterator[World]:
    settings = load_settings(
        env={},
        overrides={
            "state_dir": tmp_path / "state",
            "admin_key": OPERATOR_KEY,
            "max_replicas_cap": 8,
            "public_url": "http://inferd.test:8080",
            # Members register the test's model directory from here.
            "model_roots": str(tiny_chat_dir.parent),
        },
    )
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    try:
        with TestClient(create_app(plane)) as client:
            w = World(client, plane, str(tiny_chat_dir), str(tiny_lora_dir))
            for project in (OWN, OTHER):
                w.ok("POST", "/projects", json={"id": project})
            for role in ROLES:
                w.add_member(OWN, f"{role}-user", role)
            w.add_member(OTHER, "outsider", "admin")
            yield w
    finally:
        asyncio.run(plane.close())
