"""The performance model's parameters, fitted to published measurements,
and how well the fit predicts measurements it was not fitted to.

`published()` reads `data/published.yaml` (one row per published figure).
`fit(rows)` finds the `perfmodel` parameters that minimise the squared log
error over the rows plus a weak pull towards the prior (log-normal, sigma
`PRIOR_SIGMA`), so that a parameter no row constrains keeps its prior value
instead of wandering. Levenberg-Marquardt in log-parameter space, in plain
Python: a dozen parameters and fifty rows need no numerical library.

`leave_one_source_out(rows)` fits once per source without that source's rows
and predicts them: the error a new source's figures should expect.
`leave_one_gpu_out(rows, gpu)` does the same for every figure of one GPU
type: the error of an estimate for a GPU type nobody has measured.
`data/fitted.json` holds the full fit and those tables; the recommender reads
it, and `scripts/recommendation_table.py` rebuilds it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import yaml

from inferd.catalog.bands import (
    COVERAGE,
    REGIMES,
    Residual,
    band_for,
    coverage_by_regime,
    precision_class,
)
from inferd.catalog.gpus import GpuCatalog, GpuType
from inferd.catalog.models import (
    CatalogError,
    ChatArchitecture,
    Entry,
    ModelCatalog,
    ModelSpec,
    chat_architecture,
)
from inferd.catalog.perfmodel import (
    PARAMETER_NAMES,
    PRIOR,
    Parameters,
    Precision,
    engine_traits,
    for_engine,
    image_seconds,
    kv_capacity_tokens,
    loaded_step,
    prefill_seconds,
    step_seconds,
)


class CatalogView(Protocol):
    """What the fit reads of a `Catalog` (the package imports this module
    through `recommend`, so the fit cannot import the package back)."""

    @property
    def gpus(self) -> GpuCatalog: ...

    @property
    def models(self) -> ModelCatalog: ...


DATA = Path(__file__).resolve().parent / "data"
PUBLISHED = DATA / "published.yaml"
FITTED = DATA / "fitted.json"
PRIOR_SIGMA = 1.0  # one standard deviation: a factor of e = 2.7 from the prior
REFIT_SIGMA = 5.0
# Held-out median absolute error goals: every source held out (overall, and
# each source), every GPU type held out (the error of a GPU nobody measured).
MEDIAN_ERROR_GOAL = 0.10
SOURCE_ERROR_GOAL = 0.25
GPU_HELD_OUT_GOAL = 0.15
SCENARIOS = (
    "static-batch", "max-throughput", "single-stream", "first-token", "batch-latency",
    "served", "served-tpot", "served-ttft", "image",
)  # fmt: skip


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    address: str


@dataclass(frozen=True)
class Row:
    source: str
    model: str
    stated_model: str
    gpu: str
    gpus: int
    precision: str
    engine: str
    scenario: str
    value: float
    stated: str
    input: int = 0
    output: int = 0
    batch: int | None = None
    steps: int = 0
    kv_cache: str = "auto"
    per_gpu: bool = False
    compiled: bool = False
    max_batch: int = 256
    token_budget: int = 8192
    kv_fraction: float = 0.9
    chunked_prefill: bool | None = None  # None: the engine's default

    @property
    def chunked(self) -> bool:
        """Whether prompt chunks ride in decode steps (else prefill and decode add up)."""
        if self.chunked_prefill is not None:
            return self.chunked_prefill
        return engine_traits(self.engine).chunked_prefill

    @property
    def regime(self) -> str:
        return REGIMES[self.scenario]

    @property
    def precision_obj(self) -> Precision:
        return Precision(self.precision, self.kv_cache)

    @property
    def unit(self) -> str:
        return {
            "first-token": "ms",
            "batch-latency": "ms",
            "served-tpot": "ms",
            "served-ttft": "ms",
            "image": "s/image",
        }.get(self.scenario, "tokens/s")

    def setting(self) -> str:
        """The measured setting, in words."""
        if self.scenario == "image":
            return f"{self.steps} steps, batch {self.batch}" + (
                ", compiled" if self.compiled else ""
            )
        batch = "engine's choice" if self.batch is None else str(self.batch)
        return f"{self.scenario}, in {self.input} / out {self.output}, batch {batch}"


@dataclass(frozen=True)
class Dataset:
    sources: Mapping[str, Source]
    rows: tuple[Row, ...]
    architectures: Mapping[str, ChatArchitecture] = field(default_factory=dict)


def published(path: Path = PUBLISHED) -> Dataset:
    data = yaml.safe_load(path.read_text())
    sources = {
        key: Source(key, str(s["title"]), str(s["address"])) for key, s in data["sources"].items()
    }
    archs = {
        name: chat_architecture(Entry(a, f"{path}: architectures.{name}"))
        for name, a in (data.get("architectures") or {}).items()
    }
    rows = []
    for i, r in enumerate(data["rows"]):
        where = f"{path}: rows[{i}]"
        if r["source"] not in sources:
            raise CatalogError(f"{where}: unknown source {r['source']!r}")
        if r["scenario"] not in SCENARIOS:
            raise CatalogError(f"{where}: unknown scenario {r['scenario']!r}")
        rows.append(Row(
            source=r["source"], model=r["model"], stated_model=str(r["statedModel"]),
            gpu=r["gpu"], gpus=int(r["gpus"]), precision=r["precision"], engine=str(r["engine"]),
            scenario=r["scenario"], value=float(r["value"]), stated=str(r["stated"]),
            input=int(r.get("input", 0)), output=int(r.get("output", 0)),
            batch=r.get("batch"), steps=int(r.get("steps", 0)),
            kv_cache=r.get("kvCache", "auto"), per_gpu=bool(r.get("perGpu", False)),
            compiled=bool(r.get("compiled", False)), max_batch=int(r.get("maxBatch", 256)),
            token_budget=int(r.get("tokenBudget", 8192)),
            kv_fraction=float(r.get("kvFraction", 0.9)),
            chunked_prefill=r.get("chunkedPrefill"),
        ))  # fmt: skip
    return Dataset(MappingProxyType(sources), tuple(rows), MappingProxyType(archs))


# --- predicting one row ------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What predicting a row needs besides the parameters."""

    catalog: CatalogView
    architectures: Mapping[str, ChatArchitecture]

    def gpu(self, name: str) -> GpuType:
        return self.catalog.gpus.gpu_type(name)

    def chat(self, name: str) -> ChatArchitecture:
        if name in self.architectures:
            return self.architectures[name]
        return self.catalog.models.get(name).chat

    def image_model(self, name: str) -> ModelSpec:
        return self.catalog.models.get(name)


