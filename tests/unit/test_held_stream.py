"""A streaming request held at zero shows it is coming: 200 and event-stream
headers once it is held, SSE comment lines while it waits, then the
replica's stream in the same response; a hold that ends without a replica
ends the stream with an error event. What is refused before a byte keeps its
status. A fake replica behind the real gateway; the `openai` client and curl
read it over a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette

from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.held_stream import asks_to_stream
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.testing import verifier_for

EP = "ep-held"
TOKEN = new_endpoint_token()
CHAT = f"/endpoints/{EP}/openai/v1/chat/completions"
REPLICA = RoutableReplica("r-1", "http://r-1")
STREAM = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


def chunk(content: str, finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "tiny-chat",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }  # fmt: skip
    return b"data: " + json.dumps(event).encode() + b"\n\n"


EVENTS = [chunk("Hel"), chunk("lo", "stop"), b"data: [DONE]\n\n"]


class Answer:
    """The replica's answer, a chunk at a time (an upstream response)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
        self.status = status
        self.headers = headers
        self.complete = False
        self._chunks = list(chunks)

    async def next_chunk(self) -> bytes:
        await asyncio.sleep(0)
        if not self._chunks:
            self.complete = True
            return b""
        return self._chunks.pop(0)

    def close(self) -> None:
        pass


class Replica:
    """The fake replica's side of the upstream: answers each request with
    `answer` (streams for streaming requests, a JSON body otherwise), or
    keeps it until `release` is set."""

    def __init__(self, status: int = 200, body: bytes | None = None) -> None:
        self.status = status
        self.body = body
        self.release: asyncio.Event | None = None
        self.calls = 0

    async def send(self, base_url: str, method: str, path: str, headers: Any, body: bytes
                   ) -> Answer:  # fmt: skip
        self.calls += 1
        if self.release is not None:
            await self.release.wait()
        if self.body is not None:
            return Answer(self.status, [(b"content-type", b"application/json")], [self.body])
        if asks_to_stream(body):
            return Answer(200, SSE, EVENTS)
        reply = {"choices": [{"message": {"content": "Hello"}}]}
        return Answer(200, [(b"content-type", b"application/json")], [json.dumps(reply).encode()])

    def abort_host(self, base_url: str, reason: str) -> int:
        return 0

    async def aclose(self) -> None:
        pass


def gateway(replica: Replica, **settings: Any) -> tuple[Starlette, StaticDirectory]:
    directory = StaticDirectory()
    directory.add_endpoint(EndpointRoute(EP, "chat", "tiny-chat"))
    directory.set_coming(EP, "loading")
    knobs = {"hold_progress_seconds": 0.05, "hold_poll_seconds": 0.01, **settings}
    gw = Gateway(directory, verifier_for({EP: TOKEN}), GatewaySettings(**knobs), upstream=replica)
    return Starlette(routes=gateway_routes(gw), exception_handlers=EXCEPTION_HANDLERS), directory


