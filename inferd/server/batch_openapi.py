"""OpenAPI paths and components of the Batch API's routes
(`inferd.server.batch_routes`), merged into the server's document beside
the gateway's (the same `endpointToken` scheme, the same `ErrorBody`)."""

from __future__ import annotations

import copy
from typing import Any

from inferd.control.batches.model import BATCH_URLS, COMPLETION_WINDOW, STAMPS, Capacity
from inferd.gateway.openapi import SECURITY_SCHEME
from inferd.server.batch_routes import BASE, BATCH_ID, MAX_LIST

_REF = "#/components/schemas/{model}"
_INT = {"type": "integer"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}

SCHEMAS: dict[str, Any] = {
    "BatchFile": {
        "type": "object",
        "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "const": "file"},
            "bytes": _INT,
            "created_at": _INT,
            "filename": {"type": "string"},
            "purpose": {"type": "string", "enum": ["batch", "batch_output"]},
            "status": {"type": "string"},
            "expires_at": _NULLABLE_INT,
            "status_details": _NULLABLE_STR,
        },
    },
    "BatchFileList": {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"type": "string", "const": "list"},
            "data": {"type": "array", "items": {"$ref": _REF.format(model="BatchFile")}},
            "has_more": {"type": "boolean"},
        },
    },
    "BatchFileDeleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "const": "file"},
            "deleted": {"type": "boolean"},
        },
    },
    "Batch": {
        "type": "object",
        "required": [
            "id",
            "object",
            "endpoint",
            "input_file_id",
            "completion_window",
            "status",
            "created_at",
            "request_counts",
        ],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "const": "batch"},
            "endpoint": {"type": "string", "enum": list(BATCH_URLS)},
            "errors": {"type": ["object", "null"]},
            "input_file_id": {"type": "string"},
            "completion_window": {"type": "string", "const": COMPLETION_WINDOW},
            "status": {
                "type": "string",
                "enum": [
                    "validating",
                    "in_progress",
                    "finalizing",
                    "completed",
                    "failed",
                    "expired",
                    "cancelling",
                    "cancelled",
                ],
            },
            "output_file_id": _NULLABLE_STR,
            "error_file_id": _NULLABLE_STR,
            "created_at": _INT,
            "expires_at": _INT,
            **{stamp: _NULLABLE_INT for stamp in STAMPS.values()},
            "request_counts": {
                "type": "object",
                "required": ["total", "completed", "failed"],
                "properties": {"total": _INT, "completed": _INT, "failed": _INT},
            },
            "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "usage": {"type": "object"},
            "capacity": {"$ref": _REF.format(model="BatchCapacity")},
            "cost": {"type": "number", "description": "inferd's: the usage at the batch price."},
            "estimated_completion_at": {
                **_NULLABLE_INT,
                "description": "inferd's: when it should end, at its rate so far.",
            },
        },
    },
    "BatchList": {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"type": "string", "const": "list"},
            "data": {"type": "array", "items": {"$ref": _REF.format(model="Batch")}},
            "first_id": _NULLABLE_STR,
            "last_id": _NULLABLE_STR,
            "has_more": {"type": "boolean"},
        },
    },
    "CreateBatchRequest": {
        "type": "object",
        "required": ["input_file_id", "endpoint", "completion_window"],
        "properties": {
            "input_file_id": {"type": "string"},
            "endpoint": {"type": "string", "enum": list(BATCH_URLS)},
            "completion_window": {"type": "string", "enum": [COMPLETION_WINDOW]},
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": 16,
                "propertyNames": {"maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": 512},
            },
            "capacity": {"$ref": _REF.format(model="BatchCapacity")},
        },
    },
    "BatchCapacity": {
        "type": "string",
        "enum": [c.value for c in Capacity],
        "default": Capacity.WAKE.value,
        "description": "inferd's: 'wake' (the default) lets the batch wake the endpoint at "
        "zero and keep a replica up while it runs, within maxReplicas; 'running' runs it only "
        "on replicas that are up for other reasons (its requests wait while none is ready, "
        "and keep none up).",
    },
}

