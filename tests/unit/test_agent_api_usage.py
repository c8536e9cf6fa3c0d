"""Token counts read from the Responses and Messages APIs' own events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from inferd.engines.vllm_serving import SseStream, Usage, _messages_usage, _responses_usage


def event(kind: str, data: dict[str, object]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


async def relay(stream: SseStream) -> list[bytes]:
    return [chunk async for chunk in stream]


async def events(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


def test_a_streamed_message_counts_input_first_and_output_last() -> None:
    items = [
        event(
            "message_start",
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 12, "output_tokens": 0}},
            },
        ),
        event("content_block_delta", {"type": "content_block_delta", "delta": {"text": "hi"}}),
        event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 7}}),
        event("message_stop", {"type": "message_stop"}),
    ]
    stream = SseStream(events(items), forward_usage=True, usage=_messages_usage)
    relayed = asyncio.run(relay(stream))
    assert [r.decode() for r in relayed] == items  # relayed whole, as vLLM wrote them
    assert stream.usage == Usage(12, 7)


def test_a_streamed_response_counts_from_its_completed_event() -> None:
    items = [
        event("response.created", {"type": "response.created", "response": {"usage": None}}),
        event("response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"}),
        event(
            "response.completed",
            {
                "type": "response.completed",
                "response": {"usage": {"input_tokens": 20, "output_tokens": 5}},
            },
        ),
    ]
    stream = SseStream(events(items), forward_usage=True, usage=_responses_usage)
    asyncio.run(relay(stream))
    assert stream.usage == Usage(20, 5)
    assert _responses_usage({"usage": {"input_tokens": 3, "output_tokens": 4}}) == Usage(3, 4)
    assert _responses_usage({"usage": None}) is None
