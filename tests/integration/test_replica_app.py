"""The replica's HTTP surface, in-process, on the fake engines.

Protocol shape, the error table and lifecycle gating; the real engines behind
real HTTP are in tests/e2e/test_replica_*.py.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from inferd.engines.base import EngineOptions
from inferd.engines.factory import create_engine
from inferd.replica.app import build_app
from inferd.replica.chat import ServedModel
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState
from inferd.vocab import ModelKind, ReplicaStatus

CHAT = "/openai/v1/chat/completions"
IMAGES = "/v1/images/generations"
HELLO = [{"role": "user", "content": "Hello there"}]


def make_client(kind: ModelKind, max_body_bytes: int = 64 * 1024, **extra: Any) -> TestClient:
    engine = create_engine("tiny", kind, None, EngineOptions(engine="fake", extra=extra))  # type: ignore[arg-type]
    state = ReplicaState()
    state.set(ReplicaStatus.READY)
    app = build_app(
        engine, state, ReplicaMetrics(engine, state), ServedModel("tiny", frozenset({"alias"})),
        max_body_bytes=max_body_bytes,
    )  # fmt: skip
    client = TestClient(app, raise_server_exceptions=False)
    client.app_state = state  # type: ignore[attr-defined]
    return client


@pytest.fixture
def chat() -> Iterator[TestClient]:
    with make_client(ModelKind.CHAT, context_length=256) as client:
        yield client


@pytest.fixture
def images() -> Iterator[TestClient]:
    with make_client(ModelKind.IMAGE) as client:
        yield client


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def assert_error_shape(response: Any, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    assert len(response.content) < 2048  # small bodies, never an echo of the input
    return body["error"]  # type: ignore[no-any-return]


def test_chat_completion_has_openai_shape_and_usage(chat: TestClient) -> None:
    response = chat.post(CHAT, json={"model": "tiny", "messages": HELLO, "max_tokens": 5})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"] == response.headers["x-request-id"]
    assert body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 5
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_model_alias_and_missing_model_are_accepted(chat: TestClient) -> None:
    assert chat.post(CHAT, json={"model": "alias", "messages": HELLO}).status_code == 200
    assert chat.post(CHAT, json={"messages": HELLO, "max_tokens": 2}).status_code == 200


def test_stream_is_sse_with_role_content_finish_usage_and_done(chat: TestClient) -> None:
    body = {
        "messages": HELLO,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with chat.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.read().decode())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 4
    content = [c["choices"][0] for c in chunks[1:-1]]
    assert "".join(c["delta"].get("content") or "" for c in content).split() == [
        "lorem", "ipsum", "dolor", "sit",
    ]  # fmt: skip
    assert content[-1]["finish_reason"] == "length"
    assert all(c["finish_reason"] is None for c in content[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(chat: TestClient) -> None:
    with chat.stream("POST", CHAT, json={"messages": HELLO, "max_tokens": 2, "stream": True}) as r:
        events = sse_events(r.read().decode())
    assert all("usage" not in e for e in events[:-1])


def test_n_choices_non_streamed_and_streamed(chat: TestClient) -> None:
    body = chat.post(CHAT, json={"messages": HELLO, "max_tokens": 3, "n": 3, "seed": 1}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 9
    # Distinct seeds per choice give distinct (fake) texts.
    assert len({c["message"]["content"] for c in body["choices"]}) == 3
    with chat.stream(
        "POST", CHAT, json={"messages": HELLO, "max_tokens": 3, "n": 2, "stream": True}
    ) as r:
        events = sse_events(r.read().decode())[:-1]
    finished = {c["choices"][0]["index"] for c in events if c["choices"][0]["finish_reason"]}
    assert finished == {0, 1}


def test_stop_sequence_ends_output_without_it(chat: TestClient) -> None:
    body = chat.post(CHAT, json={"messages": HELLO, "max_tokens": 8, "stop": ["dolor"]}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "dolor" not in choice["message"]["content"]
    assert choice["message"]["content"].startswith("lorem ipsum")


BAD_CHAT_REQUESTS = [
    # (name, raw body, status, param, code)
    ("malformed json", b"{not json", 400, None, "invalid_json"),
    ("json array", b"[1, 2]", 400, None, "invalid_json"),
    ("empty body", b"", 400, None, "invalid_json"),
    ("missing messages", {"model": "tiny"}, 400, "messages", "missing_required_parameter"),
    ("messages not a list", {"messages": "hi"}, 400, "messages", None),
    ("empty messages", {"messages": []}, 400, "messages", None),
    ("bad role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, None, None),
    ("content wrong type", {"messages": [{"role": "user", "content": 5}]}, 400, None, None),
    ("max_tokens string", {"messages": HELLO, "max_tokens": "5"}, 400, "max_tokens", None),
    ("max_tokens float", {"messages": HELLO, "max_tokens": 5.5}, 400, "max_tokens", None),
    ("max_tokens zero", {"messages": HELLO, "max_tokens": 0}, 400, "max_tokens", None),
    ("max_tokens beyond context", {"messages": HELLO, "max_tokens": 10_000}, 400, "max_tokens",
     "context_length_exceeded"),
    ("stream not bool", {"messages": HELLO, "stream": "yes"}, 400, "stream", None),
    ("temperature too high", {"messages": HELLO, "temperature": 3}, 400, "temperature", None),
    ("top_p zero", {"messages": HELLO, "top_p": 0}, 400, "top_p", None),
    ("n too large", {"messages": HELLO, "n": 99}, 400, "n", None),
    ("empty stop", {"messages": HELLO, "stop": [""]}, 400, "stop", None),
    ("too many stops", {"messages": HELLO, "stop": [str(i) for i in range(17)]}, 400, "stop", None),
    ("logit_bias bad key", {"messages": HELLO, "logit_bias": {"abc": 1}}, 400, "logit_bias", None),
    ("logit_bias oov", {"messages": HELLO, "logit_bias": {"99999": 1}}, 400, "logit_bias", None),
    ("stop_token_ids oov", {"messages": HELLO, "stop_token_ids": [10**6]}, 400,
     "stop_token_ids", None),
    ("tool without a function", {"messages": HELLO, "tools": [{"type": "function"}]}, 400,
     None, None),
    ("too many messages", {"messages": HELLO * 300}, 400, "messages", None),
    ("unknown model", {"model": "gpt-9", "messages": HELLO}, 404, "model", "model_not_found"),
    # request_id comes back in the X-Request-Id header: only what a header can carry.
    ("request_id not ascii", {"messages": HELLO, "request_id": "\u4e00"}, 400, "request_id", None),
    ("request_id astral", {"messages": HELLO, "request_id": "\U0001f600"}, 400, "request_id",
     None),
    ("request_id newline", {"messages": HELLO, "request_id": "a\nb"}, 400, "request_id", None),
    ("request_id too long", {"messages": HELLO, "request_id": "x" * 129}, 400, "request_id", None),
]  # fmt: skip


@pytest.mark.parametrize(
    "body,status,param,code",
    [case[1:] for case in BAD_CHAT_REQUESTS],
    ids=[case[0] for case in BAD_CHAT_REQUESTS],
)
def test_bad_chat_requests_get_one_error_shape(
    chat: TestClient, body: Any, status: int, param: str | None, code: str | None
) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = chat.post(CHAT, content=raw, headers={"content-type": "application/json"})
    error = assert_error_shape(response, status, param)
    if code is not None:
        assert error["code"] == code
    # A bad request never takes the replica down: the next good one works.
    assert chat.post(CHAT, json={"messages": HELLO, "max_tokens": 1}).status_code == 200


def test_body_over_limit_is_413_from_content_length_alone() -> None:
    with make_client(ModelKind.CHAT, max_body_bytes=1024) as client:
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
        response = client.post(CHAT, content=big, headers={"content-type": "application/json"})
        assert_error_shape(response, 413)

        def chunked() -> Iterator[bytes]:  # no Content-Length: counted while streaming
            yield big[:600]
            yield big[600:]

        response = client.post(
            CHAT, content=chunked(), headers={"content-type": "application/json"}
        )
        assert_error_shape(response, 413)


def test_unknown_route_wrong_method_and_wrong_kind_use_error_shape(chat: TestClient) -> None:
    assert_error_shape(chat.get("/nope"), 404)
    assert_error_shape(chat.get(CHAT), 405)
    error = assert_error_shape(chat.post(IMAGES, json={"prompt": "x"}), 400)
    assert error["code"] == "unsupported_route" and "chat completions at" in error["message"]


def test_duplicate_running_request_id_is_409(chat: TestClient) -> None:
    import threading

    results: list[int] = []
    body = {"messages": HELLO, "max_tokens": 200, "request_id": "same-id"}

    def call() -> None:
        results.append(chat.post(CHAT, json=body).status_code)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200, 409]


def test_health_and_admission_follow_the_lifecycle() -> None:
    with make_client(ModelKind.CHAT) as client:
        state: ReplicaState = client.app_state  # type: ignore[attr-defined]
        assert client.get("/health").json()["status"] == "ready"
        state.set(ReplicaStatus.DRAINING)
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        response = client.post(CHAT, json={"messages": HELLO})
        error = assert_error_shape(response, 503)
        assert error["code"] == "replica_draining"
        assert response.headers["retry-after"] == "1"


def test_metrics_count_requests_tokens_and_ttft(chat: TestClient) -> None:
    chat.post(CHAT, json={"messages": HELLO, "max_tokens": 3})
    chat.post(CHAT, json={"messages": HELLO, "max_tokens": 0})
    text = chat.get("/metrics").text
    assert 'inferd_requests_total{route="chat",status="200"} 1.0' in text
    assert 'inferd_requests_total{route="chat",status="400"} 1.0' in text
    assert "inferd_generated_tokens_total 3.0" in text
    assert "inferd_time_to_first_token_seconds_count 1.0" in text
    assert "inferd_requests_in_flight 0.0" in text


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_images_default_to_1024_square_png(images: TestClient) -> None:
    response = images.post(IMAGES, json={"prompt": "a red fox"})
    assert response.status_code == 200
    (item,) = response.json()["data"]
    assert png_size(base64.b64decode(item["b64_json"])) == (1024, 1024)


def test_images_n_and_size(images: TestClient) -> None:
    data = images.post(IMAGES, json={"prompt": "x", "n": 2, "size": "512x256"}).json()["data"]
    assert [png_size(base64.b64decode(d["b64_json"])) for d in data] == [(512, 256)] * 2
    text = images.get("/metrics").text
    assert "inferd_generated_images_total 2.0" in text
    assert 'inferd_requests_total{route="images",status="200"} 1.0' in text
    assert 'inferd_request_duration_seconds_count{route="images"} 1.0' in text


BAD_IMAGE_REQUESTS = [
    ("missing prompt", {"n": 1}, 400, "prompt"),
    ("empty prompt", {"prompt": ""}, 400, "prompt"),
    ("prompt too long", {"prompt": "x" * 5000}, 400, "prompt"),
    ("n too large", {"prompt": "x", "n": 50}, 400, "n"),
    ("n zero", {"prompt": "x", "n": 0}, 400, "n"),
    ("size garbage", {"prompt": "x", "size": "big"}, 400, "size"),
    ("size not multiple", {"prompt": "x", "size": "1001x1001"}, 400, "size"),
    ("size too large", {"prompt": "x", "size": "8192x8192"}, 400, "size"),
    ("url format", {"prompt": "x", "response_format": "url"}, 400, "response_format"),
    ("unknown model", {"prompt": "x", "model": "dall-e-9"}, 404, "model"),
]


@pytest.mark.parametrize(
    "body,status,param",
    [case[1:] for case in BAD_IMAGE_REQUESTS],
    ids=[case[0] for case in BAD_IMAGE_REQUESTS],
)
def test_bad_image_requests(images: TestClient, body: Any, status: int, param: str) -> None:
    assert_error_shape(images.post(IMAGES, json=body), status, param)
    assert images.post(IMAGES, json={"prompt": "ok", "size": "64x64"}).status_code == 200


def test_concurrent_image_requests_all_succeed(images: TestClient) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def call(i: int) -> int:
        return images.post(IMAGES, json={"prompt": f"p{i}", "size": "64x64"}).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(call, range(16)))
    assert codes == [200] * 16


def _contents(events: list[Any]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in events
        if c != "[DONE]" and c["choices"]
    )


def _usage(events: list[Any]) -> dict[str, int]:
    (usage,) = [c["usage"] for c in events if c != "[DONE]" and c.get("usage")]
    return usage  # type: ignore[no-any-return]


def test_token_id_lines_only_when_the_gateway_asks_and_a_resume_by_them(chat: TestClient) -> None:
    from inferd.api.replica import RESUME_FIELD, RESUMED_HEADER, TOKEN_IDS_HEADER
    from inferd.gateway.migration import strip_ids

    body = {"messages": HELLO, "max_tokens": 6, "stream": True}
    usage = {"stream_options": {"include_usage": True}}
    direct = chat.post(CHAT, json=body).text
    assert ": ids" not in direct
    asked = chat.post(CHAT, json=body, headers={TOKEN_IDS_HEADER: "1"}).text
    # Every chunk but the role chunk and [DONE] names its ids.
    events = [e for e in asked.split("\n\n") if e]
    named = [e.split("\n")[0] for e in events if e.startswith(": ids")]
    ids = [int(i) for line in named for i in line.split()[2:]]
    assert len(named) == len(events) - 2 and len(ids) == 6
    full = _contents(sse_events(direct))
    assert _contents(sse_events(strip_ids(asked.encode()).decode())) == full

    # Resumed after 4 of them: the rest, no role chunk, usage of the whole.
    read = "".join(word + " " for word in full.split()[:4])
    resumed = {**body, **usage, RESUME_FIELD: {"token_ids": ids[:4], "text": read}}
    out = sse_events(chat.post(CHAT, json=resumed, headers={RESUMED_HEADER: "1"}).text)
    assert "role" not in out[0]["choices"][0]["delta"]
    assert read + _contents(out) == full
    whole = _usage(sse_events(chat.post(CHAT, json={**body, **usage}).text))
    assert _usage(out) == whole and whole["completion_tokens"] == 6
    # Text that is not the text of the ids: resumed from the text instead.
    mismatched = {**resumed, RESUME_FIELD: {"token_ids": ids[:4], "text": "other words "}}
    out = sse_events(chat.post(CHAT, json=mismatched, headers={RESUMED_HEADER: "1"}).text)
    assert _usage(out)["completion_tokens"] == 6 and _contents(out) != full[len(read) :]
    # Without the gateway's header the field is not the replica's to read.
    ignored = chat.post(CHAT, json={**body, RESUME_FIELD: {"token_ids": "x"}})
    assert ignored.status_code == 200
    bad = {**body, RESUME_FIELD: {"token_ids": "x"}}
    assert chat.post(CHAT, json=bad, headers={RESUMED_HEADER: "1"}).status_code == 400
