"""A lean HTTP/1.1 client for gateway -> replica traffic.

Why not httpx: on the gateway's hot path httpx (through httpcore and anyio)
costs several times what the rest of the proxy does per request; this pool
is one asyncio protocol per keep-alive connection, the httptools (llhttp)
parser that uvicorn already uses, one write per request and no per-request
task. It speaks only what replicas speak: requests with a body of known
length, responses with Content-Length or chunked bodies.

Streaming: body bytes are handed over as they arrive; reading from the
replica pauses while more than `_HIGH_WATER` bytes wait for a slow client.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from inferd.gateway.upstream import Headers, UpstreamConnectError, UpstreamError

_HIGH_WATER = 1 << 20
_LOW_WATER = 1 << 18


class _Stale(Exception):
    """A reused keep-alive connection was closed by the replica before it
    answered anything: send the request again on a fresh connection."""


class _Response:
    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_error",
        "_paused",
        "_waiter",
        "complete",
        "headers",
        "headers_done",
        "keep_alive",
        "started",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.started = False  # any byte of the response arrived
        self.complete = False
        self.keep_alive = True
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- called by the connection -----------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.pause()
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    # -- used by the proxy -------------------------------------------------

    async def _wait_headers(self) -> None:
        while not self.headers_done:
            if self._error is not None:
                raise self._error
            self._waiter = self._conn.loop.create_future()
            await self._waiter

    async def next_chunk(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    self._conn.resume()
                return data
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = self._conn.loop.create_future()
            await self._waiter

    def close(self) -> None:
        self._conn.finish(self)

    def abort(self, reason: str) -> None:
        if self._conn.response is self:
            self._conn.abort(reason)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: ConnectionPool, key: tuple[str, int], loop: Any) -> None:
        self.pool = pool
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: _Response | None = None
        self.closed = False
        # Served a request before: a close before any answer means the
        # replica dropped an idle keep-alive connection (see _Stale).
        self.reused = False

    # -- asyncio.Protocol --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            # Bytes while idle: the replica is not speaking HTTP/1.1 as we do.
            self.close()
            return
        response.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(UpstreamError(f"invalid response from replica: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        response = self.response
        if response is not None and not response.complete:
            if response.started:
                response._fail(self._lost(False, exc))
            else:
                response._fail(_Stale() if self.reused else self._lost(True, exc))

    def _lost(self, before: bool, exc: Exception | None) -> UpstreamError:
        reason = f": {exc}" if exc else ""
        return UpstreamError(f"replica closed the connection{reason}", before_response=before)

    # -- httptools callbacks -----------------------------------------------

    # A response that was finished or aborted gets no more callbacks: its
    # connection is closed, so `self.response` is None only if the replica
    # sent bytes after the message we asked for.

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        response.status = self.parser.get_status_code()
        response.keep_alive = self.parser.should_keep_alive()
        response.headers_done = True
        response._wake()

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._push(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None:
            response.complete = True
            response._wake()

    # -- pool side ---------------------------------------------------------

    def start(self, head: bytes, body: bytes) -> _Response:
        response = _Response(self)
        self.response = response
        self.pool._busy_add(self)
        assert self.transport is not None
        # One write, one segment: writelines() may cost a syscall per part.
        self.transport.write(head + body if body else head)
        return response

    def finish(self, response: _Response) -> None:
        if response is not self.response:
            return
        self.response = None
        self.pool._busy_discard(self)
        if response.complete and response.keep_alive and not self.closed:
            self.reused = True
            self.pool._idle_push(self)
        else:
            self.close()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def abort(self, reason: str) -> None:
        """Close from our side; the exchange in progress fails with `reason`."""
        response = self.response
        if response is not None and not response.complete:
            response._fail(UpstreamError(reason, before_response=not response.started))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool._forget(self)
            if self.transport is not None:
                self.transport.close()


class ConnectionPool:
    """Keep-alive connections per replica address, most recently used first."""

    def __init__(self, connect_timeout: float = 2.0, max_idle_per_host: int = 256) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._busy: dict[tuple[str, int], set[_Connection]] = {}
        self._addresses: dict[str, tuple[tuple[str, int], bytes]] = {}

    def _address(self, base_url: str) -> tuple[tuple[str, int], bytes]:
        found = self._addresses.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise UpstreamConnectError(f"unsupported replica URL {base_url!r}")
            port = parts.port or 80
            found = ((parts.hostname, port), f"{parts.hostname}:{port}".encode("ascii"))
            if len(self._addresses) > 4096:
                self._addresses.clear()
            self._addresses[base_url] = found
        return found

    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> _Response:
        key, host = self._address(base_url)
        parts = [
            method.encode("ascii"), b" ", path.encode("ascii"), b" HTTP/1.1\r\nhost: ", host,
            b"\r\ncontent-length: ", str(len(body)).encode("ascii"), b"\r\n",
        ]  # fmt: skip
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        head = b"".join(parts)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, head, body)
            except _Stale:
                continue
        conn = await self._connect(key)
        try:
            return await self._exchange(conn, head, body)
        except _Stale:  # cannot happen on a fresh connection; keep the type honest
            raise UpstreamError("replica closed the connection", before_response=True) from None

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes) -> _Response:
        response = conn.start(head, body)
        try:
            await response._wait_headers()
        except BaseException:
            # Cancelled (the client left) or failed: this connection is done.
            conn.response = None
            conn.close()
            raise
        return response

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, key, loop), key[0], key[1]),
                self.connect_timeout,
            )
        except (TimeoutError, OSError) as exc:
            raise UpstreamConnectError(
                f"cannot connect to {key[0]}:{key[1]}: {type(exc).__name__} {exc}"
            ) from None
        return conn

    def _idle_push(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle_per_host:
            conn.close()
        else:
            idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._busy_discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _busy_add(self, conn: _Connection) -> None:
        busy = self._busy.get(conn.key)
        if busy is None:
            busy = self._busy[conn.key] = set()
        busy.add(conn)

    def _busy_discard(self, conn: _Connection) -> None:
        busy = self._busy.get(conn.key)
        if busy is not None:
            busy.discard(conn)
            if not busy:
                del self._busy[conn.key]

    def abort_host(self, base_url: str, reason: str) -> int:
        key, _ = self._address(base_url)
        busy = list(self._busy.pop(key, ()))
        for conn in busy:
            conn.abort(reason)
        for conn in list(self._idle.pop(key, ())):
            conn.close()
        return len(busy)

    async def aclose(self) -> None:
        for conns in [*self._idle.values(), *self._busy.values()]:
            for conn in list(conns):
                conn.close()
        self._idle.clear()
        self._busy.clear()
