"""The management API's request ids and spans (`inferd.server.request_spans`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from inferd import tracing
from inferd.server.request_spans import RequestSpans


async def endpoints(request: Request) -> Response:
    return JSONResponse({"items": []}, status_code=200 if request.method == "GET" else 404)


def client() -> TestClient:
    inner = Starlette(routes=[Route("/endpoints", endpoints, methods=["GET", "POST"])])
    app = Starlette(routes=[Mount("/inference", app=inner, middleware=[Middleware(RequestSpans)])])
    return TestClient(app)


@pytest.fixture
def traced() -> Iterator[Any]:
    exporter = InMemorySpanExporter()
    tracing.configure(tracing.TracingSettings("http://unused:4318"), "inferd-gateway", exporter)
    try:
        yield exporter
    finally:
        tracing.configure(tracing.NO_TRACING, "inferd")


def test_every_answer_has_a_request_id_with_tracing_off() -> None:
    with client() as http:
        made = http.get("/inference/endpoints")
        assert len(made.headers["x-request-id"]) == 32
        kept = http.post("/inference/endpoints", headers={"x-request-id": "ops-42"})
        assert kept.status_code == 404 and kept.headers["x-request-id"] == "ops-42"


def test_each_call_is_a_span_under_the_callers_trace(traced: Any) -> None:
    parent = "0af7651916cd43dd8448eb211c80319c"
    with client() as http:
        answer = http.post(
            "/inference/endpoints",
            headers={"traceparent": f"00-{parent}-b7ad6b7169203331-01", "x-request-id": "a-1"},
        )
    assert answer.status_code == 404
    (span,) = traced.get_finished_spans()
    assert span.name == "POST /inference"
    assert format(span.context.trace_id, "032x") == parent
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    attributes = dict(span.attributes or {})
    assert attributes["http.response.status_code"] == 404
    assert attributes["url.path"] == "/inference/endpoints"
    assert attributes["inferd.request_id"] == "a-1"
