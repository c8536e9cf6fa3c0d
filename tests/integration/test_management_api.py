"""The management API in-process: every route, every validation error, tokens,
the admin key, the error shape, and the OpenAPI document against the answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from starlette.testclient import TestClient

from inferd.api.management import (
    CreatedEndpoint,
    EndpointList,
    EndpointRecord,
    EndpointStatusName,
    GpuOptionInfo,
    GpuTypeInfo,
    LocationInfo,
    ModelInfo,
    RecommendationInfo,
    ReplicaStatusName,
)
from inferd.catalog import Catalog, recommend
from inferd.control.endpoints.tokens import is_well_formed
from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from inferd.vocab import EndpointStatus, ReplicaStatus

ADMIN = "test-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
CAP = 4
MISSING_ID = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Server]:
    settings = load_settings(
        env={},
        overrides={
            "state_dir": tmp_path / "state",
            "admin_key": ADMIN,
            "max_replicas_cap": CAP,
            "max_body_bytes": 4096,
            "public_url": "http://inferd.test:8080",
        },
    )
    # The management API alone: records show what it decides, no replicas.
    p = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    yield p
    asyncio.run(p.close())


@pytest.fixture
def client(plane: Server) -> Iterator[TestClient]:
    with TestClient(create_app(plane)) as c:
        c.headers.update(AUTH)
        yield c


@pytest.fixture
def openapi(client: TestClient) -> dict[str, Any]:
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    doc: dict[str, Any] = resp.json()
    return doc


def create(client: TestClient, name: str = "demo", **fields: Any) -> dict[str, Any]:
    resp = client.post(
        "/inference/endpoints", json={"name": name, "modelName": "tiny-chat", **fields}
    )
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def assert_error(resp: httpx.Response, status: int, param: str | None = None,
                 code: str | None = None) -> dict[str, Any]:  # fmt: skip
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    error: dict[str, Any] = body["error"]
    return error


def conforms(doc: dict[str, Any], path: str, method: str, resp: httpx.Response) -> None:
    """The answer is one the OpenAPI document describes, schema included."""
    op = doc["paths"][path][method]
    assert str(resp.status_code) in op["responses"], (path, method, resp.status_code)
    spec = op["responses"][str(resp.status_code)]
    if "content" not in spec:
        assert resp.content == b""
        return
    schema = {**spec["content"]["application/json"]["schema"], "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(resp.json())


# --- create / read ---------------------------------------------------------------------


def test_create_returns_full_record_and_token_once(client: TestClient) -> None:
    created = create(client)
    CreatedEndpoint.model_validate(created)  # strict: every field, right types, no extras
    assert is_well_formed(created["accessToken"])
    assert created["modelName"] == "tiny-chat"
    assert created["locationName"] == "local"  # the default location
    assert (created["minReplicas"], created["maxReplicas"]) == (1, 1)
    assert created["scaleToZeroRetentionPeriodSeconds"] == 600
    assert created["status"] == "pending" and created["currentReplicas"] == 0
    assert created["replicas"] == []
    assert isinstance(created["hourlyPrice"], float)
    assert created["url"] == f"http://inferd.test:8080/endpoints/{created['id']}"
    assert created["exampleCommand"].startswith(f"curl {created['url']}/openai/v1/chat/completions")
    assert "<ACCESS_TOKEN>" in created["exampleCommand"]
    assert created["accessToken"] not in created["exampleCommand"]

    got = client.get(f"/inference/endpoints/{created['id']}")
    assert got.status_code == 200
    record = got.json()
    EndpointRecord.model_validate(record)
    assert "accessToken" not in record
    assert record == {k: v for k, v in created.items() if k != "accessToken"}
    assert created["accessToken"] not in got.text


def test_recommended_gpu_is_used_when_omitted(client: TestClient, plane: Server) -> None:
    created = create(client, minReplicas=0)
    best = recommend(plane.catalog.models.get("tiny-chat"), plane.catalog.gpus, "local").best()
    assert best is not None
    assert (created["gpuType"], created["gpuCount"]) == (best.gpu_type, best.gpu_count)
    price = plane.catalog.gpus.hourly_price("local", best.gpu_type, best.gpu_count)
    assert created["hourlyPrice"] == pytest.approx(price)
    assert created["currency"] == plane.catalog.gpus.currency
    assert created["status"] == "scaledToZero"


def test_image_model_example_command(client: TestClient) -> None:
    created = create(client, "pics", modelName="tiny-sdxl")
    assert "/v1/images/generations" in created["exampleCommand"]
    assert '"prompt"' in created["exampleCommand"]


def test_embedding_and_rerank_endpoints(client: TestClient) -> None:
    embed = create(client, "search", modelName="tiny-embed", minReplicas=0)
    assert (
        "/openai/v1/embeddings" in embed["exampleCommand"] and '"input"' in embed["exampleCommand"]
    )
    rerank = create(client, "ranker", modelName="tiny-rerank", minReplicas=0)
    assert "/v1/rerank" in rerank["exampleCommand"] and '"documents"' in rerank["exampleCommand"]


def test_an_embedding_workload_is_sized_by_input_tokens(client: TestClient) -> None:
    params = {"modelName": "bge-base-en-v1.5", "requestsPerSecond": "200", "promptTokens": "256"}
    sized = client.get("/inference/recommendations", params=params).json()
    assert sized["workload"]["inputTokensPerS"] == 200 * 256
    best = sized["options"][0]
    assert best["replicas"] >= 1 and best["inputTokensPerSPerReplica"] > 0
    assert best["totalHourlyPrice"] == pytest.approx(best["replicas"] * best["hourlyPrice"])
    # More load, never fewer replicas of the same option.
    more = client.get(
        "/inference/recommendations", params={**params, "requestsPerSecond": "20000"}
    ).json()
    same = next(
        o for o in more["options"]
        if (o["location"], o["gpuType"], o["gpuCount"])
        == (best["location"], best["gpuType"], best["gpuCount"])
    )  # fmt: skip
    assert same["replicas"] >= best["replicas"]
    for bad, param in (({"outputTokens": "10"}, "outputTokens"), ({"promptTokens": None}, None)):
        query = {k: v for k, v in {**params, **bad}.items() if v is not None}
        answer = client.get("/inference/recommendations", params=query)
        assert answer.status_code == 400, answer.text
        assert param is None or answer.json()["error"]["param"] == param
    too_long = client.get("/inference/recommendations", params={**params, "promptTokens": "9999"})
    assert too_long.status_code == 400 and "512" in too_long.json()["error"]["message"]


def test_recommendations_are_held_to_this_machines_slots(client: TestClient) -> None:
    """The fake launcher is a machine in `local` with 8 CPU replica slots: a
    load that needs more CPU replicas is not served there, whatever it costs."""
    params = {"modelName": "bge-base-en-v1.5", "requestsPerSecond": "200", "promptTokens": "256"}
    sized = client.get("/inference/recommendations", params=params).json()
    local = [o for o in sized["rejected"] if o["location"] == "local"]
    assert len(local) == 1 and local[0]["replicas"] > 8, local
    assert local[0]["reasons"] == [
        f"needs {local[0]['replicas']} CPU replica(s); the machines of local run 8 "
        "(cpu_replica_slots)"
    ]
    assert all(o["location"] != "local" for o in sized["options"])
    # A chat model at a load one replica serves still gets this machine.
    chat = client.get("/inference/recommendations", params={
        "modelName": "tiny-chat", "locationName": "local", "requestsPerSecond": "0.1",
        "promptTokens": "100", "outputTokens": "10",
    }).json()  # fmt: skip
    assert chat["best"]["location"] == "local" and chat["best"]["replicas"] <= 8


def test_max_replicas_defaults_to_min(client: TestClient) -> None:
    created = create(client, minReplicas=3)
    assert created["maxReplicas"] == 3


def test_list_in_creation_order(client: TestClient, openapi: dict[str, Any]) -> None:
    assert client.get("/inference/endpoints").json() == {"data": []}
    ids = [create(client, f"ep-{i}")["id"] for i in range(3)]
    resp = client.get("/inference/endpoints")
    conforms(openapi, "/inference/endpoints", "get", resp)
    listed = EndpointList.model_validate(resp.json())
    assert [r.id for r in listed.data] == ids
    assert all("accessToken" not in r for r in resp.json()["data"])


@pytest.mark.parametrize("endpoint_id", [MISSING_ID, "not-a-uuid", "..", "%20"])
def test_unknown_id_is_404(client: TestClient, endpoint_id: str) -> None:
    for method, path in [
        ("GET", f"/inference/endpoints/{endpoint_id}"),
        ("PATCH", f"/inference/endpoints/{endpoint_id}"),
        ("DELETE", f"/inference/endpoints/{endpoint_id}"),
        ("POST", f"/inference/endpoints/{endpoint_id}/access-token"),
    ]:
        resp = client.request(method, path, json={"minReplicas": 0})
        assert_error(resp, 404)


# --- update / delete / tokens ----------------------------------------------------------


def test_patch_scaling(client: TestClient, openapi: dict[str, Any]) -> None:
    created = create(client)
    path = f"/inference/endpoints/{created['id']}"
    resp = client.patch(
        path, json={"minReplicas": 0, "maxReplicas": 3, "scaleToZeroRetentionPeriodSeconds": 30}
    )
    conforms(openapi, "/inference/endpoints/{id}", "patch", resp)
    updated = resp.json()
    assert (updated["minReplicas"], updated["maxReplicas"]) == (0, 3)
    assert updated["scaleToZeroRetentionPeriodSeconds"] == 30
    assert updated["status"] == "scaledToZero"
    assert updated["updatedAt"] >= created["updatedAt"]
    assert updated["createdAt"] == created["createdAt"]
    assert client.get(path).json() == updated
    # Empty or all-null bodies change nothing.
    assert client.patch(path, json={}).json() == updated
    assert client.patch(path, json={"minReplicas": None}).json() == updated
    # Bounds are checked against the merged settings.
    assert_error(client.patch(path, json={"minReplicas": 4}), 400, "minReplicas", "min_above_max")


def test_delete(client: TestClient, plane: Server, openapi: dict[str, Any]) -> None:
    created = create(client)
    path = f"/inference/endpoints/{created['id']}"
    resp = client.delete(path)
    conforms(openapi, "/inference/endpoints/{id}", "delete", resp)
    assert resp.status_code == 204
    assert_error(client.get(path), 404)
    assert_error(client.delete(path), 404)
    assert client.get("/inference/endpoints").json() == {"data": []}
    assert not plane.verifier.verify(created["id"], created["accessToken"])
    # The name is free again.
    create(client)


def test_reissue_revokes_previous_token_at_once(
    client: TestClient, plane: Server, openapi: dict[str, Any]
) -> None:
    created = create(client)
    endpoint_id, first = created["id"], created["accessToken"]
    assert plane.verifier.verify(endpoint_id, first)
    resp = client.post(f"/inference/endpoints/{endpoint_id}/access-token")
    conforms(openapi, "/inference/endpoints/{id}/access-token", "post", resp)
    second = resp.json()["accessToken"]
    assert set(resp.json()) == {"accessToken"}
    assert is_well_formed(second) and second != first
    assert not plane.verifier.verify(endpoint_id, first)
    assert plane.verifier.verify(endpoint_id, second)
    # The stored state agrees (a fresh verifier loads from the database).
    stored = asyncio.run(plane.store.active_token_hashes())
    assert stored[endpoint_id] == plane.verifier._active[endpoint_id]


def test_token_opens_only_its_own_endpoint(client: TestClient, plane: Server) -> None:
    a, b = create(client, "a"), create(client, "b")
    assert plane.verifier.verify(a["id"], a["accessToken"])
    assert not plane.verifier.verify(b["id"], a["accessToken"])
    assert not plane.verifier.verify(a["id"], b["accessToken"])


def test_tokens_stored_only_as_hashes(client: TestClient, plane: Server) -> None:
    secrets = [ADMIN]
    for i in range(3):
        created = create(client, f"ep-{i}")
        secrets.append(created["accessToken"])
        resp = client.post(f"/inference/endpoints/{created['id']}/access-token")
        secrets.append(resp.json()["accessToken"])
    db = plane.settings.db_path
    raw = b"".join(p.read_bytes() for p in db.parent.iterdir() if p.name.startswith(db.name))
    assert len(raw) > 0
    for secret in secrets:
        assert secret.encode() not in raw
        # Not even the random part alone.
        assert secret.encode()[-38:] not in raw


def test_concurrent_creates_with_one_name(plane: Server) -> None:
    app = create_app(plane)

    async def run() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
            body = {"name": "same", "modelName": "tiny-chat"}
            answers = await asyncio.gather(
                *(c.post("/inference/endpoints", json=body) for _ in range(12))
            )
        return sorted(a.status_code for a in answers)

    assert asyncio.run(run()) == [201] + [409] * 11
    assert len(asyncio.run(plane.store.list_endpoints())) == 1


# --- validation ------------------------------------------------------------------------


def catalog_cases(catalog: Catalog) -> dict[str, tuple[dict[str, Any], str, str]]:
    """Cases that depend on what the catalog holds, found from it."""
    gpus = catalog.gpus
    local = gpus.locations["local"]
    cases: dict[str, tuple[dict[str, Any], str, str]] = {}
    not_here = [t for t in gpus.gpu_types if t not in local.offers]
    if not_here:
        cases["gpu type not offered in location"] = (
            {"gpuType": not_here[0], "locationName": "local"},
            "gpuType",
            "gpu_type_not_offered",
        )
    some_type = next(iter(local.offers))
    bad_count = next(c for c in range(1, 65) if c not in gpus.allowed_counts_for(some_type))
    cases["gpu count not allowed"] = (
        {"gpuType": some_type, "gpuCount": bad_count, "locationName": "local"},
        "gpuCount",
        "gpu_count_not_allowed",
    )
    for model in catalog.models.all():
        for location in gpus.locations:
            rejected = recommend(model, gpus, location).rejected
            if rejected:
                o = rejected[0]
                cases["model does not fit type and count"] = (
                    {"modelName": model.name, "locationName": location,
                     "gpuType": o.gpu_type, "gpuCount": o.gpu_count},
                    "gpuCount",
                    "model_does_not_fit",
                )  # fmt: skip
                return cases
    return cases


STATIC_CREATE_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("missing name", {"name": None}, "name", "missing_required_parameter"),
    ("missing model", {"modelName": None}, "modelName", "missing_required_parameter"),
    ("name with capitals", {"name": "Demo"}, "name", "invalid_value"),
    ("name with underscore", {"name": "my_ep"}, "name", "invalid_value"),
    ("name starting with dash", {"name": "-ep"}, "name", "invalid_value"),
    ("name too long", {"name": "a" * 64}, "name", "invalid_value"),
    ("empty name", {"name": ""}, "name", "invalid_value"),
    ("name not a string", {"name": 5}, "name", "invalid_value"),
    ("unknown model", {"modelName": "gpt-17"}, "modelName", "model_not_found"),
    ("unknown location", {"locationName": "mars-1"}, "locationName", "location_not_found"),
    ("unknown gpu type", {"gpuType": "Z9000"}, "gpuType", "gpu_type_not_found"),
    ("gpu count zero", {"gpuCount": 0}, "gpuCount", "invalid_value"),
    ("gpu count fractional", {"gpuCount": 1.5}, "gpuCount", "invalid_value"),
    ("gpu count as string", {"gpuCount": "1"}, "gpuCount", "invalid_value"),
    ("negative min", {"minReplicas": -1}, "minReplicas", "invalid_value"),
    ("negative max", {"maxReplicas": -1}, "maxReplicas", "invalid_value"),
    ("max zero", {"maxReplicas": 0}, "maxReplicas", "invalid_value"),
    ("min above max", {"minReplicas": 3, "maxReplicas": 2}, "minReplicas", "min_above_max"),
    ("max above cap", {"maxReplicas": CAP + 1}, "maxReplicas", "max_replicas_above_cap"),
    ("min above cap", {"minReplicas": CAP + 1}, "minReplicas", "min_replicas_above_cap"),
    ("huge integer", {"maxReplicas": 10**30}, "maxReplicas", "invalid_value"),
    ("min as string", {"minReplicas": "1"}, "minReplicas", "invalid_value"),
    ("min as bool", {"minReplicas": True}, "minReplicas", "invalid_value"),
    ("negative retention", {"scaleToZeroRetentionPeriodSeconds": -5},
     "scaleToZeroRetentionPeriodSeconds", "invalid_value"),
    ("retention zero", {"scaleToZeroRetentionPeriodSeconds": 0},
     "scaleToZeroRetentionPeriodSeconds", "invalid_value"),
    ("unknown field", {"maxReplica": 2}, "maxReplica", "invalid_value"),
    ("null location", {"locationName": ""}, "locationName", "invalid_value"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param", "code"), [c[1:] for c in STATIC_CREATE_CASES],
                         ids=[c[0] for c in STATIC_CREATE_CASES])  # fmt: skip
def test_create_validation(
    client: TestClient, openapi: dict[str, Any], fields: dict[str, Any], param: str, code: str
) -> None:
    body: dict[str, Any] = {"name": "demo", "modelName": "tiny-chat", **fields}
    body = {k: v for k, v in body.items() if v is not None}
    resp = client.post("/inference/endpoints", json=body)
    assert_error(resp, 400, param, code)
    conforms(openapi, "/inference/endpoints", "post", resp)
    assert client.get("/inference/endpoints").json() == {"data": []}


def test_create_validation_against_catalog(client: TestClient, plane: Server) -> None:
    cases = catalog_cases(plane.catalog)
    assert "model does not fit type and count" in cases
    for label, (fields, param, code) in cases.items():
        body = {"name": "demo", "modelName": "tiny-chat", **fields}
        error = assert_error(client.post("/inference/endpoints", json=body), 400, param, code)
        assert error["message"], label
    assert client.get("/inference/endpoints").json() == {"data": []}


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "invalid_json"),
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'"text"', "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
    ],
)
def test_malformed_bodies(client: TestClient, raw: bytes, code: str) -> None:
    resp = client.post(
        "/inference/endpoints", content=raw, headers={"Content-Type": "application/json"}
    )
    assert_error(resp, 400, code=code)


def test_body_over_limit_is_413(client: TestClient) -> None:
    body = json.dumps({"name": "demo", "modelName": "x" * 5000}).encode()
    assert_error(client.post("/inference/endpoints", content=body), 413)


def test_duplicate_name_is_409(client: TestClient, openapi: dict[str, Any]) -> None:
    create(client)
    resp = client.post("/inference/endpoints", json={"name": "demo", "modelName": "tiny-chat"})
    assert_error(resp, 409, "name", "name_taken")
    conforms(openapi, "/inference/endpoints", "post", resp)


PATCH_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"minReplicas": -1}, "minReplicas", "invalid_value"),
    ({"maxReplicas": CAP + 1}, "maxReplicas", "max_replicas_above_cap"),
    ({"minReplicas": 2}, "minReplicas", "min_above_max"),  # max is 1
    ({"maxReplicas": "2"}, "maxReplicas", "invalid_value"),
    ({"scaleToZeroRetentionPeriodSeconds": 0}, "scaleToZeroRetentionPeriodSeconds",
     "invalid_value"),
    ({"name": "renamed"}, "name", "invalid_value"),
    ({"modelName": "tiny-sdxl"}, "modelName", "invalid_value"),
    ({"gpuType": "Z9000"}, "gpuType", "gpu_type_not_found"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param", "code"), PATCH_CASES)
def test_patch_validation(
    client: TestClient, openapi: dict[str, Any], fields: dict[str, Any], param: str, code: str
) -> None:
    created = create(client)
    resp = client.patch(f"/inference/endpoints/{created['id']}", json=fields)
    assert_error(resp, 400, param, code)
    conforms(openapi, "/inference/endpoints/{id}", "patch", resp)
    assert client.get(f"/inference/endpoints/{created['id']}").json() == {
        k: v for k, v in created.items() if k != "accessToken"
    }


# --- admin key -------------------------------------------------------------------------

ROUTES = [
    ("GET", "/inference/endpoints"),
    ("POST", "/inference/endpoints"),
    ("GET", f"/inference/endpoints/{MISSING_ID}"),
    ("PATCH", f"/inference/endpoints/{MISSING_ID}"),
    ("DELETE", f"/inference/endpoints/{MISSING_ID}"),
    ("POST", f"/inference/endpoints/{MISSING_ID}/access-token"),
    ("GET", "/inference/models"),
    ("GET", "/inference/gpu-types"),
    ("GET", "/inference/locations"),
    ("GET", "/inference/recommendations?modelName=tiny-chat"),
    ("GET", "/inference/no-such-route"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Basic dGVzdDp0ZXN0", f"Bearer {ADMIN}x", f"Token {ADMIN}", "Bearer  "],
)
def test_admin_key_required(
    plane: Server, method: str, path: str, authorization: str | None
) -> None:
    with TestClient(create_app(plane)) as c:
        headers = {} if authorization is None else {"Authorization": authorization}
        resp = c.request(
            method, path, headers=headers, json={"name": "x", "modelName": "tiny-chat"}
        )
    assert_error(resp, 401)
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert asyncio.run(plane.store.list_endpoints()) == []


def test_endpoint_token_refused_on_management_api(client: TestClient) -> None:
    token = create(client)["accessToken"]
    resp = client.get("/inference/endpoints", headers={"Authorization": f"Bearer {token}"})
    assert_error(resp, 401, code="wrong_token_kind")
    assert token not in resp.text


def test_bearer_scheme_is_case_insensitive(client: TestClient) -> None:
    resp = client.get("/inference/endpoints", headers={"Authorization": f"bearer {ADMIN}"})
    assert resp.status_code == 200


def test_public_routes(plane: Server) -> None:
    with TestClient(create_app(plane)) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/openapi.json").status_code == 200


def test_unknown_route_and_method(client: TestClient) -> None:
    assert_error(client.get("/nowhere"), 404)
    assert_error(client.get("/inference/endpoints/"), 404)
    resp = client.put("/inference/endpoints")
    assert_error(resp, 405)
    assert set(resp.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}


# --- catalog routes ----------------------------------------------------------------------


def test_catalog_routes(client: TestClient, plane: Server, openapi: dict[str, Any]) -> None:
    models = client.get("/inference/models")
    conforms(openapi, "/inference/models", "get", models)
    names = {m["name"] for m in models.json()["data"]}
    assert {"tiny-chat", "tiny-sdxl"} <= names
    gpu_types = client.get("/inference/gpu-types")
    conforms(openapi, "/inference/gpu-types", "get", gpu_types)
    assert "cpu" in {g["name"] for g in gpu_types.json()["data"]}
    locations = client.get("/inference/locations")
    conforms(openapi, "/inference/locations", "get", locations)
    assert "local" in {loc["name"] for loc in locations.json()["data"]}
    assert locations.json()["currency"] == plane.catalog.gpus.currency


def test_recommendations(client: TestClient, openapi: dict[str, Any]) -> None:
    resp = client.get("/inference/recommendations", params={"modelName": "tiny-chat"})
    conforms(openapi, "/inference/recommendations", "get", resp)
    assert resp.json()["options"]
    resp = client.get(
        "/inference/recommendations", params={"modelName": "tiny-chat", "locationName": "local"}
    )
    assert resp.status_code == 200
    assert {o["location"] for o in resp.json()["options"]} == {"local"}
    for params, param, code in [
        ({}, "modelName", "missing_required_parameter"),
        ({"modelName": "gpt-17"}, "modelName", "model_not_found"),
        ({"modelName": "tiny-chat", "locationName": "mars-1"}, "locationName",
         "location_not_found"),
        ({"modelName": "tiny-chat", "locationName": ""}, "locationName", "location_not_found"),
    ]:  # fmt: skip
        resp = client.get("/inference/recommendations", params=params)
        assert_error(resp, 400, param, code)
        conforms(openapi, "/inference/recommendations", "get", resp)


# --- OpenAPI -----------------------------------------------------------------------------


def test_openapi_document(client: TestClient, openapi: dict[str, Any]) -> None:
    assert openapi["openapi"].startswith("3.1")
    assert set(openapi["paths"]) >= {
        "/healthz",
        "/inference/endpoints",
        "/inference/endpoints/{id}",
        "/inference/endpoints/{id}/access-token",
        "/inference/models",
        "/inference/gpu-types",
        "/inference/locations",
        "/inference/recommendations",
    }
    assert openapi["components"]["securitySchemes"]["adminKey"]["scheme"] == "bearer"
    for path, ops in openapi["paths"].items():
        for method, op in ops.items():
            assert op["operationId"]
            assert op.get("responses")
            if op.get("security") != []:
                assert "401" in op["responses"], (path, method)
            for status, response in op["responses"].items():
                if int(status) >= 400:
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody")
    # Every schema is itself valid JSON Schema 2020-12.
    for schema in openapi["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    # The configured cap is documented.
    create_props = openapi["components"]["schemas"]["CreateEndpointRequest"]["properties"]
    assert any(b.get("maximum") == CAP for b in create_props["maxReplicas"]["anyOf"])


def test_schema_and_answers_agree(client: TestClient, openapi: dict[str, Any]) -> None:
    created = client.post("/inference/endpoints", json={"name": "demo", "modelName": "tiny-chat"})
    conforms(openapi, "/inference/endpoints", "post", created)
    one = client.get(f"/inference/endpoints/{created.json()['id']}")
    conforms(openapi, "/inference/endpoints/{id}", "get", one)
    conforms(
        openapi,
        "/inference/endpoints/{id}",
        "get",
        client.get(f"/inference/endpoints/{MISSING_ID}"),
    )
    conforms(openapi, "/healthz", "get", client.get("/healthz"))


def test_status_vocabularies_agree() -> None:
    assert set(EndpointStatusName.__args__) == {s.value for s in EndpointStatus}  # type: ignore[attr-defined]
    assert set(ReplicaStatusName.__args__) == {s.value for s in ReplicaStatus}  # type: ignore[attr-defined]


def test_catalog_wire_models_cover_the_catalog(plane: Server) -> None:
    """A field the catalog adds must be documented before clients see it."""
    catalog = plane.catalog
    for m in catalog.models.all():
        assert set(m.to_dict()) <= set(ModelInfo.model_fields)
    for g in catalog.gpus.gpu_types.values():
        assert set(g.to_dict()) <= set(GpuTypeInfo.model_fields)
    for loc in catalog.gpus.locations.values():
        assert set(loc.to_dict()) <= set(LocationInfo.model_fields)
    rec = recommend(catalog.models.get("tiny-chat"), catalog.gpus).to_dict()
    assert set(rec) <= set(RecommendationInfo.model_fields)
    for option in rec["options"] + rec["rejected"]:
        assert set(option) <= set(GpuOptionInfo.model_fields)


def test_patch_gpu_type_and_count(client: TestClient, plane: Server) -> None:
    gpus = plane.catalog.gpus
    assert "H200" not in gpus.locations["us-west"].offers
    created = create(client, locationName="us-west", gpuType="L4", gpuCount=1)
    path = f"/inference/endpoints/{created['id']}"
    # A new count for the same type.
    updated = client.patch(path, json={"gpuCount": 2}).json()
    assert (updated["gpuType"], updated["gpuCount"]) == ("L4", 2)
    assert updated["hourlyPrice"] == pytest.approx(gpus.hourly_price("us-west", "L4", 2))
    # A new type without a count: the recommended count for that type.
    updated = client.patch(path, json={"gpuType": "A10G"}).json()
    best = recommend(plane.catalog.models.get("tiny-chat"), gpus, "us-west", gpu_type="A10G").best()
    assert best is not None
    assert (updated["gpuType"], updated["gpuCount"]) == ("A10G", best.gpu_count)
    # Checked as on create.
    resp = client.patch(path, json={"gpuType": "H200"})
    assert_error(resp, 400, "gpuType", "gpu_type_not_offered")
    assert_error(client.patch(path, json={"gpuCount": 3}), 400, "gpuCount", "gpu_count_not_allowed")
    assert client.get(path).json() == updated
    # GPU changes leave the token alone.
    assert plane.verifier.verify(created["id"], created["accessToken"])


def test_image_example_uses_the_model_default_size(client: TestClient, plane: Server) -> None:
    spec = plane.catalog.models.get("sdxl-turbo")
    assert spec.default_size is not None
    created = create(client, "turbo", modelName="sdxl-turbo", locationName="us-east")
    width, height = spec.default_size
    assert f'"size": "{width}x{height}"' in created["exampleCommand"]
