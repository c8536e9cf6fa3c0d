"""The instances' load reports as the leader reads them, as tables."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from inferd.control.cluster.loadshare import (
    LoadReport,
    LocalLoad,
    max_age,
    remote_samples,
    rows_to_publish,
)
from inferd.control.ports import LoadSample

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


def sample(
    source: str,
    endpoint: str = "e1",
    in_flight: int = 0,
    held: int = 0,
    last: float | None = None,
) -> LoadSample:
    return LoadSample(source, endpoint, in_flight, held, MappingProxyType({}), last, MONO)


MONO = 50.0  # this process's clock when the rows were read (the database's: NOW)


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        ([], []),
        # Its own row is skipped: its live counts are read directly.
        ([report("me", in_flight=9)], []),
        (
            [report("a", in_flight=2, held=1, last=990.0), report("b", in_flight=3, last=995.0)],
            [sample("a", in_flight=2, held=1, last=40.0), sample("b", in_flight=3, last=45.0)],
        ),
        # A stale instance adds no load, but its last request still counts
        # (the retention rule must not forget traffic a dead instance saw).
        (
            [report("b", in_flight=7, held=2, last=996.0, at=NOW - 3.5)],
            [sample("b", last=46.0)],
        ),
        # Exactly max_age old still counts.
        ([report("a", held=1, at=NOW - AGE)], [sample("a", held=1)]),
        (
            [report("a", "e1", in_flight=1), report("a", "e2", held=4, last=999.0)],
            [sample("a", "e1", in_flight=1), sample("a", "e2", held=4, last=49.0)],
        ),
    ],
)
def test_remote_samples_on_this_clock_with_stale_load_dropped(
    reports: list[LoadReport], expected: list[LoadSample]
) -> None:
    assert remote_samples(reports, "me", NOW, MONO, AGE) == expected


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
