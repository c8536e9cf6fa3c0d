"""The gateway's HTTP client to replicas: the narrow interface the proxy uses,
its errors, and an httpx-backed implementation.

The default implementation is the lean pool in `pool.py` (measured faster,
see benchmarks/gateway_overhead.py); `HttpxUpstream` is the reference it was
measured against and the fallback where httptools is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import httpx

Headers = Sequence[tuple[bytes, bytes]]


class UpstreamError(Exception):
    """The exchange with the replica failed after a connection was made.

    `before_response` is True when nothing of the response (not even the
    status line) had arrived.
    """

    def __init__(self, message: str, *, before_response: bool = False) -> None:
        super().__init__(message)
        self.before_response = before_response


class UpstreamConnectError(UpstreamError):
    """No connection could be made: the replica is unreachable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, before_response=True)


class UpstreamResponse(Protocol):
    status: int
    # Lower-case names, as received.
    headers: list[tuple[bytes, bytes]]
    # The whole body has arrived (what `next_chunk` has not returned yet is
    # buffered).
    complete: bool

    async def next_chunk(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some
        if none did); b"" once the body is complete. Raises UpstreamError."""
        ...

    def close(self) -> None:
        """Done with the response: a complete one frees its connection for
        reuse; an incomplete one closes the connection, which tells the
        replica the client is gone (it aborts the work)."""
        ...


class Upstream(Protocol):
    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> UpstreamResponse:
        """Send a request; return once the status line and headers are in.
        Raises UpstreamConnectError or UpstreamError."""
        ...

    def abort_host(self, base_url: str, reason: str) -> int:
        """Fail every exchange in progress with this replica (its reads raise
        UpstreamError) and close its connections; returns how many failed."""
        ...

    async def aclose(self) -> None: ...


class _HttpxResponse:
    def __init__(self, owner: HttpxUpstream, base_url: str, response: httpx.Response) -> None:
        self._owner = owner
        self._base_url = base_url
        self._response = response
        self.status = response.status_code
        self.headers = [(k.lower(), v) for k, v in response.headers.raw]
        self.complete = False
        self._chunks = response.aiter_raw()
        self._aborted: str | None = None

    async def next_chunk(self) -> bytes:
        if self._aborted is not None:
            raise UpstreamError(self._aborted)
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            self.complete = True
            return b""
        except httpx.HTTPError as exc:
            raise UpstreamError(self._aborted or f"{type(exc).__name__}: {exc}") from None

    def abort(self, reason: str) -> None:
        self._aborted = reason
        self.close()

    def close(self) -> None:
        self._owner._active.get(self._base_url, set()).discard(self)
        if not self._response.is_closed:
            task = asyncio.ensure_future(self._response.aclose())
            self._owner._closing.add(task)
            task.add_done_callback(self._owner._closing.discard)


class HttpxUpstream:
    def __init__(self, client: httpx.AsyncClient | None = None, connect_timeout: float = 2.0):
        self._owned = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._active: dict[str, set[_HttpxResponse]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> UpstreamResponse:
        request = self._client.build_request(
            method, base_url + path, headers=list(headers), content=body
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.ConnectError as exc:
            raise UpstreamConnectError(f"connect failed: {exc}") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}", before_response=True) from None
        wrapped = _HttpxResponse(self, base_url, response)
        self._active.setdefault(base_url, set()).add(wrapped)
        return wrapped

    def abort_host(self, base_url: str, reason: str) -> int:
        active = self._active.pop(base_url, set())
        for response in list(active):
            response.abort(reason)
        return len(active)

    async def aclose(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._owned:
            await self._client.aclose()
