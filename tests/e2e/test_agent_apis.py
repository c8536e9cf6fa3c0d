"""OpenAI's Responses API and Anthropic's Messages API on a chat replica,
answered by vLLM's own serving classes, driven by the official `openai` and
`anthropic` clients (the shared tiny-chat vLLM replica)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from inferd.testing import ReplicaHandle
from tests.support import needs

pytestmark = [needs("vllm", "openai", "anthropic"), pytest.mark.slow]

HELLO = [{"role": "user", "content": "Say hello to the sea."}]
# Greedy everywhere: the replica is shared, and sampled requests would move
# the engine's random state under the tests that run after these.
GREEDY: dict[str, Any] = {"temperature": 0}


def prompt_tokens_counted(replica: ReplicaHandle) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("inferd_prompt_tokens_total")
    )


@pytest.fixture(scope="module")
def responses_client(vllm_replica: ReplicaHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{vllm_replica.url}/openai/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:
        yield client


def test_the_openai_client_creates_and_streams_responses(
    vllm_replica: ReplicaHandle, responses_client: openai.OpenAI
) -> None:
    before = prompt_tokens_counted(vllm_replica)
    response = responses_client.responses.create(
        model="tiny-chat", input="Say hello to the sea.", max_output_tokens=8, temperature=0
    )
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert isinstance(response.output_text, str)
    assert response.usage is not None and response.usage.input_tokens > 0
    # The replica meters what it answered, as for every route.
    assert prompt_tokens_counted(vllm_replica) - before >= response.usage.input_tokens

    events = list(
        responses_client.responses.create(
            model="tiny-chat",
            input=HELLO,
            max_output_tokens=8,
            stream=True,  # type: ignore[arg-type]
            **GREEDY,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    final = events[-1].response  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.output_tokens > 0


def test_storage_is_refused_with_the_parameter_named(responses_client: openai.OpenAI) -> None:
    for extra in ({"store": True}, {"previous_response_id": "resp_123"}, {"background": True}):
        with pytest.raises(openai.BadRequestError) as refused:
            responses_client.responses.create(
                model="tiny-chat",
                input="hi",
                max_output_tokens=4,
                **extra,  # type: ignore[arg-type]
                **GREEDY,
            )
        error = refused.value
        assert error.param == next(iter(extra)), error.body
        assert "do not store" in error.message or "background" in error.message
    # Leaving `store` out works, unstored, as on vLLM's own server.
    assert responses_client.responses.create(
        model="tiny-chat", input="hi", max_output_tokens=2, **GREEDY
    )


def test_the_anthropic_client_creates_and_streams_messages(vllm_replica: ReplicaHandle) -> None:
    client = anthropic.Anthropic(
        base_url=vllm_replica.url, api_key="unused", max_retries=0, timeout=300
    )
    message = client.messages.create(
        model="tiny-chat",
        max_tokens=8,
        messages=HELLO,  # type: ignore[arg-type]
        extra_body=GREEDY,
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    with client.messages.stream(
        model="tiny-chat",
        max_tokens=8,
        messages=HELLO,  # type: ignore[arg-type]
        extra_body=GREEDY,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert isinstance(text, str) and final.usage.output_tokens > 0
    # Tools are offered in Anthropic's shape (the tiny model may or may not call one).
    with_tools = client.messages.create(
        model="tiny-chat",
        max_tokens=8,
        messages=HELLO,  # type: ignore[arg-type]
        tools=[
            {
                "name": "get_weather",
                "description": "The weather in a city.",
                "input_schema": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            }
        ],
        extra_body=GREEDY,
    )
    assert with_tools.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # A bad request is a 400, not a 500.
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny-chat", max_tokens=-1, messages=HELLO)  # type: ignore[arg-type]
