"""Observe it for real: one `inferd serve` with a tiny-chat vLLM endpoint,
traced to an OTLP/HTTP receiver in this test (protobuf decoded with
opentelemetry-proto) and scraped by a real Prometheus that loads the shipped
rules. One server and one replica serve both tests."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferd.testing import ServeHandle, free_port
from tests.support import needs

pytestmark = [needs("vllm", "prometheus"), pytest.mark.slow]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    attributes: dict[str, Any]
    events: list[str]


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf)."""

    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> Starlette:
        async def traces(request: Request) -> Response:
            message = ExportTraceServiceRequest()
            message.ParseFromString(await request.body())
            found = []
            for resource_spans in message.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append(
                            Span(
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                span.name,
                                str(resource.get("service.name", "")),
                                {a.key: _value(a.value) for a in span.attributes},
                                [e.name for e in span.events],
                            )
                        )
            with self.lock:
                self.spans.extend(found)
            return Response(status_code=200, media_type="application/x-protobuf")

        return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout}s")


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    receiver = Receiver()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(receiver.app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "the OTLP receiver started")
    yield receiver, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@dataclass
class Observed:
    serve: ServeHandle
    endpoint: dict[str, Any]
    receiver: Receiver
    # The first request, held while the endpoint woke from zero.
    held_trace_id: str


@pytest.fixture(scope="module")
def observed(
    tmp_path_factory: pytest.TempPathFactory, receiver: tuple[Receiver, str]
) -> Iterator[Observed]:
    spans, url = receiver
    settings = {
        "health_period_seconds": "0.5",
        "reconcile_period_seconds": "0.2",
        "replica_args": "--cpu-kv-cache-gib 1",
        # vLLM's start on a busy 2-core machine can pass the default hold.
        "gateway_hold_timeout_seconds": "600",
        "otlp_endpoint": url,
        "trace_sample_ratio": "1.0",
    }
    serve = ServeHandle(tmp_path_factory.mktemp("observe"), settings=settings)
    serve.start()
    try:
        endpoint = serve.create_endpoint(
            name="observed",
            modelName="tiny-chat",
            minReplicas=0,
            maxReplicas=1,
            scaleToZeroRetentionPeriodSeconds=3600,
        )
        trace_id = secrets.token_hex(16)
        # Held at zero while the replica starts: the trace shows the hold.
        answer = chat(endpoint, traceparent=f"00-{trace_id}-{secrets.token_hex(8)}-01")
        assert answer.status_code == 200, answer.text
        yield Observed(serve, endpoint, spans, trace_id)
    finally:
        serve.cleanup()
        assert serve.launched_pids() == []


