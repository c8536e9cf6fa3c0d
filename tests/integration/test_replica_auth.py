"""A replica with a secret answers only calls that carry its call key (the
gateway's); probes reach the paths the operator leaves open."""

from __future__ import annotations

import hashlib

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from inferd.gateway.proxy import with_call_key
from inferd.replica.auth import RequireCallKey, call_key

SECRET = "s3cret-of-one-replica"


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def _client(open_paths: tuple[str, ...] = ("/health", "/healthz", "/metrics")) -> TestClient:
    inner = Starlette(
        routes=[
            Route("/openai/v1/chat/completions", _ok, methods=["POST"]),
            Route("/health", _ok),
            Route("/metrics", _ok),
        ]
    )
    app = RequireCallKey(inner, call_key(SECRET), open_paths)
    return TestClient(app, base_url="http://replica")


def test_the_call_key_is_the_digest_the_control_plane_keeps() -> None:
    assert call_key(SECRET) == hashlib.sha256(SECRET.encode()).digest().hex()


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("Bearer wrong", 401),
        (f"Bearer {SECRET}", 401),  # the secret itself is for reports, not calls
        (f"Bearer {call_key(SECRET)}", 200),
    ],
)
def test_inference_needs_the_call_key(authorization: str | None, status: int) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with _client() as client:
        response = client.post("/openai/v1/chat/completions", headers=headers, json={})
    assert response.status_code == status
    if status == 401:
        assert response.json()["error"]["code"] == "replica_key_required"
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_health_and_metrics_are_open_unless_the_operator_closes_them() -> None:
    with _client() as client:
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
    with _client(open_paths=()) as client:
        assert client.get("/health").status_code == 401
        assert client.get("/metrics").status_code == 401


def test_the_gateway_adds_the_key_only_when_it_has_one() -> None:
    headers = [(b"content-type", b"application/json")]
    assert with_call_key(headers, "") == headers
    assert with_call_key(headers, "abc")[-1] == (b"authorization", b"Bearer abc")
