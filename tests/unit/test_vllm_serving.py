"""The bridge to vLLM's serving code: its errors in inferd's shape, and the
usage of a stream counted whether or not the client sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inferd.errors import BadRequest, NotFound, ServiceUnavailable
from tests.support import needs

pytestmark = needs("vllm")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_vllm_errors_keep_their_status_and_parameter() -> None:
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    from inferd.engines.vllm_serving import _call

    async def raising(exc: Exception) -> None:
        raise exc

    async def answering(code: int) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message="no", type="x", param="model", code=code))

    with pytest.raises(BadRequest) as bad:
        run(_call(lambda: raising(VLLMValidationError("too long", parameter="max_tokens"))))
    assert bad.value.param == "max_tokens" and "too long" in bad.value.message
    with pytest.raises(BadRequest):
        run(_call(lambda: raising(ValueError("a bad value"))))
    with pytest.raises(NotFound) as missing:
        run(_call(lambda: answering(404)))
    assert missing.value.param == "model"
    with pytest.raises(BadRequest):
        run(_call(lambda: answering(422)))
    with pytest.raises(ServiceUnavailable) as dead:
        run(_call(lambda: raising(EngineDeadError())))
    assert dead.value.code == "engine_dead"


def test_an_empty_input_list_is_refused_before_vllm() -> None:
    from types import SimpleNamespace

    from inferd.engines.vllm_serving import VllmServing

    serving = VllmServing(SimpleNamespace(serving_embedding=object()), ["embed"])
    with pytest.raises(BadRequest) as refused:
        run(serving.embedding({"model": "m", "input": []}, None))
    assert refused.value.param == "input"


@pytest.mark.parametrize("forward_usage", [False, True])
def test_stream_usage_is_counted_and_relayed_only_when_asked(forward_usage: bool) -> None:
    from inferd.engines.vllm_serving import SseStream

    chunk = {"id": "c", "choices": [{"index": 0, "text": "hi"}], "usage": None}
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
    events = [
        f"data: {json.dumps(chunk)}\n\n",
        f"data: {json.dumps(usage)}\n\n",
        "data: [DONE]\n\n",
    ]

    async def source() -> AsyncIterator[str]:
        for event in events:
            yield event

    async def relay() -> tuple[list[bytes], SseStream]:
        stream = SseStream(source(), forward_usage=forward_usage)
        return [event async for event in stream], stream

    relayed, stream = run(relay())
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 5)
    assert relayed[0] == events[0].encode() and relayed[-1] == b"data: [DONE]\n\n"
    assert (events[1].encode() in relayed) is forward_usage


def test_a_resumed_stream_counts_the_answer_so_far_as_completion_tokens() -> None:
    from inferd.engines.vllm_serving import SseStream

    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 13, "completion_tokens": 5}}

    async def source() -> AsyncIterator[str]:
        yield f"data: {json.dumps(usage)}\n\n"

    async def relay() -> tuple[list[bytes], SseStream]:
        stream = SseStream(source(), forward_usage=True)
        stream.produced = 10
        return [event async for event in stream], stream

    relayed, stream = run(relay())
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 15)
    assert json.loads(relayed[0][6:])["usage"] == {"prompt_tokens": 3, "completion_tokens": 15}


@pytest.mark.parametrize(
    ("body", "resumed", "produced", "after"),
    [
        # One token a word here: "the sky is" + " blue and" -> 2 tokens produced.
        (
            {"prompt": "the sky is blue and", "max_tokens": 10, "min_tokens": 4},
            "9",
            2,
            {"max_tokens": 8, "min_tokens": 2},
        ),
        ({"prompt": "a b", "max_tokens": 1}, "2", 1, {"max_tokens": 1}),
        ({"prompt": "a b"}, "2", 1, {}),
        ({"prompt": "a b", "max_tokens": 5}, "99", 0, {"max_tokens": 5}),
        ({"prompt": "a b", "max_tokens": 5}, "x", 0, {"max_tokens": 5}),
        ({"prompt": [1, 2], "max_tokens": 5}, "1", 0, {"max_tokens": 5}),
    ],
)
def test_a_resumed_completion_takes_the_answer_so_far_off_its_bounds(
    body: dict[str, Any], resumed: str, produced: int, after: dict[str, Any]
) -> None:
    from types import SimpleNamespace

    from inferd.replica.vllm_routes import VllmRouteHandler

    engine = SimpleNamespace(count_tokens=lambda text: len(text.split()))
    handler = SimpleNamespace(engine=engine)
    assert VllmRouteHandler._resume(handler, body, resumed) == produced  # type: ignore[arg-type]
    assert {k: v for k, v in body.items() if k != "prompt"} == after
