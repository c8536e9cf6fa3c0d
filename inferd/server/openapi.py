"""The OpenAPI 3.1 document of the server, built from the wire models.

The management API is described here; other parts of the server (the
gateway's inference routes, `/metrics`) bring their own paths and components,
merged in by `build_openapi(parts=...)`, so that one document describes every
public route. Every operation lists every status it can answer with and that
status's schema (errors all share `ErrorBody`), so a schema-driven fuzzer can
hold the server to it. The document is built once per app; bounds that are
settings (the replica cap) are written into it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from inferd import __version__
from inferd.api import management as wire
from inferd.api.engine_settings import SIZING_QUERY, EngineSettings
from inferd.server.paging import ENDPOINT_FILTERS, MODEL_FILTERS, PAGE_PARAMS, query_params

_REF = "#/components/schemas/{model}"

_ERRORS = {
    400: "Invalid request: malformed JSON, a wrong or missing field, or a value the "
    "catalog does not allow; `error.param` names the field.",
    401: "Missing, invalid or revoked management key (endpoint access tokens are refused here).",
    403: "The caller's role in the project may not do this (or only the operator may).",
    404: "Not found: no such thing, or one of a project the caller is not a member of.",
    409: "Conflict: the name is taken, the endpoint is being deleted, or a limit is reached.",
    413: "Request body over the server's limit.",
}


def _component_schemas() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (wire.CreateEndpointRequest, "validation"),
        (wire.UpdateEndpointRequest, "validation"),
        (wire.EndpointRecord, "serialization"),
        (wire.CreatedEndpoint, "serialization"),
        (wire.EndpointList, "serialization"),
        (wire.AccessToken, "serialization"),
        (wire.Health, "serialization"),
        (wire.ErrorBody, "serialization"),
        (wire.ModelList, "serialization"),
        (wire.GpuTypeList, "serialization"),
        (wire.LocationList, "serialization"),
        (wire.RecommendationInfo, "serialization"),
        (wire.WorkloadRecommendationInfo, "serialization"),
        (wire.RegisterModelRequest, "validation"),
        (wire.RecordProfileRequest, "validation"),
        (wire.ModelInfo, "serialization"),
        (wire.ProfileInfo, "serialization"),
        (wire.ProfileList, "serialization"),
    ]
    _, top = models_json_schema(models, ref_template=_REF)
    schemas: dict[str, Any] = dict(top.get("$defs", {}))
    return schemas


def _json(schema_name: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=schema_name)}}},
    }


def _op(
    op_id: str,
    summary: str,
    ok: tuple[int, str | None, str],
    errors: tuple[int, ...],
    *,
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    public: bool = False,
) -> dict[str, Any]:
    status, schema, description = ok
    responses: dict[str, Any] = {
        str(status): _json(schema, description) if schema else {"description": description}
    }
    for code in (*errors, *(() if public else (401,))):
        responses[str(code)] = _json("ErrorBody", _ERRORS[code])
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=body)}}},
        }
    if public:
        op["security"] = []
    return op


def _enum_or_string(names: Sequence[str]) -> dict[str, Any]:
    if names:
        return {"type": "string", "enum": list(names)}
    return {"type": "string", "minLength": 1}


_ID_PARAM = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "Endpoint id (UUID).",
    "schema": {"type": "string"},
}


_NAME_PARAM = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "Model name.",
    "schema": {"type": "string"},
}


def _query_number(name: str, description: str, integer: bool = False) -> dict[str, Any]:
    schema = {"type": "integer" if integer else "number", "exclusiveMinimum": 0, "maximum": 1e9}
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}  # fmt: skip


# With these, the answer is a WorkloadRecommendationInfo: per option the
# batch, replicas and total cost for the load.
_WORKLOAD_PARAMS = [
    _query_number("requestsPerSecond", "Chat load; with promptTokens and outputTokens."),
    _query_number("promptTokens", "Prompt tokens per request.", integer=True),
    _query_number("outputTokens", "Output tokens per request.", integer=True),
    _query_number("ttftP95Ms", "Time-to-first-token target at p95, ms."),
    _query_number("tpotP95Ms", "Time-per-output-token target at p95, ms."),
    _query_number("imagesPerMinute", "Image load."),
    {
        "name": "size",
        "in": "query",
        "required": False,
        "description": "Image size WxH.",
        "schema": {"type": "string", "pattern": "^[0-9]+x[0-9]+$"},
    },
    _query_number("steps", "Denoising steps.", integer=True),
    _query_number("secondsPerImageP95", "Seconds-per-image target at p95."),
]


def _setting_param(name: str) -> dict[str, Any]:
    prop = EngineSettings.model_json_schema()["properties"][name]
    schema = next(b for b in prop.get("anyOf", [prop]) if b.get("type") != "null")
    return {"name": name, "in": "query", "required": False,
            "description": f"{prop.get('description', name)} Sized as an endpoint with this "
            "engine setting would run.", "schema": schema}  # fmt: skip


# An endpoint's engine settings that change what a replica needs (memory, batch).
_SIZING_PARAMS = [_setting_param(name) for name in SIZING_QUERY]


def _constrain(prop: dict[str, Any], type_: str, key: str, value: Any) -> None:
    """Set `key` on the `type_` branch of a property (which may be `anyOf` with null)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == type_:
            branch[key] = value


