"""Slow and unfinished requests, against a real replica process (fake engine:
the limits are the HTTP server's) and a real `inferd serve`: thousands of
connections that send part of a request neither block a normal request nor
stay open past the (test-shortened) time limit, and connections past the cap
are refused in the one error shape."""

from __future__ import annotations

import json
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferd.testing import ReplicaHandle, ServeHandle

PARTIAL_CONNECTIONS = 2500
LIMIT_S = 10.0
PARTIAL = b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"


def open_partial(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(PARTIAL)
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def wait_closed(sockets: list[socket.socket], timeout: float) -> tuple[int, list[bytes]]:
    """How many of `sockets` the server closed within `timeout`, and what it
    wrote on them before closing."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        selector.register(sock, selectors.EVENT_READ, bytearray())
    closed = 0
    answers: list[bytes] = []
    deadline = time.monotonic() + timeout
    while closed < len(sockets) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                key.data.extend(data)
                continue
            selector.unregister(sock)
            answers.append(bytes(key.data))
            closed += 1
    selector.close()
    for sock in sockets:
        sock.close()
    return closed, answers


def check_partial_requests_are_closed(port: int, health_url: str) -> None:
    sockets = open_partial(port, PARTIAL_CONNECTIONS)
    opened = time.monotonic()
    try:
        # A normal request is answered while thousands of partial ones are open
        # (well inside the limit, on a shared box).
        assert httpx.get(health_url, timeout=LIMIT_S / 2).status_code == 200
        assert time.monotonic() - opened < LIMIT_S, "the check ran past the limit"
        closed, answers = wait_closed(sockets, timeout=LIMIT_S + 30)
    finally:
        for sock in sockets:
            sock.close()
    assert closed == PARTIAL_CONNECTIONS
    assert time.monotonic() - opened >= LIMIT_S
    # Each was answered 408 in the one error shape, then closed.
    for answer in answers[:50]:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:200]
        assert json.loads(body)["error"]["code"] == "request_timeout"
    # And the process still serves.
    assert httpx.get(health_url, timeout=5).status_code == 200


@pytest.fixture(scope="module")
def replica() -> Iterator[ReplicaHandle]:
    handle = ReplicaHandle(
        "tiny-chat",
        [
            *("--engine", "fake", "--request-timeout", str(LIMIT_S)),
            *("--max-connections", str(PARTIAL_CONNECTIONS + 100)),
        ],
    )
    try:
        yield handle.wait_ready(timeout=60)
    finally:
        handle.stop()


def test_replica_closes_partial_requests_after_the_limit(replica: ReplicaHandle) -> None:
    """2,500 connections that sent part of a request's headers: /health is still answered at
    once, and each partial one gets a 408 in the error shape and is closed after the limit."""
    port = int(replica.url.rsplit(":", 1)[1])
    check_partial_requests_are_closed(port, f"{replica.url}/health")


def test_serve_closes_partial_requests_after_the_limit(tmp_path: Path) -> None:
    """The same against `inferd serve`, its limit set by the request_timeout_seconds setting."""
    serve = ServeHandle(
        tmp_path,
        settings={
            "request_timeout_seconds": str(LIMIT_S),
            "max_connections": str(PARTIAL_CONNECTIONS + 100),
        },
    ).start()
    try:
        check_partial_requests_are_closed(serve.port, f"{serve.url}/healthz")
    finally:
        serve.stop()
        serve.cleanup()


def test_connections_past_the_cap_are_refused_in_the_error_shape(tmp_path: Path) -> None:
    """With a cap of 100 connections, the 101st and later are answered 503 in the error
    shape and closed; once the others go, the process serves again."""
    cap = 100
    handle = ReplicaHandle(
        "tiny-chat", ["--engine", "fake", "--max-connections", str(cap), "--no-warmup"]
    )
    try:
        handle.wait_ready(timeout=60)
        port = int(handle.url.rsplit(":", 1)[1])
        held = open_partial(port, cap)
        extra = open_partial(port, 20)
        closed, answers = wait_closed(extra, timeout=10)
        assert closed == 20
        for answer in answers:
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503"), answer[:200]
            assert json.loads(body)["error"]["code"] == "too_many_connections"
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(f"{handle.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the replica did not serve again"
            time.sleep(0.1)
    finally:
        handle.stop()
