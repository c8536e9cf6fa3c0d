"""Requests the server makes to its own gateway, without a socket (the
Batch API's): the path a client's request takes, marked as in-process work
(`inferd.gateway.inprocess`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from inferd import COMPAT_FAMILY
from inferd.gateway.app import ROUTES, Gateway, GatewayRoute
from inferd.gateway.inprocess import (
    BATCH_PRIORITY,
    GRANT_KEY,
    PRIORITY_HEADER,
    PRIORITY_KEY,
    InProcessGrant,
)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    request_id: str


class InProcessCaller:
    """POSTs to the gateway's routes without a socket."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._routes = {(r.method, r.path): r for r in ROUTES}

    def route(self, url: str) -> GatewayRoute:
        """The gateway route of an OpenAI path (`/v1/chat/completions`)."""
        return self._routes[("POST", f"/{COMPAT_FAMILY}{url}")]

    async def wait_ready(self, endpoint_id: str, timeout: float) -> bool:
        """Whether the endpoint has a ready replica (waiting up to `timeout`
        seconds for one); asks for none."""
        return await self._gateway.directory.wait_ready(endpoint_id, timeout)

    async def post(self, grant: InProcessGrant, url: str, body: bytes, request_id: str) -> Reply:
        route = self.route(url)
        endpoint_id = grant.endpoint_id
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": f"/endpoints/{endpoint_id}{route.path}",
            "raw_path": f"/endpoints/{endpoint_id}{route.path}".encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id.encode()),
                (PRIORITY_HEADER, BATCH_PRIORITY.encode()),
            ],
            "client": None,
            "server": None,
            "path_params": {"endpoint_id": endpoint_id},
            PRIORITY_KEY: BATCH_PRIORITY,
            GRANT_KEY: grant,
        }
        sent = False
        never = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            # No disconnect: the caller waits for the whole answer.
            await never
            raise AssertionError("unreachable")

        status = 0
        chunks: list[bytes] = []
        answered_id = request_id

        async def send(message: Any) -> None:
            nonlocal status, answered_id
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-request-id":
                        answered_id = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self._gateway.handle(scope, receive, send, route)
        finally:
            never.cancel()
        return Reply(status, b"".join(chunks), answered_id)