def predict(params: Parameters, row: Row, ctx: Context) -> float:
    params = for_engine(params, row.engine)
    gpu = ctx.gpu(row.gpu)
    if row.scenario == "image":
        spec = ctx.image_model(row.model)
        return image_seconds(params, spec.image, gpu, row.batch or 1, row.steps, 1.0, row.compiled)
    arch, prec, n = ctx.chat(row.model), row.precision_obj, row.gpus
    p, o = row.input, row.output
    if row.scenario == "first-token":
        return 1000 * prefill_seconds(params, arch, prec, gpu, n, p)
    if row.scenario == "single-stream":
        ttft = prefill_seconds(params, arch, prec, gpu, n, p)
        step = step_seconds(params, arch, prec, gpu, n, 1, p + o / 2)
        return o / (ttft + o * step)
    batch = row.batch or 1
    if row.scenario in ("served", "served-tpot", "served-ttft"):  # `batch` kept in flight
        served = loaded_step(params, arch, prec, gpu, n, batch, p, o, row.token_budget, row.chunked)
        if row.scenario == "served":
            return served.output_tokens_per_s
        return 1000 * (served.step_s if row.scenario == "served-tpot" else served.ttft_s)
    if row.scenario in ("static-batch", "batch-latency"):
        seconds = prefill_seconds(params, arch, prec, gpu, n, p, batch) + o * step_seconds(
            params, arch, prec, gpu, n, batch, p + o / 2
        )
        if row.scenario == "batch-latency":
            return 1000 * seconds
        rate = batch * o / seconds
        return rate / n if row.per_gpu else rate
    # max-throughput: as many sequences as the KV cache holds, within the
    # engine's batch limit and per-step token budget.
    capacity = kv_capacity_tokens(arch, prec, gpu, n, row.kv_fraction) / (p + o)
    in_flight = min(float(row.max_batch), capacity)
    return loaded_step(
        params, arch, prec, gpu, n, in_flight, p, o, row.token_budget, row.chunked
    ).output_tokens_per_s


