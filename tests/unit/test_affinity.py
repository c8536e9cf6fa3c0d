"""Prompt prefixes hashed in blocks without a tokenizer, and the bounded
table of where they were sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from inferd.gateway.affinity import PrefixTable, request_prefix, requested_model

BLOCK = 64


def body(messages: list[dict[str, str]], **extra: object) -> bytes:
    return json.dumps({"model": "base", "messages": messages, **extra}).encode()


SYSTEM = {"role": "system", "content": "You answer questions about the weather. " * 10}
TURN1 = [SYSTEM, {"role": "user", "content": "What is the weather in Paris tomorrow?"}]
TURN2 = [
    *TURN1,
    {"role": "assistant", "content": "Sunny, 21 degrees, light wind from the west."},
    {"role": "user", "content": "And the day after?"},
]


def prefix(data: bytes, endpoint: str = "ep", base: str = "base"):  # type: ignore[no-untyped-def]
    return request_prefix(data, endpoint, base_model=base, block_bytes=BLOCK, max_blocks=64)


def test_next_turn_extends_the_previous_turns_blocks() -> None:
    one, two = prefix(body(TURN1)), prefix(body(TURN2))
    assert one.home is not None and one.home == two.home
    assert len(two.blocks) > len(one.blocks) > 5
    # All but the last block of turn 1 (which runs into the end of the body)
    # are blocks of turn 2.
    assert one.blocks[:-1] == two.blocks[: len(one.blocks) - 1]


def test_keys_before_the_prompt_do_not_change_it() -> None:
    plain = prefix(body(TURN1))
    other = prefix(json.dumps({"stream": True, "max_tokens": 9, "messages": TURN1}).encode())
    assert other.home == plain.home
    assert other.blocks[:-1] == plain.blocks[: len(other.blocks) - 1]


@pytest.mark.parametrize(("endpoint", "model"), [("other-endpoint", "base"), ("ep", "sql-adapter")])
def test_endpoint_and_adapter_change_every_hash(endpoint: str, model: str) -> None:
    plain = prefix(body(TURN1))
    data = json.dumps({"model": model, "messages": TURN1}).encode()
    other = prefix(data, endpoint=endpoint)
    assert other.home != plain.home
    assert not set(other.blocks) & set(plain.blocks)


def test_adapter_is_the_model_when_not_the_base_model() -> None:
    assert prefix(body(TURN1)).adapter is None
    assert prefix(json.dumps({"messages": TURN1, "model": "sql"}).encode()).adapter == "sql"
    assert prefix(json.dumps({"messages": TURN1}).encode()).adapter is None


def test_short_prompt_has_no_home() -> None:
    short = prefix(body([{"role": "user", "content": "hi"}]))
    assert short.home is None and short.blocks == ()


def test_completion_prompt_is_hashed_too() -> None:
    data = json.dumps({"model": "base", "prompt": "Once upon a time " * 20}).encode()
    assert prefix(data).home is not None


def test_blocks_are_capped() -> None:
    data = body([{"role": "user", "content": "x" * 100_000}])
    got = request_prefix(data, "ep", base_model="base", block_bytes=512, max_blocks=8)
    assert len(got.blocks) == 8


@pytest.mark.parametrize(
    ("data", "model"),
    [
        (b'{"model": "a\\"b", "messages": []}', 'a\\"b'),
        (b'{"messages": [], "model":"tail"}', "tail"),
        (b'{"messages": []}', None),
        (b'{"model": 3}', None),
    ],
)
def test_requested_model(data: bytes, model: str | None) -> None:
    assert requested_model(data) == model


def test_hashes_agree_across_processes() -> None:
    """Two `inferd serve` processes must compute the same keys: Python's own
    `hash()` is salted per process; what we use must not be."""
    here = prefix(body(TURN2))
    code = (
        "import json,sys;from inferd.gateway.affinity import request_prefix;"
        "p=request_prefix(sys.stdin.buffer.read(),'ep',base_model='base',"
        f"block_bytes={BLOCK},max_blocks=64);print(json.dumps([p.home,list(p.blocks)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=body(TURN2),
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    home, blocks = json.loads(out.stdout)
    assert (home, tuple(blocks)) == (here.home, here.blocks)


def everyone() -> set[str]:
    return {"a", "b", "c", "d"}


def test_table_finds_the_longest_known_prefix() -> None:
    table = PrefixTable(100)
    table.record([1, 2], "a", everyone)
    table.record([1, 2, 3, 4], "b", everyone)
    assert table.lookup([1, 2, 3, 4, 5]) == "b"
    assert table.lookup([1, 2, 9]) == "a"  # blocks 1 and 2 went to a first
    assert table.lookup([7, 8]) is None


def test_a_prefix_stays_where_it_first_went_while_that_replica_serves() -> None:
    table = PrefixTable(100)
    asked: list[str] = []

    def serving() -> set[str]:
        asked.append("asked")
        return {"a", "b"}

    table.record([1, 2], "a", serving)
    table.record([1, 2], "a", serving)
    assert asked == []  # nothing placed elsewhere: the directory is not asked
    table.record([1, 2, 3], "b", serving)  # spilled to b by the load bound
    assert asked == ["asked"]  # once per request, however many blocks
    assert table.lookup([1, 2, 9]) == "a"  # a new conversation: still a
    assert table.lookup([1, 2, 3]) == "b"  # the spilled one follows its own blocks
    table.record([1, 2, 3, 4], "c", lambda: {"b", "c"})  # a stopped serving
    assert table.lookup([1, 2, 9]) == "c"  # a's blocks moved
    assert table.lookup([1, 2, 3]) == "b"  # b's stayed


def test_table_is_bounded_and_evicts_least_recently_used() -> None:
    table = PrefixTable(4)
    table.record([1, 2], "a", everyone)
    table.record([3, 4], "b", everyone)
    assert table.lookup([1]) == "a"  # 1 is now the most recently used
    table.record([5], "c", everyone)
    assert len(table) == 4
    assert table.lookup([2]) is None  # the oldest went
    assert table.lookup([1]) == "a"
    table.record(range(100, 200), "d", everyone)
    assert len(table) == 4


def test_table_refuses_no_room() -> None:
    with pytest.raises(ValueError):
        PrefixTable(0)
