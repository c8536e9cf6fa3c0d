"""Tool calling, logprobs and reasoning through a real replica on tiny-chat,
with vLLM's own `hermes` tool parser and `deepseek_r1` reasoning parser,
called with the official `openai` client (whose types validate the answers).

tiny-chat's weights are random, so a call is made for real only where vLLM
constrains the output: a named function or `required` (vLLM's structural
tag for the Hermes format), or a regex in `auto` mode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from inferd.testing import WEATHER_TOOL, ReplicaHandle
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow]

TOOLS: list[Any] = [
    WEATHER_TOOL,
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        },
    },
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
# A Hermes-format call, forced by a regex, for tool_choice "auto".
HERMES_CALL = r'<tool_call>\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}</tool_call>'
THINK_END_TOKEN = "</think>"


def client(replica: ReplicaHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{replica.url}/openai/v1", api_key="unused", max_retries=0)


def streamed_calls(chunks: list[Any]) -> tuple[dict[int, dict[str, str]], str | None]:
    """Tool calls put together from stream deltas, and the finish reason."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                if piece.id:
                    assert not call["id"], "a call's id comes once, with its first piece"
                    call["id"] = piece.id
                if piece.function and piece.function.name:
                    call["name"] += piece.function.name
                if piece.function and piece.function.arguments:
                    call["arguments"] += piece.function.arguments
    return calls, finish


def test_named_function_is_called(vllm_replica: ReplicaHandle) -> None:
    completion = client(vllm_replica).chat.completions.create(
        model="tiny-chat", messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=150
    )
    choice = completion.choices[0]
    assert choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    # OpenAI's rule, kept by vLLM: a named function's call ends with "stop".
    assert choice.finish_reason == "stop"
    assert choice.message.content is None


def test_required_calls_a_tool_streamed_and_not(vllm_replica: ReplicaHandle) -> None:
    openai_client = client(vllm_replica)
    whole = openai_client.chat.completions.create(
        model="tiny-chat", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=150
    )
    assert whole.choices[0].finish_reason == "tool_calls"
    names = {c.function.name for c in whole.choices[0].message.tool_calls or ()}
    assert names and names <= {"get_weather", "get_time"}
    chunks = list(
        openai_client.chat.completions.create(
            model="tiny-chat",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=150,
            stream=True,
        )
    )
    calls, finish = streamed_calls(chunks)
    assert finish == "tool_calls" and calls
    assert all(
        call["id"] and call["name"] in {"get_weather", "get_time"} for call in calls.values()
    )


def test_auto_parses_a_hermes_call_out_of_the_text(vllm_replica: ReplicaHandle) -> None:
    body: dict[str, Any] = {"structured_outputs": {"regex": HERMES_CALL}}
    openai_client = client(vllm_replica)
    whole = openai_client.chat.completions.create(
        model="tiny-chat", messages=ASK, tools=TOOLS, max_tokens=60, extra_body=body
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("get_time", '{"zone": "UTC"}')
    chunks = list(
        openai_client.chat.completions.create(
            model="tiny-chat",
            messages=ASK,
            tools=TOOLS,
            max_tokens=60,
            extra_body=body,
            stream=True,
        )
    )
    calls, finish = streamed_calls(chunks)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("get_time", '{"zone": "UTC"}')
    ]


def test_tool_choice_none_answers_in_text(vllm_replica: ReplicaHandle) -> None:
    completion = client(vllm_replica).chat.completions.create(
        model="tiny-chat", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content


def test_conversation_with_calls_and_results_is_accepted(vllm_replica: ReplicaHandle) -> None:
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
    ]
    plain = client(vllm_replica).chat.completions.create(
        model="tiny-chat", messages=ASK, tools=TOOLS, max_tokens=4
    )
    completion = client(vllm_replica).chat.completions.create(
        model="tiny-chat", messages=history, tools=TOOLS, max_tokens=4
    )
    assert completion.usage and plain.usage
    # The call and its result are in the prompt the template rendered.
    assert completion.usage.prompt_tokens > plain.usage.prompt_tokens + 20


