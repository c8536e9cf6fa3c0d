"""OpenAPI paths and components of the gateway routes, to merge into the
server's document (`paths` and `components` are disjoint from the management
API's, except `ErrorBody`/`ErrorDetail`, which are the same model).

Each route's operation is generated from the doc it carries in the route
table (`inferd.gateway.app.ROUTES`, `inferd.gateway.route_doc`), as the
management API's is from its `Operation`s. Request bodies come from the
replica's wire models; the gateway passes them
through unparsed, and the replica answers 400 for what they refuse. Every
status either can answer is listed with its schema, so schemathesis can hold
the pair to it.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from inferd.api import management, openai
from inferd.gateway.app import PREFIX, ROUTES, GatewayRoute
from inferd.gateway.route_doc import OwnShape, VllmShape

_REF = "#/components/schemas/{model}"
SECURITY_SCHEME = "endpointToken"

_ERRORS = {
    400: "Invalid request (the replica validates the body): malformed JSON, a wrong or "
    "missing field, or a value beyond the model's limits; `error.param` names the field. "
    "Also a path of another kind of model than the endpoint serves (`unsupported_route`, "
    "saying what it serves).",
    401: "Missing, malformed or wrong access token, a token of another endpoint, or an "
    "endpoint id that does not exist: one answer for all.",
    404: "The endpoint no longer exists, or the requested `model` is not the endpoint's.",
    409: "A request with this request id is already running.",
    413: "Request body over the limit (answered before the body is read).",
    429: "Every replica is at its in-flight bound and the endpoint's waiting queue is full, "
    "or this client token holds more than its share of that queue, or its rate limit is reached.",
    500: "The replica failed while answering.",
    503: "No replica could take the request in time: the waiting queue is full while a "
    "replica starts, the wait timed out, or the endpoint is being deleted.",
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds after which a retry is likely to be served.",
        "schema": {"type": "integer", "minimum": 1},
    }
}
_WWW_AUTHENTICATE = {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}}

_OPEN = {"type": "object", "additionalProperties": True}
_RESPONSE_SCHEMAS: dict[str, Any] = {
    "ChatCompletion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "message", "finish_reason"],
                    "properties": {
                        "index": {"type": "integer"},
                        "message": {
                            "type": "object",
                            "required": ["role", "content"],
                            "properties": {
                                "role": {"type": "string", "const": "assistant"},
                                "content": {"type": ["string", "null"]},
                            },
                        },
                        "finish_reason": {"type": ["string", "null"]},
                    },
                },
            },
            "usage": {"$ref": _REF.format(model="CompletionUsage")},
        },
    },
    "CompletionUsage": {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": {"type": "integer", "minimum": 0},
            "completion_tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0},
        },
    },
    # One server-sent event (OpenAPI 3.1: the schema of an event-stream
    # media type describes each event).
    "ChatCompletionStreamEvent": {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "description": "A `chat.completion.chunk` JSON object; the last event is the "
                "literal `[DONE]`. A failure after the first event sends an ErrorBody JSON "
                "object instead and ends the stream.",
            },
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    },
    "ImagesResponse": {
        "type": "object",
        "required": ["created", "data"],
        "properties": {
            "created": {"type": "integer"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["b64_json"],
                    "properties": {"b64_json": {"type": "string", "description": "A PNG, base64."}},
                },
            },
        },
    },
    "InferenceModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"type": "string", "const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "object"],
                    "properties": {"id": {"type": "string"}, "object": {"type": "string"}},
                },
            },
        },
    },
}


def _model_schemas() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (openai.ChatCompletionRequest, "validation"),
        (openai.ImageGenerationRequest, "validation"),
        (management.ErrorBody, "serialization"),
    ]
    _, top = models_json_schema(models, ref_template=_REF)
    schemas: dict[str, Any] = dict(top.get("$defs", {}))
    _add_validator_rules(schemas)
    return schemas


def _branch(prop: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(b for b in prop.get("anyOf", [prop]) if b.get("type") == type_)


def _add_validator_rules(schemas: dict[str, Any]) -> None:
    """What the wire models check in validators (invisible to the generated
    schema) and is static, written into the schema. Limits that depend on the
    engine (context length, images per call, structured output support) stay
    out: those are 400s documented as such. So do tools and logprobs: vLLM
    serves them (with a tool parser configured), other engines refuse them."""
    chat = schemas["ChatCompletionRequest"]["properties"]
    _branch(chat["logit_bias"], "object")["propertyNames"] = {"pattern": r"^-?\d{1,10}$"}
    _branch(chat["stop"], "string")["minLength"] = 1
    _branch(chat["stop"], "array")["items"] = {"type": "string", "minLength": 1}
    images = schemas["ImageGenerationRequest"]["properties"]
    _branch(images["size"], "string")["pattern"] = r"^(auto|[1-9][0-9]{1,4}x[1-9][0-9]{1,4})$"
    images["response_format"]["enum"] = ["b64_json"]


def _json(schema: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=schema)}}},
    }
    if headers:
        response["headers"] = copy.deepcopy(headers)
    return response


def _error(status: int) -> dict[str, Any]:
    headers = _RETRY_AFTER if status in (429, 503) else _WWW_AUTHENTICATE if status == 401 else None
    return _json("ErrorBody", _ERRORS[status], headers)


def _answers(shape: OwnShape | VllmShape) -> dict[str, Any]:
    """The 200 answer (JSON, and server-sent events where the route streams)."""
    if isinstance(shape, VllmShape):
        content: dict[str, Any] = {
            "application/json": {"schema": {"type": "object", "description": shape.answer}}
        }
        if shape.streams:
            content["text/event-stream"] = {"schema": {"type": "string"}}
        return {"description": f"vLLM's {shape.answer}.", "content": content}
    if shape.stream is None:
        return _json(shape.answer, shape.description)
    return {
        "description": shape.description,
        "content": {
            "application/json": {"schema": {"$ref": _REF.format(model=shape.answer)}},
            "text/event-stream": {"schema": {"$ref": _REF.format(model=shape.stream)}},
        },
    }


def _request_schema(shape: OwnShape | VllmShape) -> dict[str, Any] | None:
    if isinstance(shape, VllmShape):
        return {"type": "object", "description": f"vLLM's {shape.request}."}
    if shape.request is None:
        return None
    return {"$ref": _REF.format(model=shape.request)}


def _operation(route: GatewayRoute) -> dict[str, Any]:
    """The route's operation, from the doc it carries in the route table."""
    shape = route.doc.about.shape
    responses: dict[str, Any] = {"200": _answers(shape)}
    for status in shape.errors:
        responses[str(status)] = _error(status)
    op: dict[str, Any] = {
        "operationId": route.doc.operation_id,
        "summary": route.doc.about.summary,
        "tags": ["inference"],
        "parameters": [
            {
                "name": "endpoint_id",
                "in": "path",
                "required": True,
                "description": "Endpoint id (the last segment of the endpoint's `url`).",
                "schema": {"type": "string"},
            }
        ],
        "responses": responses,
        "security": [{SECURITY_SCHEME: []}],
    }
    request = _request_schema(shape)
    if request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
    return op


def gateway_openapi() -> dict[str, Any]:
    """{"paths": ..., "components": {"schemas": ..., "securitySchemes": ...}}."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(PREFIX + route.path, {})[route.method.lower()] = _operation(route)
    schemas = _model_schemas()
    schemas.update(copy.deepcopy(_RESPONSE_SCHEMAS))
    return {
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The endpoint's access token (shown once at creation or "
                    "on 'Request Access Token'). It opens this endpoint only.",
                }
            },
        },
    }