# --- the fit ---------------------------------------------------------------------------


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a is small and SPD)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-300:
            continue
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))
        x[r] = s / m[r][r] if abs(m[r][r]) > 1e-300 else 0.0
    return x


def _least_squares(
    residuals: Callable[[list[float]], list[float]], x0: list[float], iterations: int = 40
) -> list[float]:
    """Levenberg-Marquardt with a forward-difference Jacobian."""
    x, lam, h = x0[:], 1e-2, 1e-5
    r = residuals(x)
    cost = sum(v * v for v in r)
    for _ in range(iterations):
        cols = []
        for j in range(len(x)):
            xj = x[:]
            xj[j] += h
            cols.append([(a - b) / h for a, b in zip(residuals(xj), r, strict=True)])
        jtj = [[sum(ci * cj for ci, cj in zip(a, b, strict=True)) for b in cols] for a in cols]
        jtr = [sum(ci * ri for ci, ri in zip(a, r, strict=True)) for a in cols]
        improved = False
        while lam < 1e8:
            damped = [
                [v + (lam * (jtj[i][i] + 1e-9) if i == k else 0.0) for k, v in enumerate(row)]
                for i, row in enumerate(jtj)
            ]
            step = _solve(damped, [-v for v in jtr])
            trial = [a + b for a, b in zip(x, step, strict=True)]
            rt = residuals(trial)
            ct = sum(v * v for v in rt)
            if ct < cost:
                x, r, lam, improved = trial, rt, max(lam / 3, 1e-7), True
                done = cost - ct < 1e-10 * (1 + cost)
                cost = ct
                break
            lam *= 4
        if not improved or done:
            break
    return x


def fit(
    rows: Sequence[Row],
    ctx: Context,
    prior: Mapping[str, float] = PRIOR,
    names: Sequence[str] = PARAMETER_NAMES,
    sigma: float = PRIOR_SIGMA,
) -> Parameters:
    """The parameters `names` that best explain `rows`; the others stay at `prior`."""
    names = list(names)
    base = dict(prior)
    x0 = [math.log(base[n]) for n in names]

    def residuals(x: list[float]) -> list[float]:
        values = {**base, **{n: math.exp(v) for n, v in zip(names, x, strict=True)}}
        params = Parameters(values)
        out = [math.log(max(predict(params, row, ctx), 1e-12) / row.value) for row in rows]
        out += [(v - math.log(base[n])) / sigma for n, v in zip(names, x, strict=True)]
        return out

    x = _least_squares(residuals, x0)
    return Parameters({**base, **{n: math.exp(v) for n, v in zip(names, x, strict=True)}})


def relative_error(predicted: float, row: Row) -> float:
    return (predicted - row.value) / row.value


@dataclass(frozen=True)
class Prediction:
    row: Row
    in_sample: float  # the full fit's estimate
    held_out: float  # the estimate of the fit without this row's source

    @property
    def error(self) -> float:
        return relative_error(self.held_out, self.row)


def leave_one_source_out(
    dataset: Dataset, ctx: Context, full: Parameters | None = None
) -> list[Prediction]:
    full = full or fit(dataset.rows, ctx)
    out = []
    for key in dataset.sources:
        held = [r for r in dataset.rows if r.source == key]
        params = fit([r for r in dataset.rows if r.source != key], ctx)
        out += [Prediction(r, predict(full, r, ctx), predict(params, r, ctx)) for r in held]
    return out


def leave_one_gpu_out(
    dataset: Dataset, ctx: Context, gpu: str, full: Parameters | None = None
) -> list[Prediction]:
    """Fit without any figure of GPU type `gpu` and predict its figures: how
    far to trust an estimate for a GPU type with no figures of its own,
    carried over from its generation's other GPU types (and, where it has
    none, from the prior)."""
    full = full or fit(dataset.rows, ctx)
    params = fit([r for r in dataset.rows if r.gpu != gpu], ctx)
    held = [r for r in dataset.rows if r.gpu == gpu]
    return [Prediction(r, predict(full, r, ctx), predict(params, r, ctx)) for r in held]


