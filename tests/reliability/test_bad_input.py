"""Item 8: bad input, one row per test, on every surface a client reaches:
through the gateway (an endpoint's URL) on a chat and an image endpoint, and
on the management API. Every answer has the documented status (400 for bad
input, never 422; 404; 413) in the one error shape with a small body, and a
body over the limit is refused from its `Content-Length`, before it is sent.

A real `inferd serve` with fake-engine replicas (context of 512 tokens):
this is about the HTTP surfaces. The engine's own limits on the real vLLM
engine, through the gateway, are the rows at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from inferd.api.openai import MAX_CHAT_N, MAX_MESSAGE_CHARS, MAX_MESSAGES, MAX_PROMPT_CHARS
from inferd.testing import ReplicaHandle, ServeHandle
from tests.reliability.fault_support import CHAT, IMAGES, Endpoint
from tests.reliability.limits_support import assert_error, headers_only, list_endpoints, raw_error

if TYPE_CHECKING:
    from tests.reliability.conftest import GatewayInFront

pytestmark = pytest.mark.reliability(item=8)

CONTEXT = 512
MAX_BODY = 256 * 1024
HUGE = 50_000_000  # a Content-Length no body will follow
HI = [{"role": "user", "content": "hi"}]
ADMIN = "infd_admin_test_key_0123456789abcdef"
LONG_PART = "a" * (MAX_MESSAGE_CHARS + 1)
LONG = "x" * 50_000  # an echo of this would not be a small body


class Surfaces:
    def __init__(self, serve: ServeHandle, chat: Endpoint, image: Endpoint) -> None:
        self.serve, self.chat, self.image = serve, chat, image

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Surfaces]:
    serve = ServeHandle(
        tmp_path_factory.mktemp("bad-input"),
        admin_key=ADMIN,
        settings={
            "replica_args": f"--engine fake --engine-arg token_delay_s=0 "
            f"--engine-arg context_length={CONTEXT}",
            "health_period_seconds": "0.5",
            "reconcile_period_seconds": "0.2",
            "max_body_bytes": str(MAX_BODY),
        },
    ).start()
    try:
        chat = Endpoint.create(serve, name="chat", modelName="tiny-chat", minReplicas=1)
        image = Endpoint.create(serve, name="image", modelName="tiny-sdxl", minReplicas=1)
        for endpoint in (chat, image):
            serve.wait_record(endpoint.id, lambda r: r["status"] == "running", timeout=60)
        yield Surfaces(serve, chat, image)
    finally:
        serve.cleanup()


def post_raw(url: str, headers: dict[str, str], body: bytes | dict[str, Any]) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(url, json=body, headers=headers, timeout=30)
    return httpx.post(
        url, content=body, headers={**headers, "Content-Type": "application/json"}, timeout=30
    )


# (name, body, status, code, param): `code`/`param` None are not checked.
Row = tuple[str, bytes | dict[str, Any], int, str | None, str | None]

CHAT_ROWS: list[Row] = [
    ("malformed json", b'{"messages": [', 400, "invalid_json", None),
    ("not an object", b"[1, 2, 3]", 400, "invalid_json", None),
    ("empty body", b"", 400, "invalid_json", None),
    ("not utf-8", b'{"messages": "\xff\xfe"}', 400, "invalid_json", None),
    ("missing messages", {"max_tokens": 3}, 400, "missing_required_parameter", "messages"),
    ("messages not a list", {"messages": "hi"}, 400, "invalid_value", "messages"),
    ("no messages", {"messages": []}, 400, "invalid_value", "messages"),
    ("role unknown", {"messages": [{"role": "robot", "content": "x"}]}, 400, None, None),
    ("content a number", {"messages": [{"role": "user", "content": 7}]}, 400, None, None),
    ("max_tokens a string", {"messages": HI, "max_tokens": "5"}, 400, None, "max_tokens"),
    ("max_tokens zero", {"messages": HI, "max_tokens": 0}, 400, None, "max_tokens"),
    ("max_tokens a float", {"messages": HI, "max_tokens": 2.5}, 400, None, "max_tokens"),
    ("temperature a string", {"messages": HI, "temperature": "hot"}, 400, None, "temperature"),
    ("temperature above 2", {"messages": HI, "temperature": 2.5}, 400, None, "temperature"),
    ("stream a string", {"messages": HI, "stream": "yes"}, 400, None, "stream"),
    ("unknown model", {"model": "gpt-4o", "messages": HI}, 404, "model_not_found", "model"),
    (
        "max_tokens beyond the context",
        {"messages": HI, "max_tokens": CONTEXT + 1},
        400,
        "context_length_exceeded",
        "max_tokens",
    ),
    (
        "prompt beyond the context",
        {"messages": [{"role": "user", "content": "word " * CONTEXT}]},
        400,
        "context_length_exceeded",
        "messages",
    ),
    ("n above the cap", {"messages": HI, "n": MAX_CHAT_N + 1}, 400, None, "n"),
    ("n zero", {"messages": HI, "n": 0}, 400, None, "n"),
    (
        "too many messages",
        {"messages": HI * (MAX_MESSAGES + 1), "max_tokens": 1},
        400,
        None,
        "messages",
    ),
    (
        "message too long",
        {"messages": [{"role": "user", "content": "a" * (MAX_MESSAGE_CHARS + 1)}]},
        400,
        None,
        None,
    ),
    (
        "message too long, as content parts",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": LONG_PART}]}]},
        400,
        None,
        None,
    ),
    ("too many stop sequences", {"messages": HI, "stop": ["x"] * 17}, 400, None, "stop"),
    ("empty stop sequence", {"messages": HI, "stop": [""]}, 400, None, "stop"),
    ("tool without a function", {"messages": HI, "tools": [{"type": "function"}]}, 400, None, None),
    ("logprobs on the fake engine", {"messages": HI, "logprobs": True}, 400, None, "logprobs"),
    ("logit_bias key not a token id", {"messages": HI, "logit_bias": {"a": 1}}, 400, None, None),
    (
        "stop_token_ids out of vocabulary",
        {"messages": HI, "stop_token_ids": [10**6]},
        400,
        None,
        "stop_token_ids",
    ),
    ("unknown model, a long name", {"model": LONG, "messages": HI}, 404, "model_not_found", None),
    ("logit_bias, a long key", {"messages": HI, "logit_bias": {LONG: "x"}}, 400, None, None),
    (
        "min_tokens above max_tokens",
        {"messages": HI, "max_tokens": 2, "min_tokens": 3},
        400,
        None,
        None,
    ),
]

IMAGE_ROWS: list[Row] = [
    ("malformed json", b'{"prompt": ', 400, "invalid_json", None),
    ("missing prompt", {"size": "64x64"}, 400, "missing_required_parameter", "prompt"),
    ("prompt a number", {"prompt": 5}, 400, "invalid_value", "prompt"),
    ("empty prompt", {"prompt": ""}, 400, None, "prompt"),
    ("prompt too long", {"prompt": "a" * (MAX_PROMPT_CHARS + 1)}, 400, None, "prompt"),
    ("unknown model", {"prompt": "x", "model": "dall-e-3"}, 404, "model_not_found", "model"),
    ("n above the model's cap", {"prompt": "x", "size": "64x64", "n": 5}, 400, None, "n"),
    ("n zero", {"prompt": "x", "n": 0}, 400, None, "n"),
    ("n a string", {"prompt": "x", "n": "2"}, 400, None, "n"),
    ("size above the model's cap", {"prompt": "x", "size": "4096x4096"}, 400, None, "size"),
    ("size below the model's floor", {"prompt": "x", "size": "16x16"}, 400, None, "size"),
    ("size not a multiple of 8", {"prompt": "x", "size": "100x100"}, 400, None, "size"),
    ("size not WxH", {"prompt": "x", "size": "large"}, 400, None, "size"),
    ("size absurd", {"prompt": "x", "size": "99999x99999"}, 400, None, "size"),
    ("response_format url", {"prompt": "x", "response_format": "url"}, 400, None, None),
    ("steps above the cap", {"prompt": "x", "num_inference_steps": 201}, 400, None, None),
    ("guidance a string", {"prompt": "x", "guidance_scale": "high"}, 400, None, None),
]


def check(response: httpx.Response, status: int, code: str | None, param: str | None) -> None:
    error = assert_error(response, status, code)
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("body,status,code,param", [r[1:] for r in CHAT_ROWS],
                         ids=[r[0] for r in CHAT_ROWS])  # fmt: skip
def test_chat_endpoint(
    surfaces: Surfaces, body: bytes | dict[str, Any], status: int, code: str | None,
    param: str | None,
) -> None:  # fmt: skip
    """One row of the chat table, posted through the gateway to a chat
    endpoint: the row's status (400, or 404 for an unknown model) in the one
    error shape, small, with the row's code and param where it names them."""
    endpoint = surfaces.chat
    check(post_raw(endpoint.url + CHAT, endpoint.headers, body), status, code, param)


