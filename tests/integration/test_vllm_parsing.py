"""inferd's requests through vLLM's own request model and parsers, without an
engine: tiny-chat's tokenizer, vLLM's `hermes` tool parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferd.engines.base import ChatMessage, SamplingOptions, TextRequest, ToolOptions
from inferd.errors import BadRequest
from tests.support import needs

pytestmark = needs("vllm")

TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
)
ASK = (ChatMessage("user", "Weather in Paris?"),)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tiny_chat_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_chat_dir))


def parsing(tokenizer: Any, tools: ToolOptions | None, parser: str | None = "hermes") -> Any:
    from inferd.engines import vllm_parsing

    cls = vllm_parsing.parser_class(parser, None, "tiny-chat", tokenizer)
    request = TextRequest("r1", ASK, SamplingOptions(), tools=tools, stream=False)
    return vllm_parsing.request_parsing(request, cls, tokenizer, None, "tiny-chat")


def test_plain_requests_take_the_fast_path(tokenizer: Any) -> None:
    assert parsing(tokenizer, None) is None
    assert parsing(tokenizer, ToolOptions(TOOLS, choice="none")) is None


def test_auto_finds_the_hermes_call_in_the_text(tokenizer: Any) -> None:
    p = parsing(tokenizer, ToolOptions(TOOLS))
    content, reasoning, calls = p.whole("Let me check. " + CALL, [])
    assert (content.strip(), reasoning) == ("Let me check.", "")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0].id and p.finish_reason("stop", True) == "tool_calls"
    assert p.finish_reason("length", True) == "length"


def test_streamed_pieces_add_up_to_the_call(tokenizer: Any) -> None:
    p = parsing(tokenizer, ToolOptions(TOOLS))
    pieces = [CALL[i : i + 7] for i in range(0, len(CALL), 7)]
    name, arguments = "", ""
    for i, piece in enumerate(pieces):
        ids = tokenizer.encode(piece, add_special_tokens=False)
        _, _, calls = p.delta(piece, ids, [], finished=i == len(pieces) - 1)
        for call in calls:
            name += call.name or ""
            arguments += call.arguments
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}


def test_a_named_function_is_constrained_and_ends_with_stop(tokenizer: Any) -> None:
    p = parsing(tokenizer, ToolOptions(TOOLS, choice="get_weather", named=True))
    assert p.structured_outputs() is not None  # vLLM's grammar for the call
    assert p.finish_reason("stop", True) == "stop"


def test_tools_without_a_parser_is_a_400_naming_the_setting(tokenizer: Any) -> None:
    for tools in (ToolOptions(TOOLS), ToolOptions(TOOLS, choice="required")):
        with pytest.raises(BadRequest, match="toolCallParser") as caught:
            parsing(tokenizer, tools, parser=None)
        assert caught.value.param == "tool_choice"


def test_vllm_validates_what_it_validates(tokenizer: Any) -> None:
    bad = ToolOptions(TOOLS, choice="get_time", named=True)
    with pytest.raises(BadRequest, match="tool_choice"):
        parsing(tokenizer, bad)