async def post(app: Starlette, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """One request straight into the ASGI app; what it sends lands in `messages`."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": CHAT, "raw_path": CHAT.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 5000), "server": ("gw", 80),
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode()),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode())],
    }  # fmt: skip
    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await app(scope, receive, send)


def body_of(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def waiting_lines(body: bytes) -> list[bytes]:
    return [line for line in body.split(b"\n") if line.startswith(b": waiting for a replica")]


@pytest.mark.parametrize("migration", [True, False], ids=["migratable", "not-migratable"])
def test_a_stream_held_at_zero_shows_it_is_coming_then_the_replica_streams(
    migration: bool,
) -> None:
    async def scenario() -> list[dict[str, Any]]:
        app, directory = gateway(Replica(), migration=migration)
        messages: list[dict[str, Any]] = []
        request = asyncio.ensure_future(post(app, STREAM, messages))
        # The headers go out at once, then a line every 50 ms.
        await until(lambda: len(waiting_lines(body_of(messages))) >= 3)
        directory.set_ready(EP, [REPLICA])
        await asyncio.wait_for(request, 5)
        return messages

    messages = asyncio.run(scenario())
    starts = [m for m in messages if m["type"] == "http.response.start"]
    assert len(starts) == 1 and starts[0] is messages[0] and starts[0]["status"] == 200
    headers = dict(starts[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    body = body_of(messages)
    lines = waiting_lines(body)
    assert lines[0] == b": waiting for a replica (loading, 0 s)"
    # Every line before the replica's first event; its events whole, in order, after them.
    waited, _, streamed = body.partition(b"data: ")
    assert len(waiting_lines(waited)) == len(lines)
    assert b"data: " + streamed == b"".join(EVENTS)
    assert messages[-1]["more_body"] is False


@pytest.mark.parametrize("ending", ["timeout", "deleted"])
def test_a_hold_that_ends_without_a_replica_ends_the_stream_with_an_error_event(
    ending: str,
) -> None:
    async def scenario() -> list[dict[str, Any]]:
        app, directory = gateway(Replica(), max_hold_seconds=0.4 if ending == "timeout" else 30)
        messages: list[dict[str, Any]] = []
        request = asyncio.ensure_future(post(app, STREAM, messages))
        await until(lambda: len(waiting_lines(body_of(messages))) >= 2)
        if ending == "deleted":
            directory.set_route(EndpointRoute(EP, "chat", "tiny-chat", deleting=True))
        await asyncio.wait_for(request, 5)
        return messages

    messages = asyncio.run(scenario())
    assert messages[0]["status"] == 200 and messages[-1]["more_body"] is False
    last = messages[-1]["body"]
    assert last.startswith(b"data: ") and last.endswith(b"\n\n")
    error = json.loads(last.removeprefix(b"data: "))["error"]
    code = "hold_timeout" if ending == "timeout" else "endpoint_deleting"
    assert error["code"] == code and error["type"] == "server_error" and error["message"]
    assert waiting_lines(body_of(messages[:-1]))  # it was told it waited first


def test_an_error_the_replica_answers_after_the_headers_goes_in_band() -> None:
    refusal = {"error": {"message": "max_tokens is too large", "type": "BadRequestError",
                         "param": "max_tokens", "code": 400}}  # fmt: skip
    replica = Replica(400, json.dumps(refusal).encode())

    async def scenario() -> list[dict[str, Any]]:
        app, directory = gateway(replica)
        messages: list[dict[str, Any]] = []
        request = asyncio.ensure_future(post(app, STREAM, messages))
        await until(lambda: waiting_lines(body_of(messages)))
        directory.set_ready(EP, [REPLICA])
        await asyncio.wait_for(request, 5)
        return messages

    messages = asyncio.run(scenario())
    assert [m["status"] for m in messages if m["type"] == "http.response.start"] == [200]
    assert messages[-1] == {
        "type": "http.response.body",
        "body": b"data: " + json.dumps(refusal).encode() + b"\n\n",
        "more_body": False,
    }


def answer(app: Starlette, body: dict[str, Any]) -> tuple[int, dict[bytes, bytes], bytes]:
    messages: list[dict[str, Any]] = []
    asyncio.run(asyncio.wait_for(post(app, body, messages), 5))
    start = messages[0]
    return start["status"], dict(start["headers"]), body_of(messages)


def test_what_is_refused_before_a_byte_keeps_its_status() -> None:
    # A full hold queue refuses a stream at admission: 503 and Retry-After, as before.
    app, _ = gateway(Replica(), max_held_requests=0)
    status, headers, body = answer(app, STREAM)
    assert status == 503 and b"retry-after" in headers
    assert json.loads(body)["error"]["code"] == "scaling_up"
    # A request that does not stream, held at zero until its time is up: 503 as before.
    app, _ = gateway(Replica(), max_hold_seconds=0.2)
    status, headers, body = answer(app, {**STREAM, "stream": False})
    assert status == 503 and json.loads(body)["error"]["code"] == "hold_timeout"
    # An endpoint whose replica fits nowhere: refused at once, never committed.
    app, directory = gateway(Replica())
    directory.set_route(EndpointRoute(EP, "chat", "tiny-chat", unplaceable="no node has a GPU"))
    status, _, body = answer(app, STREAM)
    assert status == 503 and json.loads(body)["error"]["code"] == "no_capacity"


def test_a_stream_waiting_only_for_a_busy_replica_is_not_committed() -> None:
    async def scenario() -> tuple[int, bytes]:
        replica = Replica()
        replica.release = asyncio.Event()
        app, directory = gateway(replica, max_in_flight_per_replica=1, max_hold_seconds=0.3)
        directory.set_ready(EP, [REPLICA])
        first: list[dict[str, Any]] = []
        busy = asyncio.ensure_future(post(app, STREAM, first))
        await until(lambda: replica.calls == 1)  # the only slot is taken
        second: list[dict[str, Any]] = []
        await asyncio.wait_for(post(app, STREAM, second), 5)
        replica.release.set()
        await asyncio.wait_for(busy, 5)
        assert first[0]["status"] == 200 and body_of(first) == b"".join(EVENTS)
        return second[0]["status"], body_of(second)

    status, body = asyncio.run(scenario())
    assert status == 503 and json.loads(body)["error"]["code"] == "hold_timeout"


# -- real clients over a socket -------------------------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, StaticDirectory]]:
    """The gateway on a port (uvicorn in a thread), its replica not ready."""
    app, directory = gateway(Replica(), max_hold_seconds=1.5)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", directory
    finally:
        server.should_exit = True
        thread.join(10)


class Recorded(httpx.HTTPTransport):
    """The openai client's transport, keeping the bytes it read; the
    replica becomes ready once the client has read `lines` waiting lines."""

    def __init__(self, directory: StaticDirectory, lines: int) -> None:
        super().__init__()
        self.seen = bytearray()
        self.directory = directory
        self.lines = lines

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.stream = _Tee(response.stream, self)  # type: ignore[arg-type]
        return response


class _Tee(httpx.SyncByteStream):
    def __init__(self, stream: Any, recorded: Recorded) -> None:
        self.stream = stream
        self.recorded = recorded

    def __iter__(self) -> Iterator[bytes]:
        seen = self.recorded.seen
        for part in self.stream:
            seen.extend(part)
            if len(waiting_lines(bytes(seen))) == self.recorded.lines:
                self.recorded.directory.set_ready(EP, [REPLICA])
            yield part

    def close(self) -> None:
        self.stream.close()


def test_the_openai_client_skips_the_waiting_lines_and_raises_the_in_band_error(
    served: tuple[str, StaticDirectory],
) -> None:
    url, directory = served
    directory.set_ready(EP, [])
    transport = Recorded(directory, lines=3)
    client = openai.OpenAI(
        base_url=f"{url}/endpoints/{EP}/openai/v1",
        api_key=TOKEN,
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )
    stream = client.chat.completions.create(
        model="tiny-chat", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == "Hello" and len(waiting_lines(bytes(transport.seen))) >= 3
    # No replica in time: the stream's error event is the client's exception
    # (an APIError of the stream, not the APIStatusError of a status).
    directory.set_ready(EP, [])
    transport.lines = 0  # never ready
    with pytest.raises(openai.APIError, match="No replica of this endpoint became available") as e:
        for _ in client.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass
    assert not isinstance(e.value, openai.APIStatusError)


def test_curl_prints_the_waiting_lines_then_the_stream(
    served: tuple[str, StaticDirectory],
) -> None:
    url, directory = served
    directory.set_ready(EP, [])
    curl = subprocess.Popen(
        ["curl", "-sSN", "--max-time", "20", f"{url}{CHAT}",
         "-H", f"Authorization: Bearer {TOKEN}", "-H", "Content-Type: application/json",
         "-d", json.dumps(STREAM)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert curl.stdout is not None
    try:
        shown = b""
        while len(waiting_lines(shown)) < 3:  # curl prints them as they come
            line = curl.stdout.readline()
            assert line, shown
            shown += line
        directory.set_ready(EP, [REPLICA])
        shown += curl.stdout.read()
        assert curl.wait(15) == 0
    finally:
        curl.kill()
        curl.wait()
    assert shown.startswith(b": waiting for a replica (loading, 0 s)\n")
    assert shown.endswith(b"".join(EVENTS))