@pytest.mark.parametrize("body,status,code,param", [r[1:] for r in IMAGE_ROWS],
                         ids=[r[0] for r in IMAGE_ROWS])  # fmt: skip
def test_image_endpoint(
    surfaces: Surfaces, body: bytes | dict[str, Any], status: int, code: str | None,
    param: str | None,
) -> None:  # fmt: skip
    """One row of the image table, posted through the gateway to an image
    endpoint: the row's status (400, or 404 for an unknown model) in the one
    error shape, small, with the row's code and param where it names them."""
    endpoint = surfaces.image
    check(post_raw(endpoint.url + IMAGES, endpoint.headers, body), status, code, param)


def test_wrong_route_for_the_model_kind(surfaces: Surfaces) -> None:
    """A chat request to an image endpoint and an image request to a chat
    endpoint, through the gateway: each a 400 `unsupported_route` in the one
    error shape."""
    image, chat = surfaces.image, surfaces.chat
    check(post_raw(image.url + CHAT, image.headers, {"messages": HI}), 400, "unsupported_route",
          None)  # fmt: skip
    check(post_raw(chat.url + IMAGES, chat.headers, {"prompt": "x"}), 400, "unsupported_route",
          None)  # fmt: skip


def _path(endpoint: Endpoint, route: str) -> str:
    return httpx.URL(endpoint.url + route).path


