"""Connection limits for every inferd HTTP server (replicas and `inferd serve`).

uvicorn has no time limit for receiving a request, and its concurrency limit
is checked only once a request's headers are complete: a client that opens
connections and sends part of a request holds them, and a few thousand such
connections use up the process's file descriptors and lock every other
client out. This protocol adds the two limits nginx has by default:

- a request's headers and body must arrive within `request_timeout` seconds
  of its first byte (nginx: client_header_timeout / client_body_timeout, 60 s);
  past it, the connection is answered 408 in inferd's error shape and closed
  (or only closed, when the application is already reading the body);
- at most `max_connections` open connections per process; one more is
  answered 503 in the error shape and closed at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 10_000


def error_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 response in the one error shape, closing the connection."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "server_error" if status >= 500 else "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the two limits; build a subclass
    with `limited_protocol` to set them."""

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receive_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(
                error_response(
                    503,
                    "Service Unavailable",
                    f"This server has {self.max_connections} connections open, its limit; "
                    "retry shortly.",
                    "too_many_connections",
                )
            )
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        # The first byte of a new request on a kept-alive connection starts
        # its clock (uvicorn's keep-alive timeout covers the idle time before).
        if self._receive_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()
        super().data_received(data)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._receive_deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._receive_deadline is not None:
            self._receive_deadline.cancel()
            self._receive_deadline = None

    def _too_slow(self) -> None:
        self._receive_deadline = None
        if self.transport.is_closing():
            return
        reading_body = self.cycle is not None and not self.cycle.response_complete
        if not reading_body:
            # Headers never completed: nothing answers this request but us.
            self.transport.write(
                error_response(
                    408,
                    "Request Timeout",
                    f"The request did not arrive within {self.request_timeout:g} s.",
                    "request_timeout",
                )
            )
        self.transport.close()


def limited_protocol(request_timeout: float, max_connections: int) -> type[HttpToolsProtocol]:
    """The protocol class to pass as uvicorn's `http`, with these limits."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {"request_timeout": request_timeout, "max_connections": max_connections},
    )