def median_abs(errors: Iterable[float]) -> float:
    values = [abs(e) for e in errors]
    return statistics.median(values) if values else float("nan")


# --- evidence: what an estimate for a GPU generation and precision rests on --------------


def evidence_key(generation: str, precision: str) -> str:
    """The group a measurement counts towards: images by generation; chat by
    generation and 16-bit / FP8 / INT4 (int8 weight-only counts with int4)."""
    if precision == "image":
        return f"{generation} image"
    label = {"bf16": "16-bit", "fp16": "16-bit", "fp32": "16-bit", "fp8": "FP8"}.get(
        precision, "INT4/INT8"
    )
    return f"{generation} {label}"


def evidence_table(predictions: Sequence[Prediction], ctx: Context) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Prediction]] = {}
    for p in predictions:
        gen = ctx.gpu(p.row.gpu).generation
        kind = "image" if p.row.scenario == "image" else p.row.precision
        groups.setdefault(evidence_key(gen, kind), []).append(p)
    return {
        key: {
            "measurements": len(ps),
            "sources": sorted({p.row.source for p in ps}),
            "gpus": sorted({p.row.gpu for p in ps}),
            "medianAbsError": round(median_abs(p.error for p in ps), 4),
        }
        for key, ps in sorted(groups.items())
    }


def residuals_of(predictions: Sequence[Prediction], ctx: Context) -> list[Residual]:
    return [
        Residual(
            p.row.source, p.row.gpu, ctx.gpu(p.row.gpu).generation,
            precision_class(p.row.precision, p.row.scenario), p.row.regime, p.error,
        )
        for p in predictions
    ]  # fmt: skip


def leave_each_gpu_out(
    dataset: Dataset, ctx: Context, full: Parameters | None = None
) -> list[Prediction]:
    """`leave_one_gpu_out` for every GPU type with figures, in dataset order."""
    full = full or fit(dataset.rows, ctx)
    out: list[Prediction] = []
    for gpu in sorted({r.gpu for r in dataset.rows}):
        out += leave_one_gpu_out(dataset, ctx, gpu, full)
    return _in_dataset_order(dataset, out)


def fitted_document(dataset: Dataset, ctx: Context) -> dict[str, Any]:
    """Everything `data/fitted.json` holds."""
    full = fit(dataset.rows, ctx)
    predictions = _in_dataset_order(dataset, leave_one_source_out(dataset, ctx, full))
    by_gpu_out = leave_each_gpu_out(dataset, ctx, full)
    by_source = {
        key: round(median_abs(p.error for p in predictions if p.row.source == key), 4)
        for key in dataset.sources
    }
    by_gpu = {
        gpu: round(median_abs(p.error for p in by_gpu_out if p.row.gpu == gpu), 4)
        for gpu in sorted({r.gpu for r in dataset.rows})
    }
    loso, logo = residuals_of(predictions, ctx), residuals_of(by_gpu_out, ctx)
    return {
        "parameters": full.to_dict(),
        "overallMedianAbsError": round(median_abs(p.error for p in predictions), 4),
        "gpuHeldOutOverallMedianAbsError": round(median_abs(p.error for p in by_gpu_out), 4),
        "sourceMedianAbsError": by_source,
        "gpuHeldOutMedianAbsError": by_gpu,
        "evidence": evidence_table(predictions, ctx),
        "bandCoverage": {
            "sourceHeldOut": coverage_by_regime(loso, lambda a, b: a.source == b.source),
            "gpuHeldOut": coverage_by_regime(logo, lambda a, b: a.gpu == b.gpu),
        },
        "rows": len(dataset.rows),
        "predictions": [
            {
                "row": i,
                "inSample": round(p.in_sample, 4),
                "heldOut": round(p.held_out, 4),
                "gpuHeldOut": round(g.held_out, 4),
            }
            for i, (p, g) in enumerate(zip(predictions, by_gpu_out, strict=True))
        ],
        "residuals": {
            "sourceHeldOut": [r.to_dict() for r in loso],
            "gpuHeldOut": [r.to_dict() for r in logo],
        },
    }


