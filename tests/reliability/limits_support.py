"""Helpers of the overload, bad-input and security tests (issue 5, items
7-13): process memory, raw HTTP for requests a client library will not send,
the one error shape, secrets in files.

Import from here, not from conftest (fixtures live there).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from inferd.testing import ServeHandle

ERROR_FIELDS = {"message", "type", "param", "code"}
# An error body is a sentence, never an echo of the request.
MAX_ERROR_BYTES = 2048


def rss_mib(pid: int) -> float:
    """Resident set size of a process, from /proc, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """`response` is `status` in the one error shape, small; returns the error."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    assert len(response.content) <= MAX_ERROR_BYTES, response.content[:200]
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == ERROR_FIELDS, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if code is not None:
        assert error["code"] == code, error
    return error


@dataclass(frozen=True)
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the end of the request head to the whole answer


def headers_only(url: str, path: str, headers: dict[str, str], timeout: float = 10) -> RawAnswer:
    """Send a request head (its `Content-Length` promising a body) and no body
    at all, then read the answer: a server that answers has decided without
    reading the body. The connection is closed without ever sending it."""
    parsed = httpx.URL(url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {parsed.host}:{parsed.port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    with socket.create_connection((parsed.host, parsed.port or 80), timeout=timeout) as sock:
        sock.sendall(head)
        sent = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        answer_headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            answer_headers[name.strip().lower()] = value.strip()
        length = int(answer_headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        seconds = time.monotonic() - sent
    return RawAnswer(int(status_line.split()[1]), answer_headers, rest[:length], seconds)


def raw_error(answer: RawAnswer, status: int) -> dict[str, Any]:
    assert answer.status == status, (answer.status, answer.body[:300])
    assert len(answer.body) <= MAX_ERROR_BYTES
    body = json.loads(answer.body)
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
    return dict(body["error"])


def files_containing(paths: list[Path], secrets: list[str]) -> dict[str, list[str]]:
    """{file: [secrets found in its raw bytes]} over `paths` (missing ones skipped)."""
    found: dict[str, list[str]] = {}
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        hits = [s for s in secrets if s.encode() in data]
        if hits:
            found[str(path)] = hits
    return found


def list_endpoints(serve: ServeHandle) -> dict[str, Any]:
    """GET /inference/endpoints, on a client closed at once (an idle
    keep-alive connection would hold up the server's graceful stop)."""
    with serve.api() as api:
        response = api.get("/inference/endpoints")
    assert response.status_code == 200, response.text
    return dict(response.json())
