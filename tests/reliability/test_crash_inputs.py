"""Item 9: requests that have taken vLLM servers down, on the real vLLM
engine (the session's shared `vllm_replica`): each is refused with a 4xx in
the one error shape, and the same replica process (same PID, its engine
alive) answers the next good request.

`tests/e2e/test_replica_vllm.py` sends its table (`BAD`: out-of-vocabulary
`logit_bias` and `stop_token_ids`, an invalid regex and JSON schema) to the
replica directly, and a reused request id in the body. Here: more inputs of
the same families directly, then all of them, its table included, through
the real gateway in front of that replica, and a reused request id given in
the `X-Request-Id` header through the gateway. A full `inferd serve` with a
second vLLM replica would cost another engine load (over a minute on a
CPU) for the same code path; the gateway in front of the shared replica is
the endpoint's path at no cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from inferd.testing import ReplicaHandle
from tests.e2e.test_replica_vllm import BAD as REPLICA_TABLE
from tests.reliability.fault_support import CHAT
from tests.reliability.limits_support import assert_error
from tests.support import (
    MID_GENERATION_WINDOW_S,
    engine_running,
    needs,
    seen_running,
    until_mid_generation,
)

if TYPE_CHECKING:
    from tests.reliability.conftest import GatewayInFront

pytestmark = [needs("vllm"), pytest.mark.slow, pytest.mark.reliability(item=9)]

HI = [{"role": "user", "content": "Say hello."}]
GOOD = {"messages": HI, "max_tokens": 2}

# (name, body, status). Bodies given as bytes are sent as they are.
MORE: list[tuple[str, dict[str, Any] | bytes, int]] = [
    ("logit_bias negative token id", {"messages": HI, "logit_bias": {"-1": 5}}, 400),
    ("logit_bias at the vocabulary size", {"messages": HI, "logit_bias": {"VOCAB": 5}}, 400),
    ("logit_bias far out of range", {"messages": HI, "logit_bias": {"9999999999": 1}}, 400),
    (
        "logit_bias NaN",
        b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": NaN}}',
        400,
    ),
    ("stop_token_ids negative", {"messages": HI, "stop_token_ids": [-1]}, 400),
    ("stop_token_ids at the vocabulary size", {"messages": HI, "stop_token_ids": ["VOCAB"]}, 400),
    ("stop_token_ids beyond int64", {"messages": HI, "stop_token_ids": [2**64]}, 400),
    (
        "temperature NaN",
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        400,
    ),
    (
        "temperature Infinity",
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}',
        400,
    ),
    ("seed beyond int64", {"messages": HI, "seed": 2**64}, 400),
    ("min_tokens beyond the context", {"messages": HI, "min_tokens": 10**6}, 400),
    (
        "structured json not JSON",
        {"messages": HI, "structured_outputs": {"json": "{not json"}},
        400,
    ),
    (
        "json schema with an invalid pattern",
        {
            "messages": HI,
            "structured_outputs": {"json": {"type": "string", "pattern": "(unclosed"}},
        },
        400,
    ),
    (
        "json schema with a dangling $ref",
        {
            "messages": HI,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
                },
            },
        },
        400,
    ),
    (
        "json schema of an unknown type",
        {
            "messages": HI,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"type": "tuple-of-dreams"}},
            },
        },
        400,
    ),
    (
        "json_schema without a schema",
        {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {}}},
        400,
    ),
    ("regex with a bad range", {"messages": HI, "structured_outputs": {"regex": "[z-a]"}}, 400),
    (
        "json and regex at once",
        {"messages": HI, "structured_outputs": {"json": {"type": "string"}, "regex": "a+"}},
        400,
    ),
]


def vocab_size(replica: ReplicaHandle) -> int:
    """The model's vocabulary size, from the error that states it."""
    response = httpx.post(
        replica.url + CHAT, json={"messages": HI, "stop_token_ids": [10**9]}, timeout=60
    )
    message = response.json()["error"]["message"]
    return int(message.rsplit(", ", 1)[1].rstrip(").").strip())


def resolve(body: dict[str, Any] | bytes, vocab: int) -> dict[str, Any] | bytes:
    """Fill in the vocabulary size where a row says VOCAB."""
    if isinstance(body, bytes):
        return body
    out = dict(body)
    if out.get("logit_bias") == {"VOCAB": 5}:
        out["logit_bias"] = {str(vocab): 5}
    if out.get("stop_token_ids") == ["VOCAB"]:
        out["stop_token_ids"] = [vocab]
    return out