def _in_dataset_order(dataset: Dataset, predictions: Sequence[Prediction]) -> list[Prediction]:
    by_row = {id(p.row): p for p in predictions}
    return [by_row[id(r)] for r in dataset.rows]


def context(catalog: CatalogView, dataset: Dataset) -> Context:
    return Context(catalog, dataset.architectures)


# --- what the recommender reads ----------------------------------------------------------


@dataclass(frozen=True)
class Fitted:
    parameters: Parameters
    evidence: Mapping[str, Mapping[str, Any]]
    overall_error: float
    # Held-out errors of every figure: fitted without its source, and
    # without its GPU type (`bands`).
    source_residuals: tuple[Residual, ...] = ()
    gpu_residuals: tuple[Residual, ...] = ()

    def gpus_measured(self) -> frozenset[str]:
        return frozenset(r.gpu for r in self.source_residuals)

    def band(
        self, gpu: str, generation: str, precision: str, regime: str = "throughput"
    ) -> tuple[float, str]:
        """The 80% error band of an estimate for `gpu`, and what it rests on,
        in words (`bands`): from the figures like it held out by source where
        the GPU type has figures of its own, else from the figures of every
        GPU type held out by GPU type."""
        cls = precision_class(precision)
        regime = "image" if cls == "image" else regime
        measured = gpu in self.gpus_measured()
        pool = self.source_residuals if measured else self.gpu_residuals
        band = band_for(pool, generation, cls, regime)
        if band is None:
            return 1.0, f"±100% (no held-out figure like {generation} {cls} {regime})"
        mine = sum(1 for r in self.source_residuals if r.gpu == gpu)
        what = (
            f"{COVERAGE:.0%} band from the held-out errors of {band.figures} published figures "
            f"of {band.group}"
        )
        if measured:
            return band.value, f"±{band.value:.0%} ({what}; {mine} figures of {gpu} itself)"
        return band.value, (
            f"±{band.value:.0%} (no figure for this GPU: {gpu} has no published figure; "
            f"{what}, each predicted with its own GPU type held out)"
        )


def load_fitted(path: Path = FITTED) -> Fitted:
    doc = json.loads(path.read_text())
    residuals = doc.get("residuals", {})
    return Fitted(
        parameters=Parameters(MappingProxyType({**PRIOR, **doc["parameters"]})),
        evidence=MappingProxyType(doc["evidence"]),
        overall_error=float(doc["overallMedianAbsError"]),
        source_residuals=tuple(Residual.from_dict(r) for r in residuals.get("sourceHeldOut", [])),
        gpu_residuals=tuple(Residual.from_dict(r) for r in residuals.get("gpuHeldOut", [])),
    )


_CURRENT: Fitted | None = None


def current() -> Fitted:
    """The committed fit (`data/fitted.json`), read once."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = load_fitted()
    return _CURRENT


def reload() -> None:
    """Forget the cached fit (after `data/fitted.json` was rewritten)."""
    global _CURRENT
    _CURRENT = None


def refit_for(base: Parameters, rows: Sequence[Row], ctx: Context, gen: str) -> Parameters:
    """The base parameters refitted to one endpoint's own measurements: only
    its generation's efficiencies and the step overhead move. A generation
    the published fit does not know (cpu) starts from Ampere's values."""
    per_gen = (
        ["imageEfficiency"]
        if any(r.scenario == "image" for r in rows)
        else ["bandwidthEfficiency", "computeEfficiency"]
    )
    start = dict(base.values)
    for name in per_gen:
        start.setdefault(f"{name}.{gen}", base.per_generation(name, gen))
    names = [f"{name}.{gen}" for name in per_gen]
    names.append(
        "imageOverheadSeconds" if per_gen == ["imageEfficiency"] else "stepOverheadSeconds"
    )
    # An endpoint's own measurements outweigh the published prior.
    return fit(rows, ctx, prior=start, names=names, sigma=REFIT_SIGMA)


def with_source(row: Row, source: str) -> Row:
    return replace(row, source=source)
