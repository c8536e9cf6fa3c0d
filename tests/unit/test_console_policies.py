"""The console's pure parts as tables: scale causes, cost envelopes, the
per-minute series, row versions, roles."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from inferd.console.costs import Envelope, SettingsChange, cost_so_far
from inferd.console.live import LiveBoard
from inferd.console.views import RowView, ids_signature
from inferd.control.metrics.timeseries import EndpointSeries, ReplicaTotals, percentile
from inferd.control.replicas.scale_events import ScaleCause, ScaleJournal, classify


@pytest.mark.parametrize(
    ("reason", "previous", "desired", "cause"),
    [
        ("minReplicas", 0, 1, ScaleCause.MANUAL),
        ("replica bounds changed", 3, 2, ScaleCause.MANUAL),
        ("idle past the retention period", 1, 0, ScaleCause.IDLE),
        (
            "requests waiting with no replica; traffic within the retention period",
            0,
            1,
            ScaleCause.LOAD,
        ),
        ("12 requests at 4 per replica", 1, 3, ScaleCause.LOAD),
        ("2 requests at 4 per replica", 3, 1, ScaleCause.LOAD),
        ("traffic within the retention period", 2, 1, ScaleCause.LOAD),
        ("replica r-1 failed (exit 1); replacing it in 1s", 1, 1, ScaleCause.FAILURE),
    ],
)
def test_scale_cause_from_the_autoscalers_reason(
    reason: str, previous: int, desired: int, cause: ScaleCause
) -> None:
    assert classify(reason, previous, desired) is cause


def test_journal_keeps_the_newest_events_per_endpoint() -> None:
    journal = ScaleJournal(per_endpoint=2, wall=lambda: "2026-01-01T00:00:00Z")
    for desired in (1, 2, 3):
        journal.record("e", desired - 1, desired, "minReplicas")
    assert [e.to_replicas for e in journal.of_endpoint("e")] == [2, 3]
    journal.forget("e")
    assert journal.of_endpoint("e") == []


@pytest.mark.parametrize(
    ("price", "low", "high", "floor_month", "ceiling_hour"),
    [(0.79, 0, 3, 0.0, 2.37), (0.79, 1, 3, 577.095, 2.37), (0.0, 2, 2, 0.0, 0.0)],
)
def test_envelope(
    price: float, low: int, high: int, floor_month: float, ceiling_hour: float
) -> None:
    envelope = Envelope(price, low, high)
    assert envelope.idle_floor_per_month == pytest.approx(floor_month)
    assert envelope.ceiling_per_hour == pytest.approx(ceiling_hour)


def test_settings_change_deltas() -> None:
    change = SettingsChange(Envelope(0.79, 0, 1), Envelope(1.19, 1, 2))
    assert change.price_delta_per_hour == pytest.approx(0.40)
    assert change.floor_delta_per_month == pytest.approx(1.19 * 730.5)
    assert change.ceiling_delta_per_hour == pytest.approx(2.38 - 0.79)
    assert cost_so_far(7200, 0.5) == pytest.approx(1.0)


def test_series_per_minute_from_requests_and_samples() -> None:
    series = EndpointSeries()
    t0 = 1_800_000_000.0  # a multiple of 60
    for i, latency in enumerate((0.1, 0.2, 0.3, 0.4)):
        series.observe_request("e", latency, 200 if i else 503, t0 + i)
    series.sample("e", held=2, replicas=1, totals=[ReplicaTotals("r1", 100, 0)], now=t0)
    series.sample("e", held=0, replicas=1, totals=[ReplicaTotals("r1", 700, 0)], now=t0 + 30)
    series.sample(
        "e",
        held=0,
        replicas=2,
        totals=[ReplicaTotals("r1", 700, 0), ReplicaTotals("r2", 60, 0)],
        now=t0 + 90,
    )
    points = series.points("e", 180, 60, t0 + 90)
    assert [p.start for p in points] == [t0 - 60, t0, t0 + 60]
    first, second = points[1], points[2]
    assert (first.requests, first.errors, first.held, first.replicas) == (4, 1, 2, 1)
    assert (first.p50, first.p99) == (0.2, 0.4)
    assert first.tokens_per_s == pytest.approx(700 / 60)  # the first totals count from zero
    assert second.tokens_per_s == pytest.approx(60 / 60) and second.replicas == 2
    assert series.replica_seconds("e") == pytest.approx(30 + 2 * 60)
    assert series.totals("e").requests == 4 and series.totals("e").tokens == 760
    # A replica that restarted its count is not a negative rate.
    series.sample("e", held=0, replicas=1, totals=[ReplicaTotals("r1", 5, 0)], now=t0 + 100)
    assert series.points("e", 60, 60, t0 + 100)[0].tokens_per_s >= 0
    day = series.points("e", 86400, 900, t0 + 100)
    assert len(day) == 96 and sum(p.requests for p in day) == 4


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0


def _view(endpoint_id: str, status: str = "running", now: int = 1) -> RowView:
    return RowView(endpoint_id, f"n-{endpoint_id}", "default", "tiny-chat", "cpu", 1, "local",
                   status, None, now, 0, 2, 0.5, now * 0.5, 0.0, "USD")  # fmt: skip


def test_live_rows_answer_only_what_changed() -> None:
    views = {"a": _view("a"), "b": _view("b")}
    live = LiveBoard(views.get, lambda: list(views))
    live.update(views.values())
    since = live.version
    assert live.changed_since(since) == []
    views["b"] = _view("b", "initializing")
    live.mark("b")
    live.refresh_marked()
    assert [v.id for v in live.changed_since(since) or []] == ["b"]
    assert live.changed_since(live.version) == []
    # A row changed twice is sent once, as it is now.
    views["b"] = _view("b", "running", now=2)
    live.mark("b")
    live.refresh_marked()
    assert live.changed_since(since) == [views["b"]]
    assert ids_signature(["a", "b"]) != ids_signature(["b", "a"])


def test_live_board_sweep_finds_changes_made_elsewhere_and_rows_gone() -> None:
    views = {i: _view(i) for i in ("a", "b", "c")}
    live = LiveBoard(views.get, lambda: list(views), chunk=2)
    asyncio.run(live.sweep())
    since = live.version
    views["c"] = _view("c", "failed")  # unmarked: only the sweep sees it
    assert live.changed_since(since) == []
    asyncio.run(live.sweep())
    assert live.changed_since(since) == [views["c"]]
    # A row gone (or one new) changes the set: the browser needs the whole body.
    since = live.version
    del views["a"]
    asyncio.run(live.sweep())
    assert live.changed_since(since) is None and live.version_of("a") == 0
    since = live.version
    views["d"] = _view("d")
    live.mark("d")
    live.refresh_marked()
    assert live.changed_since(since) is None


def test_live_board_log_is_bounded_and_old_versions_get_the_whole_body() -> None:
    views = {"a": _view("a")}
    live = LiveBoard(views.get, lambda: list(views))
    live.put(views["a"])
    first = live.version
    for n in range(2000):
        views["a"] = _view("a", now=n + 2)
        live.put(views["a"])
    assert live.changed_since(first) is None  # older than the log keeps
    assert live.changed_since(live.version + 5) is None  # a page from before a restart
    assert live.changed_since(live.version - 1) == [views["a"]]


def test_live_board_sweeps_only_while_watched() -> None:
    views = {"a": _view("a")}
    now = [0.0]
    live = LiveBoard(views.get, lambda: list(views), clock=lambda: now[0], sweep_period_s=0.01,
                     watch_s=5.0)  # fmt: skip

    async def until(check: Callable[[], bool]) -> bool:
        for _ in range(500):  # bounded: 5 s on the slowest box
            if check():
                return True
            await asyncio.sleep(0.01)
        return False

    async def body() -> None:
        live.watch()
        assert await until(lambda: live.version_of("a") > 0)  # swept while watched
        now[0] = 10.0  # nobody polled for longer than watch_s
        assert await until(lambda: live._sweeper is not None and live._sweeper.done())
        live.watch()  # a poll starts it again
        assert not live._sweeper.done()
        await live.close()

    asyncio.run(body())
