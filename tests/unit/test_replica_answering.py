"""One request's bookkeeping on the replica: the in-flight slot is held until
the answer is whole or its stream has ended, however it ends, and the request
is reported exactly once with the status it ended with."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from inferd.engines.base import EngineOptions
from inferd.engines.factory import create_engine
from inferd.errors import BadRequest, ServiceUnavailable
from inferd.replica.answering import Answering
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState
from inferd.vocab import ModelKind, ReplicaStatus


def ready() -> tuple[ReplicaState, ReplicaMetrics]:
    engine = create_engine("tiny", ModelKind.CHAT, None, EngineOptions(engine="fake"))  # type: ignore[arg-type]
    state = ReplicaState()
    state.set(ReplicaStatus.READY)
    return state, ReplicaMetrics(engine, state)


def answered(metrics: ReplicaMetrics, route: str, status: int) -> float:
    value = metrics.registry.get_sample_value(
        "inferd_requests_total", {"route": route, "status": str(status)}
    )
    return value or 0.0


def test_a_whole_answer_holds_its_slot_until_the_handler_returns() -> None:
    state, metrics = ready()
    with Answering(state, metrics, "chat") as answer:
        assert state.in_flight == 1
        answer.status = 200
    assert state.in_flight == 0
    assert answered(metrics, "chat", 200) == 1


def test_an_error_is_reported_with_its_own_status() -> None:
    state, metrics = ready()
    with pytest.raises(BadRequest), Answering(state, metrics, "completions"):
        raise BadRequest("no")
    assert state.in_flight == 0
    assert answered(metrics, "completions", 400) == 1


def test_an_unexpected_error_is_a_500() -> None:
    state, metrics = ready()
    with pytest.raises(KeyError), Answering(state, metrics, "chat"):
        raise KeyError("bug")
    assert answered(metrics, "chat", 500) == 1


def test_a_replica_that_is_not_ready_admits_nothing_and_reports_nothing() -> None:
    state, metrics = ready()
    state.set(ReplicaStatus.DRAINING)
    with pytest.raises(ServiceUnavailable):
        Answering(state, metrics, "chat")
    assert state.in_flight == 0
    assert answered(metrics, "chat", 503) == 0


async def drain(events: AsyncIterator[bytes]) -> list[bytes]:
    return [event async for event in events]


def stream_of(*events: bytes, fail: Exception | None = None) -> AsyncIterator[bytes]:
    async def generate() -> AsyncIterator[bytes]:
        for event in events:
            yield event
        if fail is not None:
            raise fail

    return generate()


def test_a_stream_holds_its_slot_until_it_ends_and_closes_once() -> None:
    state, metrics = ready()
    closed: list[str] = []

    async def close() -> None:
        closed.append("closed")
        answer.count(3, 2)

    with Answering(state, metrics, "chat") as answer:
        response = answer.stream(stream_of(b"data: 1\n\n", b"data: 2\n\n"), close)
    assert state.in_flight == 1  # the handler returned; the stream has not run
    assert response.headers["cache-control"] == "no-cache"
    events = asyncio.run(drain(response.body_iterator))  # type: ignore[arg-type]
    assert events == [b"data: 1\n\n", b"data: 2\n\n"]
    assert closed == ["closed"]
    assert state.in_flight == 0
    assert answered(metrics, "chat", 200) == 1
    assert metrics.registry.get_sample_value("inferd_generated_tokens_total") == 2
    assert metrics.registry.get_sample_value("inferd_time_to_first_token_seconds_count") == 1


@pytest.mark.parametrize(
    ("fail", "status", "code"),
    [
        (ServiceUnavailable("engine gone", code="engine_dead"), 503, "engine_dead"),
        (RuntimeError("bug"), 500, "engine_error"),
    ],
)
def test_a_stream_that_fails_after_its_first_byte_says_so_in_band(
    fail: Exception, status: int, code: str
) -> None:
    state, metrics = ready()

    async def close() -> None:
        raise OSError("closing failed too")

    with Answering(state, metrics, "completions") as answer:
        response = answer.stream(stream_of(b"data: 1\n\n", fail=fail), close)
    with pytest.raises(OSError):
        asyncio.run(drain(response.body_iterator))  # type: ignore[arg-type]
    # The slot is freed and the request reported even though close() failed.
    assert state.in_flight == 0
    assert answered(metrics, "completions", status) == 1
    assert answered(metrics, "completions", 200) == 0


def test_the_in_band_error_event_carries_the_error() -> None:
    state, metrics = ready()

    async def close() -> None:
        return None

    with Answering(state, metrics, "chat") as answer:
        response = answer.stream(stream_of(fail=BadRequest("too long", code="too_long")), close)
    events = asyncio.run(drain(response.body_iterator))  # type: ignore[arg-type]
    assert len(events) == 1
    text = events[0].decode() if isinstance(events[0], bytes) else events[0]
    payload = json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])
    assert payload["error"]["code"] == "too_long"
    assert answered(metrics, "chat", 400) == 1


def test_an_engines_refusal_that_escapes_a_handler_is_a_400_naming_the_parameter() -> None:
    """vLLM's own validation error is not a ValueError, so nothing on its way
    up turns it into inferd's; the answering path does, on every route."""
    from pydantic import BaseModel

    from tests.support import require

    require("vllm", "the refusal is vLLM's own exception class")
    from vllm.exceptions import VLLMValidationError

    state, metrics = ready()
    with pytest.raises(BadRequest) as caught, Answering(state, metrics, "completions"):
        raise VLLMValidationError("Either prompt or prompt_embeds is needed", parameter="prompt")
    assert (caught.value.status, caught.value.param) == (400, "prompt")
    assert answered(metrics, "completions", 400) == 1

    class Body(BaseModel):
        n: int

    with pytest.raises(BadRequest) as caught, Answering(state, metrics, "images"):
        Body.model_validate({"n": "many"})
    assert caught.value.param == "n"
    assert state.in_flight == 0


def test_a_refusal_after_the_stream_started_is_an_error_event_with_its_status() -> None:
    from pydantic import BaseModel

    class Body(BaseModel):
        n: int

    async def events() -> AsyncIterator[bytes]:
        yield b"data: {}\n\n"
        Body.model_validate({"n": "many"})

    async def close() -> None:
        pass

    async def read() -> list[bytes]:
        state, metrics = ready()
        with Answering(state, metrics, "chat") as answer:
            response = answer.stream(events(), close)
        chunks = [chunk async for chunk in response.body_iterator]  # type: ignore[union-attr]
        assert answered(metrics, "chat", 400) == 1
        return [c if isinstance(c, bytes) else c.encode() for c in chunks]

    chunks = asyncio.run(read())
    assert b"invalid_request_error" in chunks[-1]
