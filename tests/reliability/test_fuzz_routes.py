"""No 500 for any input: every OpenAI route of a replica, on real engines
(vLLM tiny-chat for chat and completions, vLLM tiny-embed for embeddings,
score and rerank, diffusers tiny-sdxl for images), fuzzed directly and
through the gateway in front of the same replica.

Generated with Hypothesis from each route's own request model: vLLM's
pydantic classes for the routes vLLM's serving code answers (the gateway's
OpenAPI document only says "object" for them, so schemathesis would have
nothing to generate from), inferd's for chat and images. A generated body is
a good request with up to four of the model's fields (or an unknown one) set
to a value of the field's own JSON type or an edge value (empty string, list
and object, null, huge and negative numbers, unicode, wrong types), and up to
two of its fields dropped. Hand-picked rows add what generation reaches
rarely: 1 MB strings, bodies that are not objects, a required field missing,
each with the parameter the error must name.

Every answer: below 500; a 4xx is the one error shape, and names a `param`
where the row says which field is at fault (vLLM names one for most of its
refusals, not all, so a generated row is held to the shape only); after each
route's bodies the route still answers a good request.

Cost (CI, 2 cores): EXAMPLES bodies per route and target (IMAGE_EXAMPLES
for images), derandomized, with `max_tokens`, `n`, steps and image sizes
capped so that an accepted body costs about what a plain request does:
(5 x 20 + 8) x 2 targets = 216 generated requests and 170 hand-picked, on the
suite's shared replicas (one more gateway thread each).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferd.api.openai import ChatCompletionRequest, ImageGenerationRequest
from inferd.gateway.settings import GatewaySettings
from inferd.testing import ReplicaHandle
from tests.reliability.fault_support import GatewayInFront
from tests.reliability.limits_support import assert_error
from tests.support import needs

pytestmark = [pytest.mark.slow, pytest.mark.reliability(item=10)]

EXAMPLES = 20
IMAGE_EXAMPLES = 8  # an accepted image costs a second or more of the two cores
MEGABYTE = "x" * (1 << 20)
# What an accepted body may cost: tokens decoded, choices, denoising steps.
MAX_TOKENS, MAX_CHOICES, MAX_STEPS, MAX_SIDE = 8, 2, 1, 256
GENERATED: dict[str, int] = {}  # requests sent, by route and target


# -- the routes and their own request models ----------------------------------


def vllm_schema(module: str, name: str) -> Callable[[], dict[str, Any]]:
    def schema() -> dict[str, Any]:
        import importlib

        from pydantic import TypeAdapter

        return TypeAdapter(getattr(importlib.import_module(module), name)).json_schema()

    return schema


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    replica: str  # the shared replica fixture that serves it
    kind: str  # the gateway endpoint's kind
    model: str
    schema: Callable[[], dict[str, Any]]
    good: dict[str, Any]
    needs: tuple[str, ...] = field(default=("vllm",))
    examples: int = EXAMPLES


ROUTES = [
    Route("chat", "/openai/v1/chat/completions", "vllm_replica", "chat", "tiny-chat",
          ChatCompletionRequest.model_json_schema,
          {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    Route("completions", "/openai/v1/completions", "vllm_replica", "chat", "tiny-chat",
          vllm_schema("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
          {"prompt": "hi", "max_tokens": 4}),
    Route("embeddings", "/openai/v1/embeddings", "pooling_replica", "embedding", "tiny-embed",
          vllm_schema("vllm.entrypoints.pooling.embed.protocol", "EmbeddingRequest"),
          {"input": "hi"}),
    Route("score", "/v1/score", "pooling_replica", "embedding", "tiny-embed",
          vllm_schema("vllm.entrypoints.pooling.scoring.protocol", "ScoreRequest"),
          {"queries": "hi", "documents": ["a fox", "a dog"]}),
    Route("rerank", "/v1/rerank", "pooling_replica", "embedding", "tiny-embed",
          vllm_schema("vllm.entrypoints.pooling.scoring.protocol", "RerankRequest"),
          {"query": "hi", "documents": ["a fox", "a dog"]}),
    Route("images", "/v1/images/generations", "diffusers_replica", "image", "tiny-sdxl",
          ImageGenerationRequest.model_json_schema,
          {"prompt": "a fox", "size": "256x256", "num_inference_steps": 1}, ("diffusers",),
          examples=IMAGE_EXAMPLES),
]  # fmt: skip


def properties(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fields of a request model, across the members of a union (vLLM's
    embeddings and score requests are unions of shapes)."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return resolve(defs[ref.rsplit("/", 1)[-1]]) if ref else node

    found: dict[str, dict[str, Any]] = {}
    pending = [schema]
    while pending:
        node = resolve(pending.pop())
        for name, prop in node.get("properties", {}).items():
            found.setdefault(name, resolve(prop))
        pending += node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", [])
    return found


def json_types(prop: dict[str, Any]) -> set[str]:
    kinds = prop.get("type")
    found = set(kinds if isinstance(kinds, list) else [kinds] if kinds else [])
    for member in prop.get("anyOf", []) + prop.get("oneOf", []):
        found |= json_types(member)
    return found


# -- values ------------------------------------------------------------------

SMALL_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
EDGES = st.sampled_from([
    "", [], {}, None, 0, -1, 2**63, -(2**63), 2**64, 10**30, 1e308, -1e-308, 0.5, True, False,
    "ünïcödé ✓ 🦊 \u202e", "\u0000", "x" * 10_000, [None], [""], [[]], [-1], {"": None},
])  # fmt: skip
TYPED = {
    "integer": st.integers(-(2**65), 2**65) | st.integers(-2, 70),
    "number": st.floats(allow_nan=False, allow_infinity=False) | st.floats(-2, 100),
    "string": st.text(max_size=40),
    "boolean": st.booleans(),
    "array": st.lists(SMALL_JSON, max_size=4),
    "object": st.dictionaries(st.text(max_size=8), SMALL_JSON, max_size=3),
    "null": st.none(),
}


def values_for(prop: dict[str, Any]) -> st.SearchStrategy[Any]:
    choices = [EDGES, *(TYPED[t] for t in sorted(json_types(prop)) if t in TYPED)]
    if "enum" in prop:
        choices.append(st.sampled_from(prop["enum"]))
    return st.one_of(choices)


def bodies(route: Route) -> st.SearchStrategy[dict[str, Any]]:
    props = properties(route.schema())
    names = [*sorted(props), "inferd_unknown_field"]
    changed = st.lists(st.sampled_from(names), max_size=4, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: values_for(props.get(k, {})) for k in keys})
    )
    dropped = st.lists(st.sampled_from(sorted(route.good)), max_size=2, unique=True)
    return st.tuples(changed, dropped).map(
        lambda pair: bounded(
            route, {**{k: v for k, v in route.good.items() if k not in pair[1]}, **pair[0]}
        )
    )


def _small_int(value: Any, cap: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and cap < value <= 10**6


def bounded(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """Caps what an accepted body may cost; a value far out of range (a
    negative, a huge number, a wrong type) is kept, since it must be refused."""
    caps = {"max_tokens": MAX_TOKENS, "max_completion_tokens": MAX_TOKENS,
            "min_tokens": MAX_TOKENS, "n": MAX_CHOICES, "best_of": MAX_CHOICES,
            "num_inference_steps": MAX_STEPS, "top_n": 2}  # fmt: skip
    body = {k: (caps[k] if k in caps and _small_int(v, caps[k]) else v) for k, v in body.items()}
    decodes = "max_tokens" in route.good
    if decodes and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS  # unbounded decoding is not a bad input, only slow
    size = body.get("size")
    if isinstance(size, str) and "x" in size:
        sides = size.split("x", 1)
        if all(s.isdigit() and MAX_SIDE < int(s) <= 10_000 for s in sides):
            body["size"] = f"{MAX_SIDE}x{MAX_SIDE}"
    return body


# -- targets -----------------------------------------------------------------


@dataclass
class Target:
    url: str
    headers: dict[str, str]

    def post(self, route: Route, body: Any, **extra: str) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {**self.headers, **extra, "Content-Type": "application/json"}
        return httpx.post(self.url + route.path, content=content, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def gateways() -> Iterator[dict[str, GatewayInFront]]:
    started: dict[str, GatewayInFront] = {}
    yield started
    for gateway in started.values():
        gateway.stop()


def target(request: pytest.FixtureRequest, route: Route, via: str) -> Target:
    replica: ReplicaHandle = request.getfixturevalue(route.replica)
    if via == "replica":
        return Target(replica.url, {})
    gateways: dict[str, GatewayInFront] = request.getfixturevalue("gateways")
    if route.replica not in gateways:
        gateways[route.replica] = GatewayInFront(
            route.kind, route.model, [replica], GatewaySettings()
        )
    gateway = gateways[route.replica]
    return Target(gateway.url, gateway.headers)


def check(response: httpx.Response, param: str | None = None) -> None:
    """Below 500; a 4xx in the one error shape, naming `param` if given."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = assert_error(response, response.status_code)
        assert error["param"] is None or isinstance(error["param"], str), error
        if param is not None:
            assert error["param"] == param, error


