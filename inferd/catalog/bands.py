"""Error bands that hold: each estimate's band is a quantile of the errors
the model made on published figures like it that it was not fitted to.

The rule (split-conformal, absolute relative error as the score): for a band
meant to hold `COVERAGE` of the time, take the held-out errors of the n
figures of the nearest group with at least `MIN_FIGURES` of them; the band is
the ceil((n + 1) x COVERAGE)-th smallest. With few figures that is the largest
or next to largest error seen (the +1 widens a band that rests on little).
Groups, nearest first: the same GPU generation, precision and regime; the
same generation and regime; the same regime; every figure.

"Held out" is leave-one-source-out for a GPU type with figures of its own, and
leave-one-GPU-out (the figures of each GPU type predicted by the fit without
any of them) for a GPU type with none: the error of carrying the model over
to hardware nobody measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

COVERAGE = 0.8
MIN_FIGURES = 4
# What a figure measures, as the regimes the band tells apart.
REGIMES = {
    "first-token": "ttft",
    "served-ttft": "ttft",
    "single-stream": "per-token",
    "served-tpot": "per-token",
    "batch-latency": "per-token",
    "static-batch": "throughput",
    "max-throughput": "throughput",
    "served": "throughput",
    "image": "image",
}
REGIME_ORDER = ("throughput", "per-token", "ttft", "image")


def precision_class(precision: str, scenario: str = "") -> str:
    """16-bit / FP8 / INT4/INT8 (weight-only) for chat; image for images."""
    if scenario == "image" or precision == "image":
        return "image"
    return {"bf16": "16-bit", "fp16": "16-bit", "fp32": "16-bit", "fp8": "FP8"}.get(
        precision, "INT4/INT8"
    )


@dataclass(frozen=True)
class Residual:
    """One figure's held-out error and what it is like."""

    source: str
    gpu: str
    generation: str
    precision: str  # precision_class
    regime: str
    error: float  # (estimate - published) / published

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source, "gpu": self.gpu, "generation": self.generation,
            "precision": self.precision, "regime": self.regime, "error": round(self.error, 4),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Residual:
        return cls(
            str(d["source"]), str(d["gpu"]), str(d["generation"]), str(d["precision"]),
            str(d["regime"]), float(d["error"]),  # type: ignore[arg-type]
        )  # fmt: skip


def conformal_band(errors: Iterable[float], coverage: float = COVERAGE) -> float | None:
    """The ceil((n+1) x coverage)-th smallest absolute error; None when n is
    too small for that rank to exist."""
    values = sorted(abs(e) for e in errors)
    rank = math.ceil((len(values) + 1) * coverage)
    return values[rank - 1] if 0 < rank <= len(values) else None


@dataclass(frozen=True)
class Band:
    value: float
    group: str  # the group of figures it rests on, in words
    figures: int


def _groups(
    generation: str, precision: str, regime: str
) -> list[tuple[str, Callable[[Residual], bool]]]:
    return [
        (f"{generation} {precision} {regime}",
         lambda r: (r.generation, r.precision, r.regime) == (generation, precision, regime)),
        (f"{generation} {regime}", lambda r: (r.generation, r.regime) == (generation, regime)),
        (f"{regime}, every generation", lambda r: r.regime == regime),
        ("every figure", lambda r: True),
    ]  # fmt: skip


def band_for(
    residuals: Sequence[Residual],
    generation: str,
    precision: str,
    regime: str,
    exclude: Callable[[Residual], bool] = lambda r: False,
) -> Band | None:
    """The band of an estimate like (generation, precision, regime), from the
    residuals `exclude` leaves in; None when there are too few in all."""
    pool = [r for r in residuals if not exclude(r)]
    for label, like in _groups(generation, precision, regime):
        errors = [r.error for r in pool if like(r)]
        if len(errors) >= MIN_FIGURES:
            value = conformal_band(errors)
            if value is not None:
                return Band(value, label, len(errors))
    return None


def coverage_by_regime(
    residuals: Sequence[Residual], same: Callable[[Residual, Residual], bool]
) -> dict[str, dict[str, float]]:
    """For every figure, the band from the others' residuals (leaving out all
    that `same` ties to it: its source, or its GPU type) and whether its own
    held-out error falls inside. Per regime: figures, share inside."""
    out: dict[str, list[bool]] = {}
    for r in residuals:
        others = [o for o in residuals if not same(o, r)]
        band = band_for(others, r.generation, r.precision, r.regime)
        inside = band is not None and abs(r.error) <= band.value
        out.setdefault(r.regime, []).append(inside)
    return {
        regime: {"figures": len(v), "coverage": round(sum(v) / len(v), 4)}
        for regime, v in sorted(out.items(), key=lambda kv: _regime_rank(kv[0]))
    }


def _regime_rank(regime: str) -> int:
    return REGIME_ORDER.index(regime) if regime in REGIME_ORDER else len(REGIME_ORDER)
