"""A streaming request held at zero shows it is coming.

A chat or completion that asks for a stream (`"stream": true`) and is held
while its endpoint has no ready replica (scaled to zero, a replica still
starting or loading) gets its response at once: status 200 and
`text/event-stream` headers, then an SSE comment line every few seconds
saying what it waits for (`: waiting for a replica (loading, 23 s)`). SSE
clients skip comment lines (the `openai` client's decoder does; curl prints
them). When a replica takes the request, its event stream continues the same
response. When the hold ends without one (its time is up, the endpoint is
deleted, the gateway stops), the status can no longer be sent: the error goes
in-band as the error event a stream that fails midway ends with.

The rule: the response is committed only once the request is admitted to
the hold queue with no replica ready. A request refused at admission (a full
queue, an endpoint whose replica fits nowhere) is answered before any byte,
with its status (429/503 and Retry-After) as before; a request held only
because every ready replica is busy is not committed either (its wait is
short and its refusal is a 429 a client retries on).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from starlette.types import Send

from inferd.aio import wait_event
from inferd.api.openai import sse_error
from inferd.errors import InferdError

# Routes whose streams are OpenAI-style events (`data: {...}`, an error as
# `data: {"error": ...}`): the gateway knows how to end them with an error.
STREAMING_ROUTES = frozenset({"chat", "completions"})
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


def asks_to_stream(body: bytes) -> bool:
    """The request body asks for an event stream (`"stream": true`)."""
    if b'"stream"' not in body:  # most bodies: no parse at all
        return False
    try:
        request = json.loads(body)
    except ValueError:
        return False
    return isinstance(request, dict) and request.get("stream") is True


def waiting_line(stage: str, held_s: float) -> bytes:
    """One SSE comment line (a blank line after it: clients that read whole
    events pass it on at once)."""
    return f": waiting for a replica ({stage}, {held_s:.0f} s)\n\n".encode()


def error_event(exc: InferdError) -> bytes:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return sse_error(exc.message, kind, exc.code)


class HeldStream:
    """One streaming request's response while it is held. `held()` (the
    dispatcher's call, synchronous) starts it: headers once, then comment
    lines every `interval` seconds; `placed()` stops the lines before the
    replica's answer is relayed; `fail()` ends the response with an error
    event. `committed`: the headers went out (after which the request's
    answer is relayed without headers, and its errors go in-band)."""

    __slots__ = ("_arrived", "_beating", "_body", "_clock", "_interval", "_send", "_stage",
                 "_stop", "_streams", "committed")  # fmt: skip

    def __init__(
        self,
        body: bytes,
        send: Send,
        clock: Callable[[], float],
        interval: float,
        stage: Callable[[], str],
    ) -> None:
        """`body`: the request's, read for `"stream": true` only if it is held
        (most requests never are); `stage()`: what the request waits for, in
        a word or two ("loading", "starting"), read for each line."""
        self._body = body
        self._streams: bool | None = None
        self._send = send
        self._clock = clock
        self._interval = interval
        self._stage = stage
        self._arrived = clock()
        self._beating: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None  # made when it is first held
        self.committed = False

    def held(self) -> None:
        """The request is held with no replica ready: if it asks for a
        stream, its response starts."""
        if self._streams is None:
            self._streams = asks_to_stream(self._body)
        if self._streams and self._beating is None:
            self._stop = stop = asyncio.Event()
            self._beating = asyncio.get_running_loop().create_task(self._beat(stop))

    async def _beat(self, stop: asyncio.Event) -> None:
        if not self.committed:
            # Set first: from here on the response is this stream's, even
            # while the headers are still being written.
            self.committed = True
            await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        while True:
            line = waiting_line(self._stage(), self._clock() - self._arrived)
            await self._send({"type": "http.response.body", "body": line, "more_body": True})
            if await wait_event(stop, self._interval):
                return

    async def placed(self) -> None:
        """The request got its replica (or its hold ended): no more lines.
        A line being written is finished first, so that the replica's first
        bytes never land inside one."""
        beating, self._beating = self._beating, None
        if beating is not None and self._stop is not None:
            self._stop.set()
            await beating

    async def fail(self, exc: InferdError) -> None:
        """End a committed response with `exc` as an error event."""
        await self.placed()
        await self._send(
            {"type": "http.response.body", "body": error_event(exc), "more_body": False}
        )

    def cancel(self) -> None:
        """The request is over (its client went away): stop at once."""
        if self._beating is not None:
            self._beating.cancel()
            self._beating = None