def chat(
    endpoint: dict[str, Any], *, traceparent: str | None = None, path: str = "chat/completions"
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {endpoint['accessToken']}"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    if path == "chat/completions":
        body: dict[str, Any] = {
            "model": "tiny-chat",
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 8,
        }
    else:
        body = {"model": "tiny-chat", "prompt": "Tell me about the sea.", "max_tokens": 8}
    return httpx.post(
        f"{endpoint['url']}/openai/v1/{path}", json=body, headers=headers, timeout=900
    )


def test_one_trace_per_request_from_gateway_to_vllm(observed: Observed) -> None:
    receiver = observed.receiver
    # The held first request: gateway span (child of the client's), replica
    # span under it, vLLM's engine span under that.
    held = wait_for(
        lambda: _complete(receiver.of_trace(observed.held_trace_id)),
        60,
        "the held request's gateway, replica and vLLM spans",
    )
    gateway, replica, engine = held
    assert gateway.attributes["inferd.hold_seconds"] > 0
    assert "forwarded" in gateway.events

    for path in ("chat/completions", "completions"):
        trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
        answer = chat(observed.endpoint, traceparent=f"00-{trace_id}-{client_span}-01", path=path)
        assert answer.status_code == 200, answer.text
        gateway, replica, engine = wait_for(
            lambda trace_id=trace_id: _complete(receiver.of_trace(trace_id)),
            60,
            f"{path}: the gateway, replica and vLLM spans",
        )
        assert gateway.parent_id == client_span
        assert replica.parent_id == gateway.span_id
        assert engine.parent_id == replica.span_id
        route = "chat" if path == "chat/completions" else "completions"
        request_id = answer.headers["x-request-id"]
        assert gateway.attributes["inferd.endpoint"] == observed.endpoint["id"]
        assert gateway.attributes["inferd.route"] == route
        assert gateway.attributes["inferd.model"] == "tiny-chat"
        assert gateway.attributes["inferd.replica"].startswith("r-")
        assert gateway.attributes["inferd.routing.policy"]
        assert gateway.attributes["http.response.status_code"] == 200
        assert gateway.attributes["inferd.request_id"] == request_id
        assert replica.attributes["inferd.request_id"] == request_id
        usage = answer.json()["usage"]
        assert replica.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert replica.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert (gateway.service, replica.service) == ("inferd-gateway", "inferd-replica")


def _complete(spans: list[Span]) -> tuple[Span, Span, Span] | None:
    gateway = [s for s in spans if s.service == "inferd-gateway"]
    replica = [s for s in spans if s.service == "inferd-replica"]
    engine = [s for s in spans if s.name == "llm_request"]
    if gateway and replica and engine:
        return gateway[0], replica[0], engine[0]
    return None


def test_prometheus_finds_every_series_the_rules_and_dashboard_use(
    observed: Observed, tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus is not None
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    for name in ("rules.yml", "alerts.yml"):
        rules = yaml.safe_load((DEPLOY / "prometheus" / name).read_text())
        for group in rules["groups"]:
            group["interval"] = "1s"  # evaluated within the test's time
        (rules_dir / name).write_text(yaml.safe_dump(rules))
    target = observed.serve.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_dir / "*.yml")],
        "scrape_configs": [{"job_name": "inferd", "static_configs": [{"targets": [target]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        wait_for(lambda: _ready(port), 60, "Prometheus ready")
        # Load while Prometheus scrapes: a few seconds of chats.
        for _ in range(12):
            assert chat(observed.endpoint).status_code == 200
            time.sleep(0.3)
        up = wait_for(lambda: _query(api, 'up{job="inferd"} == 1'), 30, "the target scraped")
        assert up
        failures = []
        for expression in _expressions():
            if not _query_until(api, expression, 30):
                failures.append(expression)
        names = sorted({n for e in _alert_expressions() for n in re.findall(r"inferd_\w+", e)})
        for name in names:
            if not _query_until(api, f'{{__name__=~"{name}(_total)?"}}', 10):
                failures.append(f"series {name}")
        assert failures == [], f"empty in Prometheus: {failures}"
        # The healthy endpoint fires none of the shipped alerts.
        firing = _query(api, 'ALERTS{alertstate="firing"}')
        assert firing == [], firing
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _expressions() -> list[str]:
    """Every recording rule and dashboard panel expression (for all endpoints)."""
    import json

    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    recorded = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    recorded += [r["record"] for g in rules["groups"] for r in g["rules"]]
    panels = json.loads((DEPLOY / "grafana" / "inferd.json").read_text())["panels"]
    shown = [t["expr"].replace("$endpoint", ".+") for p in panels for t in p["targets"]]
    return recorded + shown


def _alert_expressions() -> list[str]:
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [r["expr"] for g in alerts["groups"] for r in g["rules"]]


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _query(api: str, expression: str) -> list[Any]:
    answer = httpx.get(f"{api}/query", params={"query": expression}, timeout=10)
    answer.raise_for_status()
    result: list[Any] = answer.json()["data"]["result"]
    return result


def _query_until(api: str, expression: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _query(api, expression):
            return True
        time.sleep(1)
    return False