_ERRORS = {
    400: "Invalid input: a bad line of the file (each named), a wrong field, an unknown "
    "query parameter; `error.param` names it.",
    401: "Missing or wrong access token, another endpoint's, or an endpoint id that does "
    "not exist: one answer for all.",
    404: "No such file or batch on this endpoint (another endpoint's are absent too).",
    409: "The project's batch storage quota is full, or the batch can no longer be cancelled.",
    413: "The file is over the size limit (`batch_max_file_bytes`).",
    415: "An upload that is not multipart/form-data.",
}


def _error(status: int) -> dict[str, Any]:
    return {
        "description": _ERRORS[status],
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}},
    }


def _json(model: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=model)}}},
    }


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string"}}  # fmt: skip


def _op(
    operation_id: str,
    summary: str,
    answer: dict[str, Any],
    errors: tuple[int, ...],
    params: tuple[str, ...] = (),
) -> dict[str, Any]:
    parameters = [_path_param("endpoint_id", "Endpoint id (the last segment of its `url`).")]
    described = {"file_id": "A file's id (`file-...`).", "batch_id": "A batch's id (`batch_...`)."}
    parameters += [_path_param(name, described[name]) for name in params]
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["batch"],
        "parameters": parameters,
        # Any route: 400 for a query parameter it does not take.
        "responses": {"200": answer, **{str(s): _error(s) for s in sorted({400, *errors})}},
        "security": [{SECURITY_SCHEME: []}],
    }


def batch_openapi() -> dict[str, Any]:
    """{"paths": ..., "components": {"schemas": ...}}."""
    upload = _op("uploadBatchFile", "Upload a batch input file (JSONL, checked line by line)",
                 _json("BatchFile", "The file."), (400, 401, 404, 409, 413, 415))  # fmt: skip
    upload["requestBody"] = {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
    listing = _op("listBatches", "The endpoint's batches, newest first",
                  _json("BatchList", "A page."), (400, 401, 404))  # fmt: skip
    listing["parameters"] += [
        {"name": "after", "in": "query", "required": False,
         "schema": {"type": "string", "pattern": f"^{BATCH_ID.pattern}$"},
         "description": "The last batch id of the previous page."},
        {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST, "default": 20}},
    ]  # fmt: skip
    create = _op("createBatch", "Run an uploaded file's requests",
                 _json("Batch", "The batch (validating)."), (400, 401, 404, 413))  # fmt: skip
    create["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": _REF.format(model="CreateBatchRequest")}}
        },
    }
    jsonl = {
        "description": "JSONL.",
        "content": {"application/jsonl": {"schema": {"type": "string"}}},
    }
    content = _op(
        "getBatchFileContent",
        "A file's content: an input file, or a batch's output or error file (JSONL)",
        jsonl,
        (401, 404),
        ("file_id",),
    )
    files_list = _op(
        "listBatchFiles",
        "The endpoint's files",
        _json("BatchFileList", "Every file, newest first."),
        (400, 401, 404),
    )
    files_list["parameters"].append(
        {
            "name": "purpose",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": ["batch", "batch_output"]},
        }
    )
    paths = {
        f"{BASE}/files": {
            "post": upload,
            "get": files_list,
        },
        f"{BASE}/files/{{file_id}}": {
            "get": _op("getBatchFile", "A file", _json("BatchFile", "The file."),
                       (401, 404), ("file_id",)),
            "delete": _op("deleteBatchFile", "Delete a file",
                          _json("BatchFileDeleted", "Deleted."), (401, 404), ("file_id",)),
        },
        f"{BASE}/files/{{file_id}}/content": {"get": content},
        f"{BASE}/batches": {"post": create, "get": listing},
        f"{BASE}/batches/{{batch_id}}": {
            "get": _op("getBatch", "A batch, with its progress and an estimate of its end",
                       _json("Batch", "The batch."), (401, 404), ("batch_id",)),
        },
        f"{BASE}/batches/{{batch_id}}/cancel": {
            "post": _op("cancelBatch", "Cancel a batch (it keeps the results it has)",
                        _json("Batch", "The batch (cancelling or cancelled)."),
                        (401, 404, 409), ("batch_id",)),
        },
    }  # fmt: skip
    return {"paths": paths, "components": {"schemas": copy.deepcopy(SCHEMAS)}}
