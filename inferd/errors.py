"""Domain errors and the one error body shape used on every HTTP surface.

Every error inferd answers with is::

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

The `type` values follow OpenAI's vocabulary so that the official clients map
them to their own exception classes (`BadRequestError`, `AuthenticationError`,
...). Each exception carries its HTTP status, so handlers never choose one.

No web framework here: engines raise these, and importing an engine must not
pull in Starlette. The handler table is in `inferd.http_errors`.
"""

from __future__ import annotations

from typing import Any

from inferd.redact import redact


class InferdError(Exception):
    """Base of every error that becomes an HTTP answer."""

    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        # Seconds; sent as `Retry-After` (rounded up) on 429 and 503.
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, int(-(-self.retry_after // 1))))}


class BadRequest(InferdError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class Unauthorized(InferdError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(InferdError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(InferdError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class MethodNotAllowed(InferdError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(InferdError):
    status = 409
    type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(InferdError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaType(InferdError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class TooManyRequests(InferdError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"


class ServiceUnavailable(InferdError):
    status = 503
    type = "service_unavailable_error"
    code = "unavailable"


class BadGateway(InferdError):
    status = 502
    type = "server_error"
    code = "upstream_error"


class GatewayTimeout(InferdError):
    status = 504
    type = "server_error"
    code = "upstream_timeout"


class InternalError(InferdError):
    status = 500
    type = "server_error"
    code = "internal_error"


# Messages quote what the client sent (an id, a model name, a path, a key of
# logit_bias): anything shaped like a token is redacted (a token sent in the
# wrong place must not come back in a body that proxies and clients log), and
# the text is clipped, so that an error body stays small whatever was sent.
MAX_ERROR_MESSAGE_CHARS = 1000
MAX_ERROR_PARAM_CHARS = 100


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    message = _clip(redact(message), MAX_ERROR_MESSAGE_CHARS)
    param = None if param is None else _clip(redact(param), MAX_ERROR_PARAM_CHARS)
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# pydantic puts the member of a union that failed into `loc` ("str",
# "list[str]", "function-after[...]", a model class name); a client wants the
# field's path only.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "tuple", "bytes"})


def _is_type_tag(part: str) -> bool:
    return part in _TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper()


def field_path(loc: Any) -> str | None:
    """The dotted path of the field a pydantic error's `loc` points at
    (`messages.0.content`), without the union members pydantic adds."""
    parts = [str(part) for part in loc if not _is_type_tag(str(part))]
    return ".".join(parts) if parts else None
