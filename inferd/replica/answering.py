"""The replica's bookkeeping for one request, the same on every OpenAI route.

A request is admitted first (a draining or loading replica refuses with 503,
which the gateway retries elsewhere). It holds its in-flight slot until its
answer is whole or, for a stream, until the stream has ended, and it is
reported once, then: route, status, latency, time to first output, tokens and
adapter. An engine's refusal of the request (vLLM's `VLLMValidationError`, a
pydantic `ValidationError`, ...) that escapes a handler becomes the 400 it
stands for here, on every route (`inferd.engines.client_errors`): a malformed
request is never a 500. After a stream's first byte an error can only be told
in band, as an SSE `error` event, and the stream then ends cleanly rather than
leaving the client waiting on a silent socket.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

from starlette.requests import Request
from starlette.responses import StreamingResponse

from inferd.api.openai import sse_error
from inferd.api.replica import BATCH_REQUEST_HEADER
from inferd.engines.client_errors import client_error
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState
from inferd.tracing import (
    CURRENT_REQUEST_ID,
    CURRENT_TRACEPARENT,
    end_span,
    traceparent_of,
    tracer,
)

logger = logging.getLogger(__name__)


class Answering:
    """Use as `with Answering(state, metrics, route) as answer:` around the
    whole handler; set `answer.status` before returning a whole answer, or
    return `answer.stream(...)`, which keeps the request open until the
    stream ends."""

    def __init__(
        self,
        state: ReplicaState,
        metrics: ReplicaMetrics,
        route: str,
        request: Request | None = None,
    ) -> None:
        self._in_flight = state.admit()
        self._metrics = metrics
        self._route = route
        self._started = time.perf_counter()
        self._first_seen = False
        self._streaming = False
        self.status = 500
        self.adapter: str | None = None
        self._tokens: tuple[int, int] | None = None
        # The request id (set by the gateway) names this request's log
        # lines; its span (when traced) is the parent of the engine's.
        self.request_id = None if request is None else request.headers.get("x-request-id")
        self._batch = request is not None and BATCH_REQUEST_HEADER in request.headers
        self._log_token = CURRENT_REQUEST_ID.set(self.request_id)
        self._span = None
        self.trace_headers: dict[str, str] | None = None
        if request is not None:
            self._span = tracer().start(
                f"replica {route}", request.headers, {"inferd.route": route}, root=False
            )
        if self._span is not None and request is not None:
            parent = traceparent_of(self._span)
            if parent is not None:
                self.trace_headers = {"traceparent": parent.decode()}
                _replace_header(request, b"traceparent", parent)
        self._trace_token = CURRENT_TRACEPARENT.set(
            None if self.trace_headers is None else self.trace_headers["traceparent"]
        )

    def __enter__(self) -> Answering:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        refusal = None if exc is None else client_error(exc)
        if refusal is not None:
            self.status = refusal.status
        if not self._streaming:
            self._end()
        if refusal is not None and refusal is not exc:
            logger.info("%s: the engine refused the request: %r", self._route, exc)
            raise refusal from None

    def first_output(self) -> None:
        """Time to first output, observed once per request."""
        if not self._first_seen:
            self._first_seen = True
            self._metrics.ttft.observe(time.perf_counter() - self._started)

    def count(self, prompt_tokens: int, completion_tokens: int) -> None:
        self._tokens = (prompt_tokens, completion_tokens)
        self._metrics.count(prompt_tokens, completion_tokens, self.adapter, self._batch)

    def stream(
        self,
        events: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        headers: dict[str, str] | None = None,
    ) -> StreamingResponse:
        """The answer as server-sent `events`; `close` runs once they end,
        however they end (to free the engine's streams and count tokens)."""
        self._streaming = True
        self.status = 200
        return StreamingResponse(
            self._relay(events, close),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **(headers or {})},
        )

    async def _relay(
        self, events: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]
    ) -> AsyncIterator[bytes]:
        try:
            async for event in events:
                self.first_output()
                yield event
        except Exception as exc:
            refusal = client_error(exc)
            if refusal is not None:
                self.status = refusal.status
                yield sse_error(refusal.message, refusal.type, refusal.code)
            else:
                logger.exception("%s stream failed", self._route)
                self.status = 500
                yield sse_error(
                    "The engine failed while generating.", "server_error", "engine_error"
                )
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            try:
                await close()
            finally:
                self._end()

    def _end(self) -> None:
        self._in_flight.release()
        seconds = time.perf_counter() - self._started
        self._metrics.answered(self._route, self.status, seconds, self.adapter, self._batch)
        logger.info("%s %d %.3fs", self._route, self.status, seconds)
        if self._span is not None:
            prompt, completion = self._tokens or (None, None)
            end_span(
                self._span,
                self.status,
                {
                    "inferd.request_id": self.request_id,
                    "inferd.adapter": self.adapter,
                    "gen_ai.usage.input_tokens": prompt,
                    "gen_ai.usage.output_tokens": completion,
                },
            )
        with contextlib.suppress(ValueError):  # ended in another context than it began
            CURRENT_REQUEST_ID.reset(self._log_token)
        with contextlib.suppress(ValueError):
            CURRENT_TRACEPARENT.reset(self._trace_token)


def _replace_header(request: Request, name: bytes, value: bytes) -> None:
    """Set a request header in place (vLLM's serving code reads the trace
    context from the request it is given)."""
    headers = [(k, v) for k, v in request.scope["headers"] if k != name]
    headers.append((name, value))
    request.scope["headers"] = headers
    request.__dict__.pop("_headers", None)  # Starlette caches the parsed headers
