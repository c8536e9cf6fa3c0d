"""The management API's part of observability: every answer under
`/inference` carries an `x-request-id` (the caller's when it is a plain
token, else a new one), and, when tracing is on, each call is a span (the
caller's `traceparent` its parent)."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferd.tracing import end_span, request_id_from, tracer


class RequestSpans:
    """ASGI middleware for the management API's mount."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = request_id_from(given)
        method = scope["method"]
        span = tracer().start(
            f"{method} /inference",
            scope["headers"],
            {"http.request.method": method, "url.path": scope["path"]},
        )
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers: list[Any] = list(message.get("headers", ()))
                headers.append((b"x-request-id", request_id))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if span is not None:
                end_span(span, status, {"inferd.request_id": request_id.decode()})