@pytest.mark.parametrize("which", ["chat", "image", "management"])
def test_body_over_the_limit_is_413_before_the_body_is_sent(surfaces: Surfaces, which: str) -> None:
    """Only the request head goes out, promising 50 MB: the answer comes
    without a byte of the body, so the limit was applied from the header."""
    if which == "management":
        url, path, auth = surfaces.serve.url, "/inference/endpoints", surfaces.admin()
    else:
        endpoint = surfaces.chat if which == "chat" else surfaces.image
        url, path = surfaces.serve.url, _path(endpoint, CHAT if which == "chat" else IMAGES)
        auth = endpoint.headers
    headers = {**auth, "Content-Type": "application/json", "Content-Length": str(HUGE)}
    answer = headers_only(url, path, headers)
    error = raw_error(answer, 413)
    assert error["code"] == "payload_too_large"
    # headers_only waits 10 s for an answer: one that waited for the 50 MB
    # body never to come would time out there instead.
    # A refused body is not read, so the connection is not reused.
    assert answer.headers.get("connection") == "close" or which == "management"


@pytest.mark.parametrize("which", ["chat", "image", "management"])
def test_body_over_the_limit_without_a_length_is_413(surfaces: Surfaces, which: str) -> None:
    """Chunked, no Content-Length: counted while read, refused past the limit."""
    if which == "management":
        url, auth = surfaces.serve.url + "/inference/endpoints", surfaces.admin()
    else:
        endpoint = surfaces.chat if which == "chat" else surfaces.image
        url, auth = endpoint.url + (CHAT if which == "chat" else IMAGES), endpoint.headers

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 4096 + 2):
            yield b"a" * 4096
        yield b'"}'

    response = httpx.post(url, content=chunks(), headers=auth, timeout=30)
    assert_error(response, 413, "payload_too_large")


MANAGEMENT_ROWS: list[tuple[str, str, str, bytes | dict[str, Any] | None, int, str | None]] = [
    ("malformed json", "POST", "/inference/endpoints", b'{"name": ', 400, "invalid_json"),
    ("not an object", "POST", "/inference/endpoints", b'"x"', 400, "invalid_json"),
    ("empty body", "POST", "/inference/endpoints", b"", 400, "invalid_json"),
    (
        "missing name",
        "POST",
        "/inference/endpoints",
        {"modelName": "tiny-chat"},
        400,
        "missing_required_parameter",
    ),
    (
        "name wrong type",
        "POST",
        "/inference/endpoints",
        {"name": 5, "modelName": "tiny-chat"},
        400,
        "invalid_value",
    ),
    (
        "name not allowed",
        "POST",
        "/inference/endpoints",
        {"name": "Bad Name!", "modelName": "tiny-chat"},
        400,
        "invalid_value",
    ),
    (
        "minReplicas a string",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "minReplicas": "1"},
        400,
        "invalid_value",
    ),
    (
        "minReplicas negative",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "minReplicas": -1},
        400,
        "invalid_value",
    ),
    (
        "maxReplicas above the cap",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "maxReplicas": 1000},
        400,
        None,
    ),
    (
        "maxReplicas huge",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "maxReplicas": 2**70},
        400,
        None,
    ),
    (
        "unknown field",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "maxReplica": 2},
        400,
        None,
    ),
    (
        "unknown model",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "gpt-9"},
        400,
        None,
    ),
    (
        "unknown gpu type",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "gpuType": "TPU"},
        400,
        None,
    ),
    (
        "unknown location",
        "POST",
        "/inference/endpoints",
        {"name": "x", "modelName": "tiny-chat", "locationName": "mars"},
        400,
        None,
    ),
    (
        "patch wrong type",
        "PATCH",
        "/inference/endpoints/{chat}",
        {"minReplicas": "2"},
        400,
        "invalid_value",
    ),
    ("patch malformed", "PATCH", "/inference/endpoints/{chat}", b"{", 400, "invalid_json"),
    ("patch unknown id", "PATCH", "/inference/endpoints/nope", {"minReplicas": 1}, 404, None),
    ("get unknown id", "GET", "/inference/endpoints/" + "9" * 5000, None, 404, None),
    (
        "recommend without model",
        "GET",
        "/inference/recommendations",
        None,
        400,
        "missing_required_parameter",
    ),
    (
        "recommend unknown model",
        "GET",
        "/inference/recommendations?modelName=gpt-9",
        None,
        400,
        "model_not_found",
    ),
    (
        "recommend long model",
        "GET",
        "/inference/recommendations?modelName=" + "m" * 5000,
        None,
        400,
        "model_not_found",
    ),
    ("unknown route", "GET", "/inference/nothing-here", None, 404, None),
    ("unknown route, long", "GET", "/inference/" + "n" * 5000, None, 404, None),
    ("wrong method", "PUT", "/inference/endpoints", {"name": "x"}, 405, None),
]


