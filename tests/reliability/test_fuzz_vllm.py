"""The gateway's chat and models operations fuzzed against a real vLLM
replica (tiny-chat on the CPU), from the same OpenAPI document `inferd serve`
publishes: test_fuzz.py covers every route on fake engines with many
examples; this bounded run checks that what vLLM itself makes of odd but
schema-shaped bodies (its own validation, its limits, its errors) still comes
back documented, in the one error shape, and never as a server error.

Bounded: EXAMPLES per operation and mode (positive, negative), derandomized,
no coverage phase, and `max_tokens`, `min_tokens` and `n` capped so that one
accepted case costs at most a second or so of CPU decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode

from inferd.gateway.settings import GatewaySettings
from inferd.server.app import serving_openapi
from inferd.testing import ReplicaHandle
from tests.reliability.fault_support import GATEWAY_ENDPOINT, GatewayInFront
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow, pytest.mark.reliability(item=10)]

EXAMPLES = 25
MAX_TOKENS_CAP = 64  # what a fuzzed case may ask vLLM to decode
MAX_CHOICES = 2


def gateway_document() -> dict[str, Any]:
    """The gateway's chat and models operations as `inferd serve` documents them."""
    part = serving_openapi()
    paths = {
        path: operations
        for path, operations in part["paths"].items()
        if path.endswith(("/chat/completions", "/models"))
    }
    assert len(paths) == 2, sorted(part["paths"])
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferd gateway (chat)", "version": "1"},
        "paths": paths,
        "components": part["components"],
    }


schema = schemathesis.openapi.from_dict(gateway_document())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    deterministic=True,
    database="none",
)
# Generated examples only: the coverage phase's boundary cases (hundreds per
# operation) are test_fuzz.py's job on the fake engines.
schema.config.phases.coverage.enabled = False
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]
# A schema-valid body can still be beyond the model's limits (its context,
# a logprobs count): a documented 400 from vLLM's own validation.
schema.config.checks.update(excluded_check_names=["positive_data_acceptance"])


@pytest.fixture(scope="module")
def gateway(vllm_replica: ReplicaHandle) -> Iterator[GatewayInFront]:
    front = GatewayInFront("chat", "tiny-chat", [vllm_replica], GatewaySettings())
    yield front
    front.stop()


@pytest.fixture(scope="module")
def statuses() -> Iterator[dict[int, int]]:
    """Answers to the fuzzed calls, by status (shared by the module's tests)."""
    by_status: dict[int, int] = {}
    yield by_status
    print(
        f"\nfuzzed calls through the gateway to vLLM by status: {dict(sorted(by_status.items()))}"
    )


def _bounded(body: Any) -> Any:
    """The body with the endpoint's model (so positive cases reach vLLM
    instead of the gateway's 404 for another model) and a decode budget."""
    if isinstance(body, dict):
        if "model" in body:
            body = {**body, "model": "tiny-chat"}
        for key, cap in (("max_tokens", MAX_TOKENS_CAP), ("max_completion_tokens", MAX_TOKENS_CAP),
                         ("n", MAX_CHOICES), ("min_tokens", MAX_TOKENS_CAP)):  # fmt: skip
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                body = {**body, key: cap}
    return body


@pytest.mark.timeout(600)
@schema.parametrize()
def test_chat_through_the_gateway_to_vllm_answers_as_documented(
    case: schemathesis.Case, gateway: GatewayInFront, statuses: dict[int, int]
) -> None:
    """No server error, status and schema as documented, bad input refused,
    unauthenticated calls refused: with vLLM, not a fake, behind the gateway."""
    case.path_parameters = {**(case.path_parameters or {}), "endpoint_id": GATEWAY_ENDPOINT}
    case.body = _bounded(case.body)
    base = gateway.url.removesuffix(f"/endpoints/{GATEWAY_ENDPOINT}")
    response = case.call_and_validate(base_url=base, headers=gateway.headers, timeout=120)
    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1


def test_vllm_still_serves_after_the_fuzzing(
    gateway: GatewayInFront, statuses: dict[int, int]
) -> None:
    """Runs after the fuzzing: vLLM answered some fuzzed bodies itself (not
    only the gateway's refusals), none was a server error, and the replica
    still serves a plain request."""
    assert statuses.get(200, 0) > 0, statuses
    assert all(status < 500 for status in statuses), statuses
    response = httpx.post(
        gateway.url + "/openai/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=gateway.headers,
        timeout=60,
    )
    assert response.status_code == 200, response.text
