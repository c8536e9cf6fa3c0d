"""One forward attempt: send the request to a replica and relay its answer.

Nothing is sent to the client until the replica's first body bytes are in,
so an attempt that fails before then (connection refused or reset, replica
draining or still loading) can be retried elsewhere: it returns a `Retry`.
After that, bytes go out as they arrive; a failure of an event stream ends
it with an SSE error event, never a silent stall.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.types import Send

from inferd.api.openai import sse_error
from inferd.gateway.migration import (
    DONE_EVENT,
    ERROR_EVENT,
    Transcript,
    rewrite_heads,
    split_events,
    strip_ids,
)
from inferd.gateway.upstream import (
    Headers,
    Upstream,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResponse,
)

# Response headers passed back to the client; the rest (server, date,
# connection, transfer-encoding) belong to the hop.
RELAYED_RESPONSE_HEADERS = frozenset(
    {b"content-type", b"content-length", b"x-request-id", b"retry-after", b"cache-control"}
)
# 503 codes a replica answers before it did anything: safe to send elsewhere
# (a dead engine fails requests before their first byte, then the replica
# reports itself failed and is replaced).
RETRYABLE_CODES = frozenset({"replica_draining", "model_loading", "engine_dead", "replica_failed"})
_MAX_PEEK = 64 * 1024


@dataclass(frozen=True)
class Retry:
    reason: str  # "unreachable" | "connection" | "draining"
    detail: str
    unreachable: bool = False


@dataclass(frozen=True)
class Relayed:
    status: int
    # The stream broke after the client had bytes (an SSE error event ended
    # it) — counted as an upstream error.
    broken: bool = False


def with_call_key(headers: Headers, call_key: str) -> Headers:
    """The request's headers plus the replica's call key, which the replica
    requires of every call (the client's own Authorization never goes
    upstream)."""
    if not call_key:
        return headers
    return [*headers, (b"authorization", b"Bearer " + call_key.encode())]


def _retryable_503(body: bytes) -> bool:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return code in RETRYABLE_CODES


def _relayed_headers(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bool]:
    out = []
    sse = False
    for name, value in headers:
        if name in RELAYED_RESPONSE_HEADERS:
            out.append((name, value))
            if name == b"content-type" and value.startswith(b"text/event-stream"):
                sse = True
    return out, sse


@dataclass(frozen=True)
class Broken:
    """The replica was lost after the client had bytes of an event stream;
    nothing was sent to end the client's response: the caller continues it
    on another replica or ends it with an error event."""

    reason: str  # "connection_lost" | "engine_failed"
    detail: str
    status: int


@dataclass
class Leg:
    """One replica's part of a client's event stream that may be migrated.
    `transcript` keeps what the client has read; `head` (a continuation's
    leg) is the original answer's chunk head, written over this replica's;
    `started`: the client's response has begun (status and headers sent)."""

    transcript: Transcript
    head: bytes | None = None
    started: bool = False


