"""The served OpenAPI document and the routes the app serves are the same
set: every public route (the management table, the accounts routes, the
gateway's inference routes, /healthz, /metrics, /openapi.json) is in the
document, and every documented method and path is routed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from starlette.routing import BaseRoute, Mount, Route
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import load_settings

ADMIN = "openapi-routes-admin-key-0123"
# Served but not public API: replicas' reports (a replica secret), the web
# console (HTML pages and its assets).
NOT_DOCUMENTED = ("/internal/", "/console")


def routed(routes: Iterable[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(METHOD, path) of every route, through mounts."""
    for route in routes:
        if isinstance(route, Mount):
            yield from routed(route.routes, prefix + route.path)
        elif isinstance(route, Route):
            for method in route.methods or ():
                if method != "HEAD":
                    yield method, prefix + route.path


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": ADMIN})
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    try:
        with TestClient(create_app(plane)) as c:
            yield c
    finally:
        asyncio.run(plane.close())


def test_every_route_is_documented_and_every_documented_route_exists(
    client: TestClient,
) -> None:
    app = client.app
    served = {
        (method, path)
        for method, path in routed(app.routes)  # type: ignore[attr-defined]
        if not path.startswith(NOT_DOCUMENTED)
    }
    document = client.get("/openapi.json").json()
    documented = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert served - documented == set(), "routes missing from /openapi.json"
    assert documented - served == set(), "documented routes the app does not serve"
    # The table reaches every part: management, accounts, the gateway, health.
    assert {
        ("POST", "/inference/endpoints"),
        ("GET", "/inference/whoami"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
    } <= served
    assert any(path.startswith("/endpoints/{endpoint_id}") for _, path in served)