@pytest.mark.parametrize("method,path,body,status,code", [r[1:] for r in MANAGEMENT_ROWS],
                         ids=[r[0] for r in MANAGEMENT_ROWS])  # fmt: skip
def test_management_api(
    surfaces: Surfaces, method: str, path: str, body: bytes | dict[str, Any] | None,
    status: int, code: str | None,
) -> None:  # fmt: skip
    """One row of the management table, sent with the admin key: the row's
    status (400, 404 or 405) in the one error shape, small, with the row's code
    where it names one."""
    url = surfaces.serve.url + path.replace("{chat}", surfaces.chat.id)
    if isinstance(body, dict):
        response = httpx.request(method, url, json=body, headers=surfaces.admin())
    else:
        response = httpx.request(method, url, content=body, headers=surfaces.admin())
    assert_error(response, status, code)


def test_nothing_was_created_by_the_bad_requests(surfaces: Surfaces) -> None:
    """Runs after the bad requests in this module: the management API lists
    only the chat and image endpoints the fixture created, so no refused create
    made one."""
    names = [r["name"] for r in list_endpoints(surfaces.serve)["data"]]
    assert sorted(names) == ["chat", "image"]


# -- the real engine's limits, through the gateway ------------------------------------


@pytest.fixture
def vllm_gateway(
    vllm_replica: ReplicaHandle, gateway_in_front: Callable[..., GatewayInFront]
) -> GatewayInFront:
    return gateway_in_front("chat", "tiny-chat", [vllm_replica])


VLLM_ROWS: list[Row] = [
    (
        "max_tokens beyond the context",
        {"messages": HI, "max_tokens": 10**6},
        400,
        "context_length_exceeded",
        "max_tokens",
    ),
    (
        "max_tokens a little beyond the context",
        {"messages": HI, "max_tokens": "context"},
        400,
        "context_length_exceeded",
        "max_tokens",
    ),
    ("n above the cap", {"messages": HI, "n": MAX_CHAT_N + 1, "max_tokens": 1}, 400, None, "n"),
    (
        "too many messages",
        {"messages": HI * (MAX_MESSAGES + 1), "max_tokens": 1},
        400,
        None,
        "messages",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("body,status,code,param", [r[1:] for r in VLLM_ROWS],
                         ids=[r[0] for r in VLLM_ROWS])  # fmt: skip
def test_vllm_endpoint(
    vllm_gateway: GatewayInFront, vllm_replica: ReplicaHandle, body: dict[str, Any], status: int,
    code: str | None, param: str | None,
) -> None:  # fmt: skip
    """One row of the engine-limits table, through the gateway to the real vLLM
    replica (max_tokens far or just past the context, n or messages over the
    cap): 400 in the one error shape, with the row's param."""
    if body.get("max_tokens") == "context":
        # Exactly one token more than fits after this prompt.
        ok = httpx.post(
            vllm_gateway.url + CHAT, json={"messages": HI, "max_tokens": 1},
            headers=vllm_gateway.headers, timeout=60,
        )  # fmt: skip
        assert ok.status_code == 200, ok.text
        prompt = ok.json()["usage"]["prompt_tokens"]
        context = _vllm_context(vllm_replica)
        body = {**body, "max_tokens": context - prompt + 1}
    response = httpx.post(vllm_gateway.url + CHAT, json=body, headers=vllm_gateway.headers,
                          timeout=60)  # fmt: skip
    check(response, status, code, param)


def _vllm_context(replica: ReplicaHandle) -> int:
    """The model's context, from the error that names it."""
    response = httpx.post(
        replica.url + CHAT, json={"messages": HI, "max_tokens": 10**6}, timeout=60
    )
    message = response.json()["error"]["message"]
    return int(message.rsplit("context of ", 1)[1].split()[0])