def send(url: str, body: dict[str, Any] | bytes, headers: dict[str, str]) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {**headers, "Content-Type": "application/json"}
        return httpx.post(url, content=body, headers=headers, timeout=60)
    return httpx.post(url, json=body, headers=headers, timeout=60)


def assert_refused_then_serves(
    replica: ReplicaHandle, url: str, headers: dict[str, str], body: Any, status: int
) -> None:
    pid = replica.pid
    response = send(url, body, headers)
    assert_error(response, status)
    good = httpx.post(url, json=GOOD, headers=headers, timeout=60)
    assert good.status_code == 200, good.text
    assert replica.process.poll() is None and replica.pid == pid
    assert httpx.get(replica.url + "/health", timeout=5).json()["status"] == "ready"


@pytest.fixture
def gateway(
    vllm_replica: ReplicaHandle, gateway_in_front: Callable[..., GatewayInFront]
) -> GatewayInFront:
    return gateway_in_front("chat", "tiny-chat", [vllm_replica])


@pytest.mark.parametrize("body,status", [r[1:] for r in MORE], ids=[r[0] for r in MORE])
def test_refused_by_the_replica_which_keeps_serving(
    vllm_replica: ReplicaHandle, body: dict[str, Any] | bytes, status: int
) -> None:
    """One row of this module's table straight at the vLLM replica: refused
    with its 400 in the one error shape, then the same process (same PID,
    health ready) answers a good request with 200."""
    body = resolve(body, vocab_size(vllm_replica))
    assert_refused_then_serves(vllm_replica, vllm_replica.url + CHAT, {}, body, status)


def test_every_crash_input_through_the_gateway(
    vllm_replica: ReplicaHandle, gateway: GatewayInFront
) -> None:
    """Every row of the replica e2e table and of this module's, through the
    gateway: each refused with its 4xx in the one error shape, then the same
    vLLM process (same PID, health ready) answers a good request."""
    vocab = vocab_size(vllm_replica)
    rows = [(name, body, status) for name, body, status in REPLICA_TABLE] + MORE
    for name, body, status in rows:
        print(name)
        assert_refused_then_serves(
            vllm_replica, gateway.url + CHAT, gateway.headers, resolve(body, vocab), status
        )


def test_reused_request_id_header_through_the_gateway(
    vllm_replica: ReplicaHandle, gateway: GatewayInFront
) -> None:
    """A second request with the id of one still running is 409; the first
    is unharmed; once it is gone the id is free again."""
    pid = vllm_replica.pid
    long = {"messages": HI, "max_tokens": 1500, "ignore_eos": True, "stream": True}

    def assert_id_free_again(headers: dict[str, str]) -> None:
        # Closed by the client: aborted, and the id is free again.
        deadline = time.monotonic() + 10
        again = httpx.post(gateway.url + CHAT, json=GOOD, headers=headers, timeout=60)
        while again.status_code == 409 and time.monotonic() < deadline:
            time.sleep(0.1)
            again = httpx.post(gateway.url + CHAT, json=GOOD, headers=headers, timeout=60)
        assert again.status_code == 200, again.text
        assert vllm_replica.process.poll() is None and vllm_replica.pid == pid

    def attempt(index: int) -> bool:
        headers = {**gateway.headers, "X-Request-Id": f"reused-through-gateway-{index}"}
        deadline = time.monotonic() + 30
        while engine_running(vllm_replica.url):  # an earlier attempt's stream, aborted
            assert time.monotonic() < deadline, "vLLM still busy"
            time.sleep(0.05)
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", gateway.url + CHAT, json=long, headers=headers) as first,
        ):
            assert first.status_code == 200
            events = (line for line in first.iter_lines() if line.startswith("data: {"))
            next(events)  # the first event: the request is in the engine
            if not seen_running(vllm_replica.url):
                return False
            asked = time.monotonic()
            second = httpx.post(gateway.url + CHAT, json=GOOD, headers=headers, timeout=60)
            if second.status_code == 200 and time.monotonic() - asked > MID_GENERATION_WINDOW_S:
                return False  # answered after a stall: the first may have ended meanwhile
            assert_error(second, 409)
            # The first goes on streaming.
            assert '"delta"' in next(events)
        assert_id_free_again(headers)
        return True

    until_mid_generation(attempt)
