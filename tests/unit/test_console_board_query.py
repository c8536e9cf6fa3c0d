"""The endpoints board's address: filters and the trail of keyset positions
that makes "previous" possible over forward-only pages."""

from __future__ import annotations

import pytest

from inferd.console.board_query import BadBoardQuery, BoardQuery


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, BoardQuery()),
        ({"name": " Chat ", "status": "running"}, BoardQuery("chat", "running")),
        ({"page": "120"}, BoardQuery(starts=(120,))),
        ({"page": "120.245", "name": "a"}, BoardQuery("a", "", (120, 245))),
        ({"name": "", "status": "", "page": ""}, BoardQuery()),
        (
            {"model": " tiny-chat ", "location": "us-east", "page": "50"},
            BoardQuery(starts=(50,), model="tiny-chat", location="us-east"),
        ),
    ],
)
def test_reads_what_it_writes(params: dict[str, str], expected: BoardQuery) -> None:
    query = BoardQuery.read(params)
    assert query == expected
    assert BoardQuery.read(query.params()) == query


@pytest.mark.parametrize(
    "params",
    [
        {"status": "scaled-to-zero"},
        {"page": "12.x"},
        {"page": "-3"},
        {"page": "1..2"},
        {"page": "40.12"},  # pages start further on, never back
        {"page": "7.7"},
        {"page": "²"},
        {"page": "1." * 5000},
        {"model": "m" * 300},
        {"location": "l" * 300},
    ],
)
def test_refuses_what_it_never_writes(params: dict[str, str]) -> None:
    with pytest.raises(BadBoardQuery):
        BoardQuery.read(params)


def test_next_and_previous_walk_the_trail() -> None:
    first = BoardQuery("ep", "running")
    assert (first.after, first.number, first.previous()) == (None, 1, None)
    second = first.next(50)
    third = second.next(104)
    assert (third.after, third.number, third.starts) == (104, 3, (50, 104))
    assert third.previous() == second and second.previous() == first
    assert third.query_string() == "name=ep&status=running&page=50.104"
    assert first.query_string() == "name=ep&status=running"
    assert BoardQuery().query_string() == ""
    assert first.filtered and not BoardQuery().filtered
    # The model and location filters ride along both ways.
    placed = BoardQuery(model="tiny-chat", location="local").next(50)
    assert placed.query_string() == "model=tiny-chat&location=local&page=50"
    assert placed.previous() == BoardQuery(model="tiny-chat", location="local")
    assert BoardQuery(location="local").filtered
