"""The served OpenAPI document and the routes the app serves are the same
set: every public route (the management table, the accounts routes, the
gateway's inference routes, /healthz, /metrics, /openapi.json) is in the
document, and every documented method and path is routed. The management
part is generated from the route table (`Operation`s and their `Doc`s): each
operation is documented with exactly the path and query parameters it reads,
and the whole document is valid OpenAPI 3.1."""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31
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


def test_each_operation_of_the_table_is_documented_as_it_reads(client: TestClient) -> None:
    app: Any = client.app
    document = client.get("/openapi.json").json()
    table = {(op.method, "/inference" + op.path): op for op in app.state.operations}
    documented = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        if path.startswith("/inference/")
        for method in operations
    }
    assert documented == set(table)
    for (method, path), op in table.items():
        described = document["paths"][path][method.lower()]
        assert described["operationId"] == op.doc.operation_id
        params = described.get("parameters", [])
        assert [p["name"] for p in params if p["in"] == "query"] == list(op.query), path
        assert [p["name"] for p in params if p["in"] == "path"] == re.findall(r"{(\w+)}", path)
        for answer in op.doc.answers:
            assert str(answer.status) in described["responses"], (method, path)
        if op.doc.body is not None:
            body = described["requestBody"]["content"]["application/json"]["schema"]
            assert body == {"$ref": f"#/components/schemas/{op.doc.body.__name__}"}


def invalid_openapi(document: dict[str, Any]) -> list[str]:
    """What makes `document` invalid OpenAPI 3.1: the specification's own
    schema of the document (shipped by schemathesis), references that lead
    nowhere, operation ids used twice, component schemas that are not JSON
    Schema 2020-12."""
    problems = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(OPENAPI_31).iter_errors(document)
    ]
    text = repr(document)
    for ref in set(re.findall(r"'\$ref': '#/components/schemas/([^']+)'", text)):
        if ref not in document.get("components", {}).get("schemas", {}):
            problems.append(f"$ref to a missing schema {ref}")
    ids = [
        op["operationId"]
        for operations in document.get("paths", {}).values()
        for op in operations.values()
    ]
    problems += [f"operationId {i} is used twice" for i in {i for i in ids if ids.count(i) > 1}]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            problems.append(f"schema {name}: {exc.message}")
    return problems


def test_the_document_is_valid_openapi_3_1(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    assert invalid_openapi(document) == []
    # The check can fail: a broken copy is refused on each count.
    broken = copy.deepcopy(document)
    health = broken["paths"]["/healthz"]["get"]
    health["responses"]["200"]["content"]["application/json"]["schema"]["$ref"] += "X"
    health["parameters"] = [{"name": "x", "in": "body"}]
    broken["paths"]["/metrics"]["get"]["operationId"] = "health"
    problems = invalid_openapi(broken)
    assert any("missing schema HealthX" in p for p in problems)
    assert any("'body' is not one of" in p for p in problems)
    assert any("operationId health is used twice" in p for p in problems)
