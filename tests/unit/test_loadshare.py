"""Merging the instances' load reports, as tables."""

from __future__ import annotations

import pytest

from inferd.control.loadshare import (
    ClusterLoad,
    LoadReport,
    LocalLoad,
    as_report,
    max_age,
    merge_load,
    rows_to_publish,
)

NOW = 1000.0
AGE = 3.0


def report(
    instance: str,
    endpoint: str = "e1",
    in_flight: int = 0,
    held: int = 0,
    last: float | None = None,
    at: float = NOW,
) -> LoadReport:
    return LoadReport(instance, endpoint, in_flight, held, last, at)


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        ([], {}),
        (
            [report("a", in_flight=2, held=1, last=990.0), report("b", in_flight=3, last=995.0)],
            {"e1": ClusterLoad("e1", 5, 1, 995.0, 2)},
        ),
        # A stale instance adds no load, but its last request still counts
        # (the retention rule must not forget traffic a dead instance saw).
        (
            [
                report("a", in_flight=1, last=900.0),
                report("b", in_flight=7, held=2, last=996.0, at=NOW - 3.5),
            ],
            {"e1": ClusterLoad("e1", 1, 0, 996.0, 1)},
        ),
        # Exactly max_age old still counts.
        ([report("a", held=1, at=NOW - AGE)], {"e1": ClusterLoad("e1", 0, 1, None, 1)}),
        (
            [report("a", "e1", in_flight=1), report("a", "e2", held=4, last=999.0)],
            {
                "e1": ClusterLoad("e1", 1, 0, None, 1),
                "e2": ClusterLoad("e2", 0, 4, 999.0, 1),
            },
        ),
        # Every report stale: the endpoint is known, with no load.
        ([report("a", in_flight=9, at=NOW - 60)], {"e1": ClusterLoad("e1", 0, 0, None, 0)}),
    ],
)
def test_merge_sums_fresh_reports(
    reports: list[LoadReport], expected: dict[str, ClusterLoad]
) -> None:
    assert merge_load(reports, NOW, AGE) == expected


def test_own_live_numbers_replace_own_published_rows() -> None:
    published = [report("leader", in_flight=5), report("b", in_flight=1)]
    own = [report("leader", in_flight=0, held=2, last=999.5)]
    assert merge_load(published, NOW, AGE, own=own) == {"e1": ClusterLoad("e1", 1, 2, 999.5, 2)}


@pytest.mark.parametrize(("interval", "age"), [(0.2, 3.0), (1.0, 3.0), (1.5, 3.0), (5.0, 10.0)])
def test_max_age(interval: float, age: float) -> None:
    assert max_age(interval) == age


IDLE = LocalLoad("e1", 0, 0, 10.0)
BUSY = LocalLoad("e2", 2, 0, 11.0)
HELD = LocalLoad("e3", 0, 1, 12.0)


@pytest.mark.parametrize(
    ("current", "published", "expected"),
    [
        ({}, {}, []),
        ({"e1": IDLE}, {}, [IDLE]),  # new
        ({"e1": IDLE}, {"e1": IDLE}, []),  # idle, unchanged: left to age out
        ({"e2": BUSY}, {"e2": BUSY}, [BUSY]),  # load: heartbeat
        ({"e3": HELD}, {"e3": HELD}, [HELD]),
        ({"e1": LocalLoad("e1", 0, 0, 20.0)}, {"e1": IDLE}, [LocalLoad("e1", 0, 0, 20.0)]),
    ],
)
def test_rows_to_publish(
    current: dict[str, LocalLoad], published: dict[str, LocalLoad], expected: list[LocalLoad]
) -> None:
    assert rows_to_publish(current, published) == expected


@pytest.mark.parametrize(
    ("load", "expected_last"),
    [(LocalLoad("e1", 1, 0, 95.0), 1995.0), (LocalLoad("e1", 1, 0, None), None)],
)
def test_as_report_moves_times_to_the_database_clock(
    load: LocalLoad, expected_last: float | None
) -> None:
    got = as_report(load, "me", mono_now=100.0, db_now=2000.0)
    assert got == LoadReport("me", "e1", 1, 0, expected_last, 2000.0)
