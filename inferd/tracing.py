"""OpenTelemetry traces of requests, off unless an OTLP endpoint is given.

The gateway starts a span per request (the client's W3C `traceparent` as
its parent, when sent) and passes its own context to the replica in the
`traceparent` header; the replica's span is its child and the parent of
vLLM's engine spans. Spans leave by OTLP (HTTP/protobuf or gRPC) through a
batch processor, so a request never waits on the collector.

Off (no endpoint), `Tracer.start` returns None and callers skip every
tracing step: no span object, no context, no header is made.

The request id lives here too: `x-request-id` from the client (if it is a
sane token) or a new one, returned on every answer, forwarded to the
replica, logged by both and set on both spans.
"""

from __future__ import annotations

import contextvars
import logging
import os
import random
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from opentelemetry.trace import Span

OtlpProtocol = Literal["http/protobuf", "grpc"]
TRACEPARENT = "traceparent"
REQUEST_ID = "x-request-id"
# A client's own id is kept when it is a plain token (what the access log
# and a log search can carry safely); anything else gets a fresh one.
_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


def request_id_from(value: bytes | None) -> bytes:
    """The client's `x-request-id` when it is a plain token, else a new one."""
    if value is not None and _SANE_REQUEST_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex.encode()


@dataclass(frozen=True)
class TracingSettings:
    """Where spans go and how many requests are traced."""

    otlp_endpoint: str | None = None
    protocol: OtlpProtocol = "http/protobuf"
    # Share of new traces sampled; a request whose client sent a sampled
    # traceparent is always traced (parent-based).
    sample_ratio: float = 1.0

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint)

    def traces_url(self) -> str | None:
        """The exporter's address: for HTTP, `/v1/traces` is added when the
        operator gave the collector's base URL (as OTLP's own variable does)."""
        url = self.otlp_endpoint
        if not url or self.protocol != "http/protobuf":
            return url
        return url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"


NO_TRACING = TracingSettings()


class Tracer:
    """One process's tracer (`service_name`: inferd-gateway, inferd-replica)."""

    def __init__(self, settings: TracingSettings, service_name: str, exporter: Any = None) -> None:
        """`exporter`: where spans go instead of OTLP, synchronously (tests)."""
        self.settings = settings
        self._tracer: Any = None
        self._provider: Any = None
        if settings.enabled:
            self._tracer, self._provider = _build(settings, service_name, exporter)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start(
        self,
        name: str,
        headers: Iterable[tuple[bytes, bytes]] | Mapping[str, str],
        attributes: Mapping[str, Any] | None = None,
        *,
        root: bool = True,
    ) -> Span | None:
        """A server span for one request, child of the `traceparent` in
        `headers` if any. None when tracing is off, when a new trace is not
        sampled (decided here, before anything is made: an unsampled request
        costs a random number), or when `root` is False and no parent came
        (a replica traces only as a part of the gateway's trace)."""
        if self._tracer is None:
            return None
        carrier = _carrier(headers)
        if not carrier and (not root or random.random() >= self.settings.sample_ratio):
            return None
        from opentelemetry.trace import SpanKind

        context = _PROPAGATOR.extract(carrier) if carrier else None
        span: Span = self._tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes=dict(attributes or {})
        )
        return span

    def steps(
        self, name: str, traceparent: str | None, attributes: Mapping[str, Any] | None = None
    ) -> StepSpans | None:
        """Spans of one engine call and of each of its steps, under the
        request span that `traceparent` names (the replica's). None when
        tracing is off or no request span is there to hang them on."""
        if self._tracer is None or not traceparent:
            return None
        return StepSpans(self._tracer, name, traceparent, attributes)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


class StepSpans:
    """An engine call's span with one child per step, each timed from the
    previous step's end (the first from the call's start). Made on the
    engine's worker thread; the times are passed, so nothing depends on
    which thread's context is current."""

    def __init__(
        self, otel_tracer: Any, name: str, traceparent: str, attributes: Mapping[str, Any] | None
    ) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        self._tracer = otel_tracer
        self._name = name
        self._last_ns = time.time_ns()
        parent = _PROPAGATOR.extract({TRACEPARENT: traceparent})
        self._span = otel_tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=dict(attributes or {}),
            start_time=self._last_ns,
        )
        self._context = set_span_in_context(self._span)
        self.count = 0

    def step(self) -> None:
        now = time.time_ns()
        span = self._tracer.start_span(
            f"{self._name} step",
            context=self._context,
            attributes={"inferd.step": self.count},
            start_time=self._last_ns,
        )
        span.end(end_time=now)
        self._last_ns = now
        self.count += 1

    def end(self, error: BaseException | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("inferd.steps", self.count)
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._span.end()


def traceparent_of(span: Span) -> bytes | None:
    """The W3C `traceparent` header value naming `span` as the parent."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    flags = int(context.trace_flags)
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}".encode()


def end_span(span: Span, status: int, attributes: Mapping[str, Any] | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("http.response.status_code", status)
    for key, value in (attributes or {}).items():
        if value is not None:
            span.set_attribute(key, value)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
    span.end()


class _Propagator:
    """OpenTelemetry's W3C propagator, made once (on first traced request)."""

    def __init__(self) -> None:
        self._propagator: Any = None

    def extract(self, carrier: Mapping[str, str]) -> Any:
        if self._propagator is None:
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )

            self._propagator = TraceContextTextMapPropagator()
        return self._propagator.extract(carrier)


_PROPAGATOR = _Propagator()


def _carrier(headers: Iterable[tuple[bytes, bytes]] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(headers, Mapping):
        value = headers.get(TRACEPARENT)
        return {TRACEPARENT: value} if value else {}
    for name, value in headers:
        if name == b"traceparent":
            return {TRACEPARENT: value.decode("latin-1")}
    return {}


def _build(settings: TracingSettings, service_name: str, given: Any = None) -> tuple[Any, Any]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    resource = Resource.create({"service.name": service_name, "process.pid": os.getpid()})
    if given is not None:
        provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
        provider.add_span_processor(SimpleSpanProcessor(given))
        return provider.get_tracer("inferd"), provider
    exporter: Any
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=settings.traces_url())
    # New traces are sampled in `Tracer.start` (at the ratio); a parent's
    # decision is followed.
    provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
    # Short delay: a trace shows up within a second, and a process that
    # ends flushes what it holds (shutdown).
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider.get_tracer("inferd"), provider


# The process's tracer: off until `configure` is called (by `inferd serve`
# and by `inferd replica` from their settings).
_TRACER = Tracer(NO_TRACING, "inferd")


def configure(settings: TracingSettings, service_name: str, exporter: Any = None) -> Tracer:
    global _TRACER
    _TRACER.shutdown()
    _TRACER = Tracer(settings, service_name, exporter)
    return _TRACER


def tracer() -> Tracer:
    return _TRACER


# The replica's span of the request it is answering (its `traceparent`), for
# engines that make spans of their own (diffusers' steps); None when untraced.
CURRENT_TRACEPARENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "inferd_traceparent", default=None
)

# The request a replica is answering, for its log lines (`RequestIdFormatter`).
CURRENT_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "inferd_request_id", default=None
)


class RequestIdFormatter(logging.Formatter):
    """Adds ` request_id=...` to lines logged while a request is answered."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = CURRENT_REQUEST_ID.get()
        return text if request_id is None else f"{text} request_id={request_id}"
