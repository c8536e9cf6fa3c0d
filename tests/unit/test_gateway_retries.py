"""Which failed answers the gateway sends to another replica: only those
that did nothing a client could see twice (connection refused or reset before
a byte, a 503 from a replica draining, loading, or whose engine is dead);
never an answer the replica gave (a 4xx, a 500, another 503). In process,
over a scripted upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.gateway.upstream import UpstreamConnectError, UpstreamError
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.testing import verifier_for

EP = "ep-retries"
TOKEN = new_endpoint_token()
CHAT = f"/endpoints/{EP}/openai/v1/chat/completions"
OK = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()


def error(status: int, code: str) -> tuple[int, bytes]:
    return status, json.dumps({"error": {"message": "m", "type": "t", "code": code}}).encode()


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.headers = [(b"content-type", b"application/json")]
        self.complete = False
        self._body = body

    async def next_chunk(self) -> bytes:
        body, self._body = self._body, b""
        self.complete = True
        return body

    def close(self) -> None:
        pass


class Scripted:
    """Replica A answers as scripted; replica B answers 200."""

    def __init__(self, first: tuple[int, bytes] | Exception) -> None:
        self.first = first
        self.calls: list[str] = []

    async def send(self, base_url: str, *args: Any) -> Answer:
        self.calls.append(base_url)
        if base_url == "http://a" and isinstance(self.first, Exception):
            raise self.first
        if base_url == "http://a":
            assert not isinstance(self.first, Exception)
            return Answer(*self.first)
        return Answer(200, OK)

    def abort_host(self, base_url: str, reason: str) -> int:
        return 0

    async def aclose(self) -> None:
        pass


def call(first: tuple[int, bytes] | Exception) -> tuple[httpx.Response, list[str]]:
    directory = StaticDirectory()
    directory.add_endpoint(
        EndpointRoute(EP, "chat", "tiny-chat"),
        # B looks busier, so A is tried first.
        [RoutableReplica("a", "http://a"), RoutableReplica("b", "http://b", reported_waiting=9)],
    )
    upstream = Scripted(first)
    gateway = Gateway(directory, verifier_for({EP: TOKEN}), GatewaySettings(), upstream=upstream)
    app = Starlette(routes=gateway_routes(gateway), exception_handlers=EXCEPTION_HANDLERS)

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post(
                CHAT,
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )

    return asyncio.run(post()), upstream.calls


@pytest.mark.parametrize(
    "first",
    [
        UpstreamConnectError("connection refused"),
        UpstreamError("connection reset", before_response=True),
        error(503, "replica_draining"),
        error(503, "engine_dead"),
        error(503, "replica_failed"),
        error(503, "model_loading"),
    ],
    ids=["refused", "reset", "draining", "engine_dead", "replica_failed", "loading"],
)
def test_failures_before_any_work_are_answered_by_another_replica(
    first: tuple[int, bytes] | Exception,
) -> None:
    response, calls = call(first)
    assert response.status_code == 200 and response.content == OK
    assert calls == ["http://a", "http://b"]


@pytest.mark.parametrize(
    ("first", "status"),
    [
        (error(400, "invalid_request"), 400),
        (error(500, "engine_error"), 500),
        (error(503, "overloaded"), 503),
        (error(429, "rate_limited"), 429),
    ],
    ids=["400", "500", "503-other", "429"],
)
def test_answers_the_replica_gave_are_relayed_not_retried(
    first: tuple[int, bytes], status: int
) -> None:
    response, calls = call(first)
    assert response.status_code == status
    assert response.content == first[1]
    assert calls == ["http://a"]
