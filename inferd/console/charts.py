"""Small line charts as server-rendered SVG geometry (no chart library, no
script): the template draws polylines from these points."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inferd.control.metrics.timeseries import Point
from inferd.vocab import ModelKind

WIDTH = 320
HEIGHT = 80


@dataclass(frozen=True)
class Line:
    label: str
    points: str  # SVG polyline "x,y x,y ..."
    css: str  # class that colours it


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    peak: float  # top of the y axis
    last: float | None
    lines: tuple[Line, ...]
    test_id: str
    # The time axis: bucket starts at the left, the middle and the right
    # ("HH:MM" UTC), and whether anything was recorded in the range at all.
    ticks: tuple[str, ...] = ()
    has_data: bool = False


def _polyline(values: Sequence[float], peak: float) -> str:
    if not values:
        return ""
    step = WIDTH / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{HEIGHT - (v / peak * (HEIGHT - 4) if peak else 0) - 2:.1f}"
        for i, v in enumerate(values)
    )


def _clock(epoch: int) -> str:
    return time.strftime("%H:%M", time.gmtime(epoch))


def _ticks(points: Sequence[Point]) -> tuple[str, ...]:
    if not points:
        return ()
    end = points[-1].start + points[-1].seconds
    middle = points[len(points) // 2].start
    return (_clock(points[0].start), _clock(middle), _clock(end) + " UTC")


def chart(
    title: str,
    unit: str,
    test_id: str,
    points: Sequence[Point],
    series: Sequence[tuple[str, str, Callable[[Point], float | None]]],
) -> Chart:
    columns = [[get(p) or 0.0 for p in points] for _, _, get in series]
    peak = max((v for column in columns for v in column), default=0.0)
    first = series[0][2]
    last = first(points[-1]) if points else None
    return Chart(
        ticks=_ticks(points),
        has_data=any(p.requests or p.errors or p.replicas or p.held for p in points),
        title=title,
        unit=unit,
        peak=peak,
        last=last,
        lines=tuple(
            Line(label, _polyline(column, peak or 1.0), css)
            for (label, css, _), column in zip(series, columns, strict=True)
        ),
        test_id=test_id,
    )


def endpoint_charts(points: Sequence[Point], kind: str) -> list[Chart]:
    minutes = points[0].seconds / 60 if points else 1
    output: tuple[str, str, Callable[[Point], float | None]] = (
        ("images/s", "c1", lambda p: p.images_per_s)
        if kind == ModelKind.IMAGE
        else ("tokens/s", "c1", lambda p: p.tokens_per_s)
    )
    return [
        chart(
            "Requests",
            f"per {minutes:g} min",
            "chart-requests",
            points,
            [("requests", "c1", lambda p: p.requests), ("errors", "c3", lambda p: p.errors)],
        ),
        chart(
            "Latency",
            "seconds",
            "chart-latency",
            points,
            [
                ("p50", "c1", lambda p: p.p50),
                ("p95", "c2", lambda p: p.p95),
                ("p99", "c3", lambda p: p.p99),
            ],
        ),
        chart(output[0].capitalize(), output[0], "chart-output", points, [output]),
        chart("Held requests", "max", "chart-held", points, [("held", "c2", lambda p: p.held)]),
        chart(
            "Replicas", "max", "chart-replicas", points, [("replicas", "c1", lambda p: p.replicas)]
        ),
    ]