async def forward(
    upstream: Upstream,
    base_url: str,
    method: str,
    path: str,
    headers: Headers,
    body: bytes,
    send: Send,
    leg: Leg | None = None,
    committed: bool = False,
) -> Retry | Relayed | Broken:
    """`leg`: the answer may be migrated: an event stream is relayed whole
    events at a time and kept, and its loss returns `Broken` instead of
    ending the client's response. `committed`: the client's response began
    (200, an event stream) while the request was held: the replica's stream
    continues it, and an error it answers instead goes in-band."""
    try:
        response = await upstream.send(base_url, method, path, headers, body)
    except UpstreamConnectError as exc:
        return Retry("unreachable", str(exc), unreachable=True)
    except UpstreamError as exc:
        return Retry("connection", str(exc))
    try:
        status = response.status
        try:
            first = await response.next_chunk()
            if status == 503:
                # Small error bodies: read it all to see whether to retry.
                while not response.complete and len(first) < _MAX_PEEK:
                    more = await response.next_chunk()
                    if not more:
                        break
                    first += more
                if _retryable_503(first):
                    return Retry("draining", f"replica answered 503 {first[:200]!r}")
        except UpstreamError as exc:
            return Retry("connection", str(exc))
        relayed, sse = _relayed_headers(response.headers)
        if leg is not None and leg.started:
            if status != 200 or not sse:
                return Broken("continuation_refused", _error_text(first), status)
            return await _relay_events(response, first, send, leg, status)
        if not committed:
            await send({"type": "http.response.start", "status": status, "headers": relayed})
        elif status != 200 or not sse:
            return await _error_in_band(response, first, status, send)
        if leg is not None and sse and status == 200:
            leg.started = True
            return await _relay_events(response, first, send, leg, status)
        done = response.complete  # `first` held everything that had arrived
        await send({"type": "http.response.body", "body": first, "more_body": not done})
        if done:
            return Relayed(status)
        try:
            while True:
                chunk = await response.next_chunk()
                if not chunk:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError:
            if not sse:
                # Returning without ending the body makes the server close the
                # client's connection: a cut body must not pass for an answer.
                return Relayed(status, broken=True)
            await send({"type": "http.response.body", "body": STREAM_FAILED, "more_body": False})
            return Relayed(status, broken=True)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return Relayed(status)
    finally:
        response.close()


STREAM_FAILED = sse_error(
    "The replica serving this stream failed; the response is incomplete.",
    "server_error",
    "upstream_failed",
)


async def _relay_events(
    response: UpstreamResponse, data: bytes, send: Send, leg: Leg, status: int
) -> Relayed | Broken:
    """Relay whole events only (a replica lost mid-event leaves no half event
    at the client), keep them in the transcript with their token-id lines
    (the client reads them without), and stop at an error event (the
    replica's engine failed) without relaying it."""
    pending = b""
    last = b""
    head = leg.head
    transcript = leg.transcript
    while True:
        events, pending = split_events(data, pending)
        if events:
            failed = events.find(ERROR_EVENT)
            if failed >= 0:
                events, error = events[:failed], events[failed:]
            if head is not None:
                events = rewrite_heads(events, head)
            if events:
                transcript.add(events)
                events = strip_ids(events)
            if events:
                await send({"type": "http.response.body", "body": events, "more_body": True})
                last = events
            if failed >= 0:
                return Broken("engine_failed", _error_text(error), status)
        try:
            data = await response.next_chunk()
        except UpstreamError as exc:
            return Broken("connection_lost", str(exc), status)
        if not data:
            break
    if pending or not last.endswith(DONE_EVENT):
        return Broken("connection_lost", "the stream ended before [DONE]", status)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return Relayed(status)


async def _error_in_band(
    response: UpstreamResponse, first: bytes, status: int, send: Send
) -> Relayed:
    """The replica answered an error (or no stream) to a request whose
    response is already an event stream: its error ends the stream, as the
    error event it would have had, its status only in the gateway's count."""
    body = first
    try:
        while not response.complete and len(body) < _MAX_PEEK:
            more = await response.next_chunk()
            if not more:
                break
            body += more
    except UpstreamError:
        pass  # what arrived is told
    await send({"type": "http.response.body", "body": _error_event(status, body),
                "more_body": False})  # fmt: skip
    # A 200 that is no stream is the replica's fault: counted as a broken answer.
    return Relayed(status, broken=status == 200)


def _error_event(status: int, body: bytes) -> bytes:
    if status == 200:
        return sse_error(
            "The replica answered without an event stream; the response is incomplete.",
            "server_error",
            "upstream_failed",
        )
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        error = None
    if isinstance(error, dict):  # the replica's own error, as a stream ends with it
        return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    kind = "invalid_request_error" if status < 500 else "server_error"
    return sse_error(f"The replica answered {status}: {_error_text(body)}", kind, None)


def _error_text(body: bytes) -> str:
    text = body[:300].decode("utf-8", "replace").strip()
    return text.removeprefix("data: ")