# Links from a created endpoint to the operations on it (clients and
# stateful fuzzers follow them).
_CREATED_LINKS = {
    name: {"operationId": op, "parameters": {"id": "$response.body#/id"}}
    for name, op in (
        ("GetEndpoint", "getEndpoint"),
        ("UpdateEndpoint", "updateEndpoint"),
        ("DeleteEndpoint", "deleteEndpoint"),
        ("RequestAccessToken", "requestAccessToken"),
    )
}


def merge_part(doc: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Add a part's `paths` and `components` to `doc`. A path or component
    defined on both sides must be the same (shared models such as `ErrorBody`
    are); anything else is a programming error, raised at start-up."""
    for path, ops in part.get("paths", {}).items():
        if path in doc["paths"]:
            raise ValueError(f"OpenAPI path {path} is defined twice")
        doc["paths"][path] = ops
    for section, entries in part.get("components", {}).items():
        target = doc["components"].setdefault(section, {})
        for name, value in entries.items():
            if name in target and target[name] != value:
                raise ValueError(f"OpenAPI component {section}/{name} differs between parts")
            target[name] = value


def build_openapi(
    *,
    max_replicas_cap: int,
    model_names: Sequence[str] = (),
    gpu_types: Sequence[str] = (),
    gpu_counts: Sequence[int] = (),
    locations: Sequence[str] = (),
    server_url: str | None = None,
    parts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The document for this server: bounds that are settings (the replica
    cap) and the catalog's names are written in, so what it says is exactly
    what the server accepts field by field. `parts` are the documents of
    the other routes the server mounts (see `merge_part`)."""
    schemas = _component_schemas()
    create = schemas["CreateEndpointRequest"]["properties"]
    update = schemas["UpdateEndpointRequest"]["properties"]
    for props in (create, update):
        for field in ("minReplicas", "maxReplicas"):
            _constrain(props[field], "integer", "maximum", max_replicas_cap)
        if gpu_types:
            _constrain(props["gpuType"], "string", "enum", list(gpu_types))
        if gpu_counts:
            _constrain(props["gpuCount"], "integer", "enum", sorted(gpu_counts))
    # modelName is not an enum: models registered while the server runs
    # are valid names too.
    if locations:
        _constrain(create["locationName"], "string", "enum", list(locations))
    paths: dict[str, Any] = {
        "/healthz": {
            "get": _op(
                "health", "Liveness of the control plane", (200, "Health", "Up."), (), public=True
            )
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": {
                        "description": "The OpenAPI 3.1 document of every public route.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
                "security": [],
            }
        },
        "/inference/endpoints": {
            "get": _op(
                "listEndpoints",
                "List the endpoints of the caller's projects",
                (200, "EndpointList", "A page of endpoints, oldest first."),
                (400,),
                params=query_params(ENDPOINT_FILTERS + PAGE_PARAMS),
            ),
            "post": _op(
                "createEndpoint",
                "Create an endpoint",
                (201, "CreatedEndpoint", "The new endpoint and its access token (shown once)."),
                (400, 403, 404, 409, 413),
                body="CreateEndpointRequest",
            ),
        },
        "/inference/endpoints/{id}": {
            "get": _op(
                "getEndpoint",
                "Get an endpoint",
                (200, "EndpointRecord", "The endpoint record."),
                (404,),
                params=[_ID_PARAM],
            ),
            "patch": _op(
                "updateEndpoint",
                "Change scaling settings (or the GPU type and count)",
                (200, "EndpointRecord", "The updated record."),
                (400, 403, 404, 409, 413),
                body="UpdateEndpointRequest",
                params=[_ID_PARAM],
            ),
            "delete": _op(
                "deleteEndpoint",
                "Delete an endpoint (its replicas drain first)",
                (204, None, "Deleted."),
                (403, 404),
                params=[_ID_PARAM],
            ),
        },
        "/inference/endpoints/{id}/access-token": {
            "post": _op(
                "requestAccessToken",
                "Request a new access token; the previous one stops working at once",
                (200, "AccessToken", "The new token (shown once)."),
                (403, 404, 409),
                params=[_ID_PARAM],
            ),
        },
        "/inference/models": {
            "get": _op(
                "listModels",
                "Models: the catalog's and the registered ones",
                (200, "ModelList", "A page of models, by name."),
                (400,),
                params=query_params(MODEL_FILTERS + PAGE_PARAMS),
            ),
            "post": _op(
                "registerModel",
                "Register a model from a Hugging Face repository or a server directory",
                (201, "ModelInfo", "The model as read from its own files."),
                (400, 403, 404, 409, 413),
                body="RegisterModelRequest",
            ),
        },
        "/inference/models/{name}": {
            "get": _op(
                "getModel",
                "Get a model",
                (200, "ModelInfo", "The model."),
                (404,),
                params=[_NAME_PARAM],
            ),
            "delete": _op(
                "deleteModel",
                "Delete a registered model (refused while an endpoint uses it)",
                (204, None, "Deleted."),
                (403, 404, 409),
                params=[_NAME_PARAM],
            ),
        },
        "/inference/models/{name}/profiles": {
            "get": _op(
                "listProfiles",
                "Measured profiles of a model",
                (200, "ProfileList", "Profiles."),
                (404,),
                params=[_NAME_PARAM],
            ),
            "post": _op(
                "recordProfile",
                "Record a measured profile (what `inferd bench` posts)",
                (201, "ProfileInfo", "The profile as stored."),
                (400, 403, 404, 413),
                body="RecordProfileRequest",
                params=[_NAME_PARAM],
            ),
        },
        "/inference/gpu-types": {
            "get": _op("listGpuTypes", "GPU types", (200, "GpuTypeList", "GPU types."), ())
        },
        "/inference/locations": {
            "get": _op(
                "listLocations",
                "Locations with the GPU types offered and their hourly prices",
                (200, "LocationList", "Locations."),
                (),
            )
        },
        "/inference/recommendations": {
            "get": _op(
                "recommend",
                "GPU options for a model, ranked by cost per output token (or image)",
                (200, "RecommendationInfo", "Ranked options and rejected ones with reasons."),
                (400,),
                params=[
                    *_WORKLOAD_PARAMS,
                    *_SIZING_PARAMS,
                    {
                        "name": "modelName",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1},
                    },
                    {
                        "name": "locationName",
                        "in": "query",
                        "required": False,
                        "description": "Omitted: every location.",
                        "schema": _enum_or_string(locations),
                    },
                ],
            )
        },
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "inferd API",
            "version": __version__,
            "description": "Create, read, change and delete inference endpoints; browse the "
            "model and GPU catalogs. Every call except /healthz, /openapi.json and /metrics "
            "needs a bearer token: the admin key on /inference, the endpoint's access token "
            "on its inference routes (/endpoints/{endpoint_id}/...). Errors always have the "
            "shape of ErrorBody.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A user's management key (`infd_key_...`), or the operator "
                    "key printed by `inferd serve` on first start (or configured).",
                }
            },
        },
        "security": [{"adminKey": []}],
    }
    doc["paths"]["/inference/endpoints"]["post"]["responses"]["201"]["links"] = _CREATED_LINKS
    rec_ok = doc["paths"]["/inference/recommendations"]["get"]["responses"]["200"]
    rec_ok["content"]["application/json"]["schema"] = {
        "oneOf": [
            {"$ref": _REF.format(model="RecommendationInfo")},
            {"$ref": _REF.format(model="WorkloadRecommendationInfo")},
        ]
    }
    for part in parts:
        merge_part(doc, part)
    # A management route refuses a query parameter it does not read: every
    # one of them can answer 400.
    for path, ops in doc["paths"].items():
        if path.startswith("/inference/"):
            for op in ops.values():
                op["responses"].setdefault("400", _json("ErrorBody", _ERRORS[400]))
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
