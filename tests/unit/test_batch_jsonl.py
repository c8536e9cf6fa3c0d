"""The Batch API's input file, checked line by line: what is refused, with
which line named, and what is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferd.control.batches.jsonl import MAX_REPORTED, parse_batch_file
from inferd.errors import BadRequest

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", url: str = CHAT, **changes: Any) -> str:
    data: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]},
    }
    data.update(changes)
    return json.dumps({k: v for k, v in data.items() if v is not ...})


def test_a_good_file_gives_each_request_in_order() -> None:
    content = "\n".join(line(f"r{i}") for i in range(3)) + "\n"
    lines = parse_batch_file(content.encode(), max_lines=10)
    assert [x.custom_id for x in lines] == ["r0", "r1", "r2"]
    assert {x.url for x in lines} == {CHAT}
    assert json.loads(lines[0].body)["model"] == "tiny-chat"


def test_crlf_line_ends_and_no_final_newline_are_accepted() -> None:
    content = line("a") + "\r\n" + line("b")
    assert [x.custom_id for x in parse_batch_file(content.encode(), 10)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{not json", "line 1: is not JSON"),
        ("[1, 2]", "line 1: is not a JSON object"),
        (line(custom_id=...), "line 1: custom_id must be a non-empty string"),
        (line(custom_id=""), "line 1: custom_id must be a non-empty string"),
        (line(custom_id="x" * 513), "custom_id is longer than 512"),
        (line(method="GET"), "line 1: method must be 'POST'"),
        (line(url="/v1/images/generations"), "line 1: url must be one of"),
        (line(body=[1]), "line 1: body must be a JSON object"),
        (line(body={"stream": True}), "line 1: body.stream must be false"),
        (line(extra=1), "line 1: unknown fields ['extra']"),
        (line("a") + "\n" + line("a"), "line 2: custom_id 'a' is used by an earlier line"),
        (line("a") + "\n\n" + line("b"), "line 2: is empty"),
        (line("a") + "\n" + line("b", url="/v1/completions"), "the same url"),
        ("", "the file has no lines"),
        ("\n", "line 1: is empty"),
    ],
)
def test_a_bad_file_is_refused_naming_the_line(text: str, said: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_batch_file(text.encode(), max_lines=10)
    assert said in refused.value.message
    assert refused.value.status == 400 and refused.value.param == "file"


def test_not_utf8_and_too_many_lines_are_refused() -> None:
    with pytest.raises(BadRequest, match="not UTF-8"):
        parse_batch_file(b"\xff\xfe" + line().encode(), 10)
    content = "\n".join(line(f"r{i}") for i in range(4))
    with pytest.raises(BadRequest, match="4 lines; a batch takes at most 3"):
        parse_batch_file(content.encode(), 3)


def test_several_bad_lines_are_each_named_up_to_a_bound() -> None:
    content = "\n".join(["{bad"] * (MAX_REPORTED + 5))
    with pytest.raises(BadRequest) as refused:
        parse_batch_file(content.encode(), 100)
    message = refused.value.message
    assert f"line {MAX_REPORTED}:" in message and f"line {MAX_REPORTED + 1}:" not in message
    assert "and perhaps more" in message
