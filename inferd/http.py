"""Request-body helpers shared by every Starlette app in inferd.

Bodies are size-checked before they are parsed (413 from `Content-Length`
alone when it is declared, else while streaming), parsed as JSON, and
validated with pydantic; every failure becomes a 400 in the one error shape,
never Starlette's or pydantic's own 422.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from inferd.errors import BadRequest, PayloadTooLarge, field_path

ModelT = TypeVar("ModelT", bound=BaseModel)

DEFAULT_MAX_BODY_BYTES = 1 << 20


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_len = int(declared)
        except ValueError:
            raise BadRequest("Invalid Content-Length header.", code="invalid_header") from None
        if declared_len > max_bytes:
            raise PayloadTooLarge(
                f"Request body of {declared_len} bytes exceeds the limit of {max_bytes} bytes."
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


# A `\uD800`-`\uDFFF` escape: valid JSON syntax, but unpaired it is no
# Unicode text, and any later encode (a tokenizer, an error message echoing
# it) fails. Bodies with none (nearly all) skip the check entirely.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_unicode(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(
                "Request body contains an unpaired UTF-16 surrogate escape; "
                "strings must be valid Unicode.",
                code="invalid_json",
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key)
            _check_unicode(item)
    elif isinstance(value, list):
        for item in value:
            _check_unicode(item)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("Request body is empty; a JSON object is required.", code="invalid_json")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(value)
    return value


def validation_error_to_bad_request(exc: ValidationError) -> BadRequest:
    first = exc.errors(include_url=False)[0]
    param = field_path(first.get("loc", ()))
    message = first.get("msg", "Invalid value.")
    if param:
        message = f"Invalid value for '{param}': {message}"
    error_type = first.get("type", "")
    code = "missing_required_parameter" if error_type == "missing" else "invalid_value"
    return BadRequest(message, param=param, code=code)


def validate(model: type[ModelT], data: Any) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_bad_request(exc) from None


async def read_model(request: Request, model: type[ModelT], max_bytes: int) -> ModelT:
    raw = await read_body(request, max_bytes)
    return validate(model, parse_json_object(raw))