def test_parallel_tool_calls_false_keeps_one_call(vllm_replica: ReplicaHandle) -> None:
    completion = client(vllm_replica).chat.completions.create(
        model="tiny-chat",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
    )
    assert len(completion.choices[0].message.tool_calls or ()) == 1


def test_logprobs_streamed_and_not(vllm_replica: ReplicaHandle) -> None:
    openai_client = client(vllm_replica)
    whole = openai_client.chat.completions.create(
        model="tiny-chat", messages=ASK, max_tokens=5, logprobs=True, top_logprobs=3, seed=1
    )
    content = whole.choices[0].logprobs and whole.choices[0].logprobs.content
    assert content and len(content) == 5
    assert all(len(step.top_logprobs) == 3 and step.logprob <= 0 for step in content)
    assert "".join(step.token for step in content) == whole.choices[0].message.content
    chunks = list(
        openai_client.chat.completions.create(
            model="tiny-chat",
            messages=ASK,
            max_tokens=5,
            logprobs=True,
            top_logprobs=2,
            seed=1,
            stream=True,
        )
    )
    steps = [
        s for c in chunks for ch in c.choices if ch.logprobs for s in ch.logprobs.content or ()
    ]
    assert len(steps) == 5 and all(len(s.top_logprobs) == 2 for s in steps)


def test_over_the_logprobs_limit_is_a_400_naming_it(vllm_replica: ReplicaHandle) -> None:
    response = httpx.post(
        f"{vllm_replica.url}/openai/v1/chat/completions",
        json={"messages": ASK, "logprobs": True, "top_logprobs": 21, "max_tokens": 2},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "top_logprobs" and "20" in error["message"]


@pytest.fixture(scope="module")
def no_parser_replica(tiny_chat_dir: Any) -> Iterator[ReplicaHandle]:
    """tiny-chat with no tool parser, and vLLM's deepseek_r1 reasoning parser."""
    handle = ReplicaHandle(
        str(tiny_chat_dir),
        [
            *("--engine", "vllm", "--device", "cpu", "--served-model-name", "tiny-chat"),
            *("--reasoning-parser", "deepseek_r1", "--no-warmup"),
        ],
    )
    try:
        yield handle.wait_ready(timeout=300)
    finally:
        handle.stop()


def test_no_parser_configured_is_a_400_naming_the_setting(
    no_parser_replica: ReplicaHandle,
) -> None:
    for tool_choice in ("auto", "required", NAMED):
        response = httpx.post(
            f"{no_parser_replica.url}/openai/v1/chat/completions",
            json={"messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 2},
            timeout=30,
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert "toolCallParser" in error["message"] and error["param"] == "tool_choice"


def test_reasoning_content_from_the_reasoning_parser(
    no_parser_replica: ReplicaHandle, tiny_chat_dir: Any
) -> None:
    # R1's format: everything before </think> is reasoning. Keep the random
    # model from ever writing </think>: all it writes is then reasoning.
    from transformers import AutoTokenizer

    end_id = AutoTokenizer.from_pretrained(str(tiny_chat_dir)).convert_tokens_to_ids(
        THINK_END_TOKEN
    )
    body: dict[str, Any] = {"ignore_eos": True, "logit_bias": {str(end_id): -100}}
    openai_client = client(no_parser_replica)
    whole = openai_client.chat.completions.create(
        model="tiny-chat", messages=ASK, max_tokens=6, extra_body=body
    )
    message = whole.choices[0].message.model_dump()
    assert message["reasoning_content"] and not message["content"]
    chunks = list(
        openai_client.chat.completions.create(
            model="tiny-chat", messages=ASK, max_tokens=6, extra_body=body, stream=True
        )
    )
    deltas = [ch.delta.model_dump() for c in chunks for ch in c.choices]
    assert "".join(d.get("reasoning_content") or "" for d in deltas)
    assert not "".join(d.get("content") or "" for d in deltas)
