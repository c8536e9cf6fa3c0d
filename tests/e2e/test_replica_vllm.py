"""A real replica process serving tiny-chat through vLLM, called with the
official `openai` client and raw HTTP. One process for the whole session."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import openai
import pytest

from inferd.testing import ReplicaHandle
from tests.support import (
    MID_GENERATION_WINDOW_S,
    metrics_text,
    needs,
    seen_running,
    until_mid_generation,
)

pytestmark = [needs("vllm"), pytest.mark.slow]

CHAT = "/openai/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello."}]


def client(replica: ReplicaHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{replica.url}/openai/v1", api_key="unused", max_retries=0)


def metric(replica: ReplicaHandle, name: str) -> float:
    text = metrics_text(replica.url)
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} missing"
    return float(match.group(1))


def test_openai_client_non_streamed(vllm_replica: ReplicaHandle) -> None:
    completion = client(vllm_replica).chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "system", "content": "You are terse."}, *HELLO],  # type: ignore[list-item]
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert completion.object == "chat.completion"
    assert completion.model == "tiny-chat"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 12
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 12


def test_openai_client_streamed_with_usage(vllm_replica: ReplicaHandle) -> None:
    stream = client(vllm_replica).chat.completions.create(
        model="tiny-chat",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10


def test_stream_and_non_stream_agree_for_a_seed(vllm_replica: ReplicaHandle) -> None:
    body = {"messages": HELLO, "max_tokens": 16, "seed": 7, "temperature": 1.0, "ignore_eos": True}
    first = httpx.post(vllm_replica.url + CHAT, json=body, timeout=60).json()
    second = httpx.post(vllm_replica.url + CHAT, json=body, timeout=60).json()
    text = first["choices"][0]["message"]["content"]
    assert text == second["choices"][0]["message"]["content"]
    streamed = ""
    with httpx.stream("POST", vllm_replica.url + CHAT, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    streamed += choice["delta"].get("content") or ""
    assert streamed == text


# Inputs that have taken vLLM servers down in the past, and ordinary mistakes.
BAD = [
    ("context overflow", {"messages": HELLO, "max_tokens": 100_000}, 400),
    ("prompt beyond context", {"messages": [{"role": "user", "content": "hello " * 5000}]}, 400),
    ("logit_bias out of vocab", {"messages": HELLO, "logit_bias": {"10000000": 5}}, 400),
    ("stop_token_ids out of vocab", {"messages": HELLO, "stop_token_ids": [123456789]}, 400),
    ("invalid regex", {"messages": HELLO, "structured_outputs": {"regex": "(unclosed"}}, 400),
    (
        "invalid json schema",
        {
            "messages": HELLO,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 7}}},
        },
        400,
    ),
    ("unknown model", {"model": "gpt-4o", "messages": HELLO}, 404),
]


@pytest.mark.parametrize("body,status", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_are_4xx_and_the_same_process_keeps_serving(
    vllm_replica: ReplicaHandle, body: dict[str, object], status: int
) -> None:
    response = httpx.post(vllm_replica.url + CHAT, json={**body}, timeout=60)
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    good = httpx.post(
        vllm_replica.url + CHAT, json={"messages": HELLO, "max_tokens": 2}, timeout=60
    )
    assert good.status_code == 200
    assert vllm_replica.process.poll() is None  # same PID, still serving


def wait_idle(replica: ReplicaHandle, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while metric(replica, "inferd_engine_running") + metric(replica, "inferd_engine_waiting"):
        assert time.monotonic() < deadline, "vLLM still busy from an earlier request"
        time.sleep(0.05)


def test_reused_request_id_while_running_is_409(vllm_replica: ReplicaHandle) -> None:
    def attempt(index: int) -> bool:
        wait_idle(vllm_replica)
        body = {"messages": HELLO, "max_tokens": 2000, "ignore_eos": True}
        body["request_id"] = f"dup-{index}"
        first: list[int] = []
        thread = threading.Thread(
            target=lambda: first.append(
                httpx.post(vllm_replica.url + CHAT, json=body, timeout=120).status_code
            )
        )
        thread.start()
        try:
            if not seen_running(vllm_replica.url):
                return False
            asked = time.monotonic()
            second = httpx.post(vllm_replica.url + CHAT, json={**body, "max_tokens": 1}, timeout=60)
            if second.status_code == 200 and time.monotonic() - asked > MID_GENERATION_WINDOW_S:
                return False  # answered after a stall: the first may have ended meanwhile
        finally:
            thread.join(120)
        assert second.status_code == 409, second.text
        assert first == [200]
        # Once the first finished, the id is free again.
        again = httpx.post(vllm_replica.url + CHAT, json={**body, "max_tokens": 1}, timeout=60)
        assert again.status_code == 200
        return True

    until_mid_generation(attempt)


def test_client_disconnect_aborts_in_vllm(vllm_replica: ReplicaHandle) -> None:
    body = {"messages": HELLO, "max_tokens": 1800, "ignore_eos": True, "stream": True}

    def attempt(index: int) -> bool:
        wait_idle(vllm_replica)
        with httpx.Client(timeout=60) as http:
            response = http.send(
                http.build_request("POST", vllm_replica.url + CHAT, json=body), stream=True
            )
            lines = response.iter_lines()
            next(lines)
            next(lines)
            caught = seen_running(vllm_replica.url)
            response.close()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if metric(vllm_replica, "inferd_engine_running") == 0:
                break
            time.sleep(0.05)
        if not caught:
            return False
        assert metric(vllm_replica, "inferd_engine_running") == 0
        assert metric(vllm_replica, "inferd_requests_in_flight") == 0
        return True

    until_mid_generation(attempt)


def test_health_and_metrics(vllm_replica: ReplicaHandle) -> None:
    health = httpx.get(vllm_replica.url + "/health").json()
    assert health == {"status": "ready", "model": "tiny-chat", "engine": "vllm", "reason": None}
    text = httpx.get(vllm_replica.url + "/metrics").text
    for name in (
        "inferd_requests_total",
        "inferd_request_duration_seconds_bucket",
        "inferd_time_to_first_token_seconds_bucket",
        "inferd_generated_tokens_total",
        "inferd_requests_in_flight",
        "inferd_kv_cache_usage",
    ):
        assert name in text
    # The KV cache's size, reported so that gateways place prefixes by it.
    assert metric(vllm_replica, "inferd_kv_cache_tokens") >= 1024


def test_prefix_cache_hits_are_counted_and_reported(vllm_replica: ReplicaHandle) -> None:
    """The same long prompt twice: vLLM finds the second one's prefix in its
    cache, and the replica's /metrics (the figures its reports carry) say so."""
    queried = metric(vllm_replica, "inferd_prefix_cache_queried_tokens")
    hits = metric(vllm_replica, "inferd_prefix_cache_hit_tokens")
    words = " ".join(f"w{i}" for i in range(400))
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": f"Cache {words}"}],
            "max_tokens": 2}  # fmt: skip
    for _ in range(2):
        assert httpx.post(vllm_replica.url + CHAT, json=body, timeout=120).status_code == 200
    deadline = time.monotonic() + 30  # the stat logger records once per engine step
    while time.monotonic() < deadline:
        new_hits = metric(vllm_replica, "inferd_prefix_cache_hit_tokens")
        if new_hits > hits:
            break
        time.sleep(0.2)
    assert metric(vllm_replica, "inferd_prefix_cache_queried_tokens") > queried + 400
    assert hits + 100 < new_hits <= metric(vllm_replica, "inferd_prefix_cache_queried_tokens")