def still_serves(route: Route, to: Target) -> None:
    response = to.post(route, route.good)
    assert response.status_code == 200, response.text[:500]


def routes_with_marks() -> list[Any]:
    return [pytest.param(r, marks=needs(*r.needs), id=r.name) for r in ROUTES]


# -- the tests ---------------------------------------------------------------


@pytest.mark.timeout(900)
@pytest.mark.parametrize("via", ["replica", "gateway"])
@pytest.mark.parametrize("route", routes_with_marks())
def test_generated_bodies_never_get_a_server_error(
    route: Route, via: str, request: pytest.FixtureRequest
) -> None:
    to = target(request, route, via)
    sent = f"{route.name} via {via}"

    @settings(
        max_examples=route.examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=bodies(route))
    def one(body: dict[str, Any]) -> None:
        GENERATED[sent] = GENERATED.get(sent, 0) + 1
        check(to.post(route, body))

    one()
    still_serves(route, to)
    print(f"\n{sent}: {GENERATED[sent]} generated requests")


HAND_PICKED: dict[str, list[tuple[Any, str | None]]] = {
    # (body, the parameter the error must name; None: any 4xx or a 200)
    "completions": [
        ({"model": "tiny-chat"}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": []}, None),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 2**64}, "max_tokens"),
        ({"prompt": "hi", "temperature": "hot"}, "temperature"),
        ({"prompt": "hi", "max_tokens": 2, "stream": True, "prompt_logprobs": "x"}, None),
        ({"prompt": "hi", "max_tokens": 2, "stream_options": "x"}, "stream_options"),
        (
            {"prompt": "hi", "max_tokens": 2, "response_format": {"type": "json_schema"}},
            "response_format",
        ),
        ({"prompt": MEGABYTE, "max_tokens": 2}, None),
    ],
    "chat": [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, None),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "inferd_unknown": 1}, None),  # ignored
        ({"messages": [{"role": "user", "content": MEGABYTE}], "max_tokens": 2}, None),
        ({"messages": [{"role": "user", "content": "ünï ✓ 🦊"}], "max_tokens": 2}, None),
    ],
    "embeddings": [
        ({"input": []}, "input"),
        ({"input": ""}, None),
        ({"input": None}, None),
        ({"input": [-1, 2**40]}, None),
        ({"input": "hi", "dimensions": -1}, None),
        ({"input": MEGABYTE}, None),
    ],
    "score": [
        ({}, None),
        ({"queries": "", "documents": []}, None),
        ({"queries": None, "documents": None}, None),
        ({"queries": "hi", "documents": [MEGABYTE]}, None),
    ],
    "rerank": [
        ({"query": "hi"}, "documents"),
        ({"query": "", "documents": []}, None),
        ({"query": "hi", "documents": ["a"], "top_n": -1}, None),
        ({"query": MEGABYTE, "documents": ["a"]}, None),
    ],
    "images": [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "size": "0x0"}, "size"),
        ({"prompt": "x", "size": "999999x999999"}, "size"),
        ({"prompt": "x", "num_inference_steps": 10**9}, "num_inference_steps"),
        ({"prompt": "x", "guidance_scale": "high"}, "guidance_scale"),
        ({"prompt": MEGABYTE}, None),
    ],
}
# Any route: bodies that are not a JSON object at all.
NOT_OBJECTS: list[Any] = [[], "hi", None, 1, b"{not json", b"", b"\xff\xfe"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("via", ["replica", "gateway"])
@pytest.mark.parametrize("route", routes_with_marks())
def test_hand_picked_edges_are_refused_naming_the_parameter(
    route: Route, via: str, request: pytest.FixtureRequest
) -> None:
    to = target(request, route, via)
    rows = [*HAND_PICKED[route.name], *((body, None) for body in NOT_OBJECTS)]
    for body, param in rows:
        response = to.post(route, bounded(route, body) if isinstance(body, dict) else body)
        shown = str(body)[:200]
        check(response, param)
        if param is not None:
            assert response.status_code == 400, (shown, response.text[:300])
    still_serves(route, to)


@needs("vllm")
def test_an_adapter_the_replica_cannot_load_is_a_4xx(request: pytest.FixtureRequest) -> None:
    """The adapter source is the gateway's to set (it strips a client's);
    one the replica cannot load is refused, on both text routes."""
    for route in ROUTES[:2]:
        to = target(request, route, "replica")
        for source in ("/nonexistent/adapter", "%00", "%C3%BCn%C3%AF"):
            body = {**route.good, "model": "some-adapter"}
            check(to.post(route, body, **{"x-inferd-adapter-source": source}))
        still_serves(route, to)
