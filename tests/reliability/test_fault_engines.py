"""Faults that are about the real engines (issue 5, items 5 and 6): a client
that goes away must free vLLM at once, straight at the replica and through
the gateway; concurrent image requests on diffusers get an answer or a clean
refusal, never a 500. The session's shared vLLM and diffusers replicas."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from inferd.gateway.settings import GatewaySettings
from inferd.testing import ReplicaHandle, ServeHandle
from tests.reliability.fault_support import (
    CHAT,
    HELLO,
    IMAGES,
    Endpoint,
    GatewayInFront,
    assert_error_shape,
    metric,
    open_request,
    read_until,
    wait_until,
)
from tests.support import (
    MID_GENERATION_WINDOW_S,
    needs,
    seen_running,
    until_mid_generation,
)
from tests.timings import HANG_S, record_timing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ASKED_TOKENS = 1800  # far more than a disconnect lets it generate


def engine_running(replica: ReplicaHandle) -> float:
    return metric(replica.url, "inferd_engine_running")


@needs("vllm")
@pytest.mark.reliability(item=5)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
@pytest.mark.parametrize("via", ["replica", "gateway"])
def test_client_disconnect_frees_vllm(
    vllm_replica: ReplicaHandle,
    gateway_in_front: Callable[..., GatewayInFront],
    via: str,
    stream: bool,
) -> None:
    """A client that disconnects mid-generation: vLLM's running count drops
    to 0 (straight at the replica, or through the gateway) long before the
    1,800 tokens asked for were done; how soon (goal 2 s) is measured by
    benchmarks/fault_timings.py."""
    wait_until(lambda: engine_running(vllm_replica) == 0, 10, what="vLLM idle before the test")
    if via == "gateway":
        gateway = gateway_in_front("chat", "tiny-chat", [vllm_replica])
        url, headers = gateway.url + CHAT, gateway.headers
    else:
        url, headers = vllm_replica.url + CHAT, {}
    body = {"messages": HELLO, "max_tokens": ASKED_TOKENS, "ignore_eos": True, "stream": stream}

    def attempt(index: int) -> bool:
        wait_until(lambda: engine_running(vllm_replica) == 0, 30, what="vLLM idle")
        generated_before = metric(vllm_replica.url, "inferd_generated_tokens_total")
        sock = open_request(url, body, headers)
        try:
            if stream:
                assert read_until(sock, b"data: ", 60).startswith(b"HTTP/1.1 200")
            if not seen_running(vllm_replica.url, window=2 * MID_GENERATION_WINDOW_S):
                return False
        finally:
            sock.close()  # the client goes away mid-generation
        freed = wait_until(lambda: engine_running(vllm_replica) == 0, HANG_S, 0.02, "vLLM freed")
        record_timing(f"disconnect via {via} (stream={stream}): vLLM freed", freed)
        # Freed by the abort, not by finishing: once the replica is done with
        # the request, it never generated all the tokens it asked for.
        wait_until(lambda: metric(vllm_replica.url, "inferd_requests_in_flight") == 0, HANG_S)
        generated = metric(vllm_replica.url, "inferd_generated_tokens_total") - generated_before
        assert generated < ASKED_TOKENS, generated
        return True

    until_mid_generation(attempt)
    wait_until(lambda: metric(vllm_replica.url, "inferd_requests_in_flight") == 0, HANG_S)
    if via == "gateway":
        wait_until(lambda: gateway.in_flight() == 0, HANG_S, what="the gateway forgot the request")
    # The same engine serves the next request.
    after = httpx.post(
        vllm_replica.url + CHAT, json={"messages": HELLO, "max_tokens": 2}, timeout=60
    )
    assert after.status_code == 200


CONCURRENT_IMAGES = 16
IMAGE_BODY: dict[str, Any] = {"prompt": "a lighthouse", "size": "256x256", "num_inference_steps": 1}


def sixteen_at_once(url: str, headers: dict[str, str]) -> list[httpx.Response]:
    with ThreadPoolExecutor(CONCURRENT_IMAGES) as pool:
        futures = [
            pool.submit(httpx.post, url, json=IMAGE_BODY, headers=headers, timeout=240)
            for _ in range(CONCURRENT_IMAGES)
        ]
        return [f.result() for f in futures]


def assert_answered_or_cleanly_refused(responses: list[httpx.Response]) -> dict[int, int]:
    """Each: 200 with one image, or 429/503 in the error shape with a
    Retry-After; never anything else. Returns the count by status."""
    by_status: dict[int, int] = {}
    for response in responses:
        by_status[response.status_code] = by_status.get(response.status_code, 0) + 1
        if response.status_code == 200:
            (image,) = response.json()["data"]
            assert image["b64_json"].startswith("iVBORw0KGgo")  # a PNG
            continue
        assert response.status_code in (429, 503), (response.status_code, response.text[:300])
        assert_error_shape(response)
        assert int(response.headers["retry-after"]) >= 1
    return by_status


@needs("diffusers")
@pytest.mark.reliability(item=6)
def test_sixteen_concurrent_images_on_diffusers(diffusers_replica: ReplicaHandle) -> None:
    """16 concurrent image requests straight at a diffusers replica: each 200
    or a clean 429/503, none 500."""
    started = time.monotonic()
    responses = sixteen_at_once(diffusers_replica.url + IMAGES, {})
    by_status = assert_answered_or_cleanly_refused(responses)
    assert by_status.get(200, 0) >= 1, by_status
    assert time.monotonic() - started < 240
    assert metric(diffusers_replica.url, "inferd_requests_in_flight") == 0


@needs("diffusers")
@pytest.mark.reliability(item=6)
def test_sixteen_concurrent_images_through_a_bounded_gateway(
    diffusers_replica: ReplicaHandle, gateway_in_front: Callable[..., GatewayInFront]
) -> None:
    """16 concurrent image requests through the gateway bounded at 4 in
    flight and 4 held on diffusers: 200s and clean 429s, none 500."""
    gateway = gateway_in_front(
        "image",
        "tiny-sdxl",
        [diffusers_replica],
        GatewaySettings(max_in_flight_per_replica=4, max_held_requests=4),
    )
    responses = sixteen_at_once(gateway.url + IMAGES, gateway.headers)
    by_status = assert_answered_or_cleanly_refused(responses)
    # Four run, four wait; the others are refused at once, as overload.
    assert by_status.get(200, 0) >= 8 and set(by_status) <= {200, 429}, by_status
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "overloaded"
    wait_until(lambda: gateway.in_flight() == 0, 5, what="the gateway drained")


@needs("diffusers")
@pytest.mark.reliability(item=6)
def test_sixteen_concurrent_images_through_an_endpoint(
    serve_factory: Callable[..., ServeHandle],
) -> None:
    """16 concurrent image requests to an `inferd serve` endpoint of
    tiny-sdxl (a real diffusers replica; 8 in flight and 4 held at most):
    200s and clean 429s, none 500."""
    serve = serve_factory(
        replica_args="--engine diffusers",
        gateway_max_in_flight_per_replica="8",
        gateway_max_queued_per_endpoint="4",
    )
    ep = Endpoint.create(serve, name="images", modelName="tiny-sdxl", minReplicas=1)
    serve.wait_record(ep.id, lambda r: r["status"] == "running", timeout=240)
    responses = sixteen_at_once(ep.url + IMAGES, ep.headers)
    by_status = assert_answered_or_cleanly_refused(responses)
    assert by_status.get(200, 0) >= 12 and set(by_status) <= {200, 429}, by_status
    record = serve.record(ep.id)
    assert [r["status"] for r in record["replicas"]] == ["ready"]
