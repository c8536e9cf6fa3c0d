"""Helpers of the fault tests (issue 5, items 1-6): polling with deadlines,
metrics, replicas of an `inferd serve` by id, endpoints and their requests.

Import from here, not from conftest (fixtures live there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette

from inferd import procfs
from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.engines.fake import WORDS as FAKE_WORDS
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.testing import ReplicaHandle, ServeHandle, free_port, verifier_for
from tests.support import metrics_text

CHAT = "/openai/v1/chat/completions"
IMAGES = "/v1/images/generations"
HELLO = [{"role": "user", "content": "Hello"}]
ERROR_FIELDS = {"message", "type", "param", "code"}


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = ""
) -> float:
    """Poll until `predicate()` is truthy; seconds it took. Fails past `timeout`."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what or predicate}")
        time.sleep(interval)


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` at `url`/metrics whose labels include `labels`."""
    text = metrics_text(url)
    total = 0.0
    for match in re.finditer(rf"^{name}(?:{{(.*?)}})? ([0-9.e+-]+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def fake_words(count: int) -> str:
    """The text the fake engine writes for `count` tokens (no seed, no adapter)."""
    return "".join(FAKE_WORDS[i % len(FAKE_WORDS)] + " " for i in range(count))


def chat_body(max_tokens: int = 4, *, stream: bool = False) -> dict[str, Any]:
    return {"model": "tiny-chat", "messages": HELLO, "max_tokens": max_tokens, "stream": stream}


@dataclass(frozen=True)
class Endpoint:
    """An endpoint of a running `inferd serve`, as created."""

    id: str
    url: str
    token: str

    @classmethod
    def create(cls, serve: ServeHandle, **body: Any) -> Endpoint:
        created = serve.create_endpoint(**body)
        return cls(created["id"], created["url"], created["accessToken"])

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def post(self, path: str, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=self.headers, timeout=timeout)


def ready_ids(record: dict[str, Any]) -> set[str]:
    return {r["id"] for r in record["replicas"] if r["status"] == "ready"}


def statuses(record: dict[str, Any]) -> list[str]:
    return sorted(r["status"] for r in record["replicas"])


def replica_url(serve: ServeHandle, replica_id: str) -> str:
    """The replica's own base URL, from the line it logs when it binds."""
    return serve.replica_url(replica_id)


def replica_pid(serve: ServeHandle, replica_id: str) -> int | None:
    """PID of the live (not zombie) replica process with this id, if any."""
    for pid in serve.replica_pids():
        if replica_id.encode() in (procfs.command_line(pid) or []):
            return pid
    return None


pid_alive = procfs.alive


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def sse_data(lines: Iterator[str]) -> Iterator[dict[str, Any] | str]:
    """The `data:` payloads of an event stream: parsed JSON, or "[DONE]"."""
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


def assert_error_shape(response: httpx.Response) -> dict[str, Any]:
    """The one error shape, small; returns the error object."""
    assert len(response.content) < 4096, response.content[:200]
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS, error
    return dict(error)


async def open_loop(
    send: Callable[[int], Awaitable[int | str]],
    rate: float,
    until: Callable[[], bool],
    max_seconds: float,
) -> list[int | str]:
    """Call `send(n)` for n = 0, 1, ... at a fixed `rate` per second, without
    waiting for answers (open loop), until `until()` or `max_seconds`; then
    wait for every answer. Returns what each returned (a status, or a word
    for what went wrong), or the name of the httpx error it raised."""

    async def one(n: int) -> int | str:
        try:
            return await send(n)
        except httpx.HTTPError as exc:
            return type(exc).__name__

    tasks = []
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < max_seconds and not until():
        tasks.append(asyncio.ensure_future(one(sent)))
        sent += 1
        # Keep the schedule: the n-th request leaves at start + n / rate.
        await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    return list(await asyncio.gather(*tasks))


async def stream_status(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> int | str:
    """POST a streamed request and read it whole: its status, or "broken
    stream" when a 200 stream did not end with `[DONE]` (an SSE error event
    ends a stream that failed after its first byte)."""
    async with client.stream("POST", url, json=body) as response:
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    if response.status_code == 200 and events[-1:] != ["data: [DONE]"]:
        return "broken stream"
    return response.status_code


class StreamReader(threading.Thread):
    """Reads one streamed chat completion on a thread: the `data:` events,
    when the stream ended, and how (an exception, if the client saw one)."""

    def __init__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.headers = url, body, headers
        self.status: int | None = None
        self.events: list[dict[str, Any] | str] = []
        self.times: list[float] = []  # when each event arrived (monotonic)
        self.started = threading.Event()  # the first event arrived (or it ended)
        self.ended_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", self.url, json=self.body, headers=self.headers, timeout=30
            ) as response:
                self.status = response.status_code
                for event in sse_data(response.iter_lines()):
                    self.events.append(event)
                    self.times.append(time.monotonic())
                    self.started.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.started.set()


def busy_replica(urls: dict[str, str], running: int = 1) -> str | None:
    """The id of a replica whose engine runs at least `running` requests."""
    for replica_id, url in urls.items():
        if metric(url, "inferd_engine_running") >= running:
            return replica_id
    return None


async def keep_alive_burst(
    url: str, body: dict[str, Any], headers: dict[str, str], count: int, concurrency: int
) -> list[int]:
    """`count` POSTs of `body` to `url` over `concurrency` keep-alive
    connections, each sending its next request when the last is answered;
    returns the statuses. Raw HTTP/1.1 on purpose: an httpx client spends
    more CPU per request than the gateway and the replica together, and on a
    small machine the load generator must not be what is measured."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    payload = json.dumps(body).encode()
    head = [f"POST {parts.path} HTTP/1.1", f"host: {parts.netloc}",
            "content-type: application/json", f"content-length: {len(payload)}"]  # fmt: skip
    head += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + payload

    async def connection(requests: int) -> list[int]:
        statuses: list[int] = []
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            for _ in range(requests):
                writer.write(request)
                response_head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                statuses.append(int(response_head[9:12]))
                length = re.search(r"\r\ncontent-length: *(\d+)", response_head)
                assert length, f"no content-length: {response_head!r}"
                await reader.readexactly(int(length.group(1)))
                if "\r\nconnection: close" in response_head:
                    writer.close()
                    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        finally:
            writer.close()
        return statuses

    shares = [count // concurrency + (i < count % concurrency) for i in range(concurrency)]
    answers = await asyncio.gather(*(connection(n) for n in shares if n))
    return [status for statuses in answers for status in statuses]


def open_request(url: str, body: dict[str, Any], headers: dict[str, str]) -> socket.socket:
    """Send a request on a raw socket and leave it open: closing it is a
    client that goes away (an httpx client closed from another thread than
    the one blocked reading does not close the connection)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    payload = json.dumps(body).encode()
    head = [f"POST {parts.path} HTTP/1.1", f"host: {parts.netloc}",
            "content-type: application/json", f"content-length: {len(payload)}"]  # fmt: skip
    head += [f"{name}: {value}" for name, value in headers.items()]
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float) -> bytes:
    """What the socket received up to and including `marker`'s first chunk."""
    sock.settimeout(timeout)
    received = b""
    while marker not in received:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before {marker!r}: {received[:300]!r}")
        received += chunk
    return received


GATEWAY_ENDPOINT = "rel-0000-gateway"


class GatewayInFront:
    """The real gateway (one endpoint, `GATEWAY_ENDPOINT`) in a Starlette app
    served by uvicorn on a thread, routing to fixed replicas."""

    def __init__(
        self, kind: str, model: str, replicas: list[ReplicaHandle], settings: GatewaySettings
    ) -> None:
        self.token = new_endpoint_token()
        self.directory = StaticDirectory()
        self.directory.add_endpoint(
            EndpointRoute(GATEWAY_ENDPOINT, kind, model),
            [RoutableReplica(f"r-{i}", r.url) for i, r in enumerate(replicas)],
        )
        self.gateway = Gateway(
            self.directory, verifier_for({GATEWAY_ENDPOINT: self.token}), settings
        )

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self.loop = asyncio.get_running_loop()
            await self.gateway.startup()
            yield
            await self.gateway.shutdown()

        app = Starlette(
            routes=gateway_routes(self.gateway),
            exception_handlers=EXCEPTION_HANDLERS,
            lifespan=lifespan,
        )
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10, 0.01, "the gateway started")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/endpoints/{GATEWAY_ENDPOINT}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def in_flight(self) -> int:
        return self.gateway.traffic(GATEWAY_ENDPOINT).in_flight

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
