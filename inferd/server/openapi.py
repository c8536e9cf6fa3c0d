"""The OpenAPI 3.1 document of the server, generated from the route table
(`inferd.server.access.Operation`, each with its `Doc`) and the wire models.

A route exists only as an `Operation`, so every management route is in the
document and nothing else is: paths, methods, path and query parameters,
bodies and answers all come from the table, their schemas from the pydantic
models. Other parts of the server (the gateway's inference routes, `/metrics`)
bring their own paths and components, merged in by `build_openapi(parts=...)`,
so that one document describes every public route. Every operation lists
every status it can answer with and that status's schema (errors all share
`ErrorBody`), so a schema-driven fuzzer can hold the server to it. Bounds
that are settings (the replica cap) and the catalog's names are written in
when the document is built, once per app.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from inferd import __version__
from inferd.api import management as wire
from inferd.server.access import Operation
from inferd.server.docs import Answer, Doc, Param
from inferd.server.paging import QUERY_DOCS

PREFIX = "/inference"
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

# What a path parameter names, by the path segment before it.
PATH_DOCS = {
    "endpoints/{id}": "Endpoint id (UUID).",
    "projects/{id}": "Project id (its name).",
    "members/{userId}": "User id (its name).",
    "users/{userId}": "User id (its name).",
    "keys/{keyId}": "Management key id.",
    "models/{name}": "Model name.",
    "adapters/{name}": "The adapter's name (what requests put in `model`).",
    "tokens/{name}": "The client token's name.",
}

# The routes of the server itself, beside the route table.
HEALTH = Doc("health", "Liveness of the control plane", (Answer(200, "Up.", wire.Health),))
_OPENAPI_PATH = {
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
}


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _answer(answer: Answer) -> dict[str, Any]:
    body = answer.body
    if body is None:
        return {"description": answer.description}
    schema = {"oneOf": [_ref(m) for m in body]} if isinstance(body, tuple) else _ref(body)
    out = _json(schema, answer.description)
    if answer.links:
        out["links"] = {
            op_id[0].upper() + op_id[1:]: {
                "operationId": op_id,
                "parameters": {"id": "$response.body#/id"},
            }
            for op_id in answer.links
        }
    return out


def _path_params(path: str) -> list[dict[str, Any]]:
    params = []
    for found in re.finditer(r"([^/]+)/\{(\w+)\}", path):
        segment, name = found.groups()
        params.append(
            {
                "name": name,
                "in": "path",
                "required": True,
                "description": PATH_DOCS[f"{segment}/{{{name}}}"],
                "schema": {"type": "string"},
            }
        )
    return params


def _query_param(name: str, param: Param, locations: Sequence[str]) -> dict[str, Any]:
    schema = dict(param.schema)
    if param.catalog == "locations" and locations:
        schema = {"type": "string", "enum": list(locations)}
    out: dict[str, Any] = {"name": name, "in": "query", "required": param.required}
    if param.description is not None:
        out["description"] = param.description
    out["schema"] = schema
    if schema.get("type") == "array":
        out.update(style="form", explode=True)
    return out


def _operation(
    doc: Doc,
    *,
    path: str = "",
    query: Sequence[str] = (),
    locations: Sequence[str] = (),
    public: bool = False,
) -> dict[str, Any]:
    responses = {str(a.status): _answer(a) for a in doc.answers}
    errors = [
        *doc.errors,
        *(() if public else (401,)),
        *((400,) if path.startswith(PREFIX) else ()),
    ]
    for status in errors:
        responses.setdefault(str(status), _json(_ref(wire.ErrorBody), _ERRORS[status]))
    op: dict[str, Any] = {
        "operationId": doc.operation_id,
        "summary": doc.summary,
        "responses": responses,
    }
    params = _path_params(path) + [
        _query_param(name, doc.query.get(name) or QUERY_DOCS[name], locations) for name in query
    ]
    if params:
        op["parameters"] = params
    if doc.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(doc.body)}},
        }
    if public:
        op["security"] = []
    return op


def _models(docs: Iterable[Doc]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every wire model the operations read or answer, once each."""
    seen: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {
        (wire.ErrorBody, "serialization"): None
    }
    for doc in docs:
        if doc.body is not None:
            seen[(doc.body, "validation")] = None
        for answer in doc.answers:
            bodies = answer.body if isinstance(answer.body, tuple) else (answer.body,)
            for body in bodies:
                if body is not None:
                    seen[(body, "serialization")] = None
    return list(seen)


def _constrain(prop: dict[str, Any], type_: str, key: str, value: Any) -> None:
    """Set `key` on the `type_` branch of a property (which may be `anyOf` with null)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == type_:
            branch[key] = value


def _settings_bounds(
    schemas: dict[str, Any],
    max_replicas_cap: int,
    gpu_types: Sequence[str],
    gpu_counts: Sequence[int],
    locations: Sequence[str],
) -> None:
    """Bounds that are this server's settings and catalog, written into the
    request bodies, so that what the document says is exactly what the server
    accepts field by field. modelName is not an enum: models registered while
    the server runs are valid names too."""
    create = schemas["CreateEndpointRequest"]["properties"]
    update = schemas["UpdateEndpointRequest"]["properties"]
    for props in (create, update):
        for field in ("minReplicas", "maxReplicas"):
            _constrain(props[field], "integer", "maximum", max_replicas_cap)
        if gpu_types:
            _constrain(props["gpuType"], "string", "enum", list(gpu_types))
        if gpu_counts:
            _constrain(props["gpuCount"], "integer", "enum", sorted(gpu_counts))
    if locations:
        _constrain(create["locationName"], "string", "enum", list(locations))


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
    operations: Sequence[Operation],
    *,
    max_replicas_cap: int,
    gpu_types: Sequence[str] = (),
    gpu_counts: Sequence[int] = (),
    locations: Sequence[str] = (),
    server_url: str | None = None,
    parts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The document of `operations` (below /inference) and the server's own
    routes, with this server's bounds; `parts` are the documents of the other
    routes the server mounts (see `merge_part`)."""
    _, top = models_json_schema(
        _models([HEALTH, *(op.doc for op in operations)]), ref_template=_REF
    )
    schemas: dict[str, Any] = dict(top.get("$defs", {}))
    _settings_bounds(schemas, max_replicas_cap, gpu_types, gpu_counts, locations)
    paths: dict[str, Any] = {
        "/healthz": {"get": _operation(HEALTH, public=True)},
        "/openapi.json": _OPENAPI_PATH,
    }
    for op in operations:
        path = PREFIX + op.path
        paths.setdefault(path, {})[op.method.lower()] = _operation(
            op.doc, path=path, query=op.query, locations=locations
        )
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
    for part in parts:
        merge_part(doc, part)
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
