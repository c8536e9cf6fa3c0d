"""The one error handler table of every Starlette app inferd serves.

Split from `inferd.errors` so that the exceptions stay framework-free (the
engines raise them without importing Starlette).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InferdError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
)

logger = logging.getLogger("inferd.errors")


def error_response(exc: InferdError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


_HTTP_STATUS_TO_ERROR: dict[int, type[InferdError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


async def _handle_inferd_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InferdError)
    if exc.status >= 500:
        logger.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
    return error_response(exc)


async def _handle_http_exception(request: Request, exc: Exception) -> Response:
    # Starlette raises these itself for unknown routes (404) and wrong methods (405).
    assert isinstance(exc, HTTPException)
    cls = _HTTP_STATUS_TO_ERROR.get(exc.status_code, InternalError)
    if exc.status_code == 404:
        message = f"No route for {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    err = cls(message)
    headers = dict(exc.headers or {})
    headers.update(err.headers())
    return JSONResponse(err.body(), status_code=exc.status_code, headers=headers)


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    # Never leak internals (or a token that happened to be in an exception
    # message) to the client; the log has the traceback.
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(InternalError("The server had an error while processing the request."))


# One table per app: `Starlette(exception_handlers=EXCEPTION_HANDLERS)`.
EXCEPTION_HANDLERS: dict[Any, Any] = {
    InferdError: _handle_inferd_error,
    HTTPException: _handle_http_exception,
    Exception: _handle_unexpected,
}
