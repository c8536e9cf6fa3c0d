"""GPU recommendation for a stated workload: the expected load and latency
targets decide the batch each option can run, how many replicas the load
needs, and so what it costs.

A pure function of the model, the GPU price table, the workload and any
measured profiles. For every (location, GPU type, count) it finds the
largest batch that fits memory and meets the targets, the throughput at
that batch with prefill counted, the replicas the load needs at that
throughput, and the hourly cost of them all. Options are ranked by that
total; each rejected option says why.

The chat model: vLLM's scheduler (continuous batching, chunked prefill,
its default token budget per step and sequences at once: 8192 and 1024 on
GPUs of 70 GiB and more but the A100, 2048 and 256 below; see
`SchedulerLimits`) in steady state at batch B, each step timed by
`inferd.catalog.perfmodel` with the parameters fitted to published
measurements (`inferd/catalog/data/fitted.json`, docs/recommendation.md):
  a step carries B decoding sequences plus B x prompt/output prompt tokens
    (a request's prompt is chunked over its decode steps); TPOT (mean) = that
    step; where the prompt tokens exceed the budget, fewer sequences decode
    and the rest wait, which TTFT counts;
  TTFT (mean) = the wait for a slot + the step in progress + the prompt's own
    prefill at that load (its chunks, each a step beside the decodes), never
    below the prompt's prefill time; with chunked prefill off in the engine
    settings a prompt is a pass of its own and prefill and decode add up;
  throughput = decoding sequences / step; requests/s = that / output tokens.
  p95 = mean x 2 for TTFT (prompts arriving together queue behind each
  other) and x 1.15 for TPOT.
The image model, per replica at batch b (images denoised together): the
  UNet's and VAE's FLOPs at the requested size and steps at the fitted
  image efficiency of the GPU's generation, plus a fixed cost per image;
  every image of a batch finishes together, so seconds per image (p95) =
  1.1 x the batch's time.
Every option states what its estimate rests on and its error band: an 80%
  band from the held-out errors of published figures like it (GPU
  generation, precision, throughput regime; `inferd.catalog.bands`), or,
  for a GPU type with no figure of its own, "no figure for this GPU" and the
  band of figures predicted with their GPU type held out.
Replicas run at 80% of their capacity (headroom for bursts and queueing):
  replicas = ceil(load / (0.8 x capacity)). Suggested minReplicas is that
  count; maxReplicas twice it, for peaks of twice the stated load.
A measured profile for the model, GPU type and count (`inferd bench`)
  refits the model for that option: its generation's bandwidth and compute
  efficiencies and the step overhead are fitted to the measured throughput
  and TPOT, and the option is estimated with them ("measured on ...,
  model refitted to N measured points" instead of "estimated").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, cast

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import Catalog, perfmodel
from inferd.catalog.engine_sizing import chunked_prefill, max_sequences, sized_for
from inferd.catalog.fit import Context, Fitted, Row, current, refit_for
from inferd.catalog.gpus import GpuCatalog, GpuType
from inferd.catalog.models import ModelSpec
from inferd.catalog.perfmodel import Parameters, loaded_step, precision_of
from inferd.catalog.recommend import (
    OVERHEAD_FRACTION_OF_WEIGHTS,
    OVERHEAD_GB_PER_GPU,
    USABLE_MEMORY_FRACTION,
    _candidates,
    _overhead_gb,
    _structural_problems,
    chat_memory,
)
from inferd.catalog.registered import MeasuredProfile
from inferd.vocab import ModelKind

TTFT_P95_OVER_MEAN = 2.0
TPOT_P95_OVER_MEAN = 1.15
IMAGE_P95_OVER_MEAN = 1.1
TARGET_UTILIZATION = 0.8
PEAK_OVER_STATED_LOAD = 2.0
MAX_IMAGE_BATCH = 8


@dataclass(frozen=True)
class SchedulerLimits:
    """vLLM's defaults for its API server (vllm/engine/arg_utils.py): the
    prompt and decode tokens one step may carry, and the sequences it runs
    at once. Larger on GPUs of 70 GiB or more except the A100 (where a large
    budget was measured to cost throughput), largest from 160 GiB."""

    token_budget: int
    max_sequences: int


SMALL_GPU_LIMITS = SchedulerLimits(2048, 256)
LARGE_GPU_LIMITS = SchedulerLimits(8192, 1024)
HUGE_GPU_LIMITS = SchedulerLimits(16384, 1024)
# The most any GPU allows: the bound of a batch search.
MAX_CHAT_BATCH = HUGE_GPU_LIMITS.max_sequences


def scheduler_limits(gpu: GpuType) -> SchedulerLimits:
    gib = (gpu.memory_mib or gpu.memory_gb * 1e9 / 2**20) / 1024
    if gib >= 160:
        return HUGE_GPU_LIMITS
    if gib >= 70 and not gpu.name.upper().startswith("A100"):
        return LARGE_GPU_LIMITS
    return SMALL_GPU_LIMITS


def fitted() -> Fitted:
    """The parameters fitted to published measurements."""
    return current()


@dataclass(frozen=True)
class ChatWorkload:
    requests_per_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_p95_s: float | None = None  # None: no target
    tpot_p95_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requestsPerSecond": self.requests_per_s,
            "promptTokens": self.prompt_tokens,
            "outputTokens": self.output_tokens,
            "ttftP95Ms": None if self.ttft_p95_s is None else self.ttft_p95_s * 1000,
            "tpotP95Ms": None if self.tpot_p95_s is None else self.tpot_p95_s * 1000,
        }


@dataclass(frozen=True)
class ImageWorkload:
    images_per_minute: float
    size: tuple[int, int] | None = None  # None: the model's default
    steps: int | None = None
    seconds_per_image_p95: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "imagesPerMinute": self.images_per_minute,
            "size": None if self.size is None else f"{self.size[0]}x{self.size[1]}",
            "steps": self.steps,
            "secondsPerImageP95": self.seconds_per_image_p95,
        }


Workload = ChatWorkload | ImageWorkload


@dataclass(frozen=True)
class Performance:
    """What one replica does at one batch size."""

    batch: int
    throughput: float  # output tokens/s (chat) or images/s (image)
    requests_per_s: float  # chat requests/s or images/s
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    seconds_per_image_p95: float | None = None
    memory_gb: float = 0.0


@dataclass(frozen=True)
class WorkloadOption:
    location: str
    gpu_type: str
    gpu_count: int
    fits: bool
    reasons: tuple[str, ...]
    hourly_price: float  # one replica
    basis: str  # "estimated" or "measured on ..."
    memory_available_gb: float
    performance: Performance | None = None
    replicas: int = 0
    total_hourly_price: float = 0.0
    cost_per_million_tokens: float | None = None
    cost_per_image: float | None = None
    min_replicas: int = 0
    max_replicas: int = 0
    # What the estimate rests on, in words, and its relative error band.
    evidence: str = ""
    error_band: float | None = None

    @property
    def label(self) -> str:
        return f"{self.location} {self.gpu_count} x {self.gpu_type}"

    # The names the console's option tables read (as `recommend.GpuOption`'s).
    @property
    def memory_needed_gb(self) -> float | None:
        return None if self.performance is None else self.performance.memory_gb

    @property
    def est_output_tokens_per_s(self) -> float | None:
        p = self.performance
        return None if p is None or p.tpot_p95_s is None else p.throughput

    @property
    def est_seconds_per_image(self) -> float | None:
        p = self.performance
        return None if p is None else p.seconds_per_image_p95

    def to_dict(self) -> dict[str, Any]:
        p = self.performance
        return {
            "location": self.location,
            "gpuType": self.gpu_type,
            "gpuCount": self.gpu_count,
            "fits": self.fits,
            "reasons": list(self.reasons),
            "basis": self.basis,
            "hourlyPrice": self.hourly_price,
            "memoryAvailableGb": round(self.memory_available_gb, 2),
            "memoryNeededGb": None if p is None else round(p.memory_gb, 2),
            "batch": None if p is None else p.batch,
            "outputTokensPerS": None if p is None or p.tpot_p95_s is None
            else round(p.throughput, 1),
            "requestsPerS": None if p is None else round(p.requests_per_s, 3),
            "ttftP95Ms": _ms(None if p is None else p.ttft_p95_s),
            "tpotP95Ms": _ms(None if p is None else p.tpot_p95_s),
            "imagesPerMinute": None if p is None or p.seconds_per_image_p95 is None
            else round(p.throughput * 60, 2),
            "secondsPerImageP95": None if p is None or p.seconds_per_image_p95 is None
            else round(p.seconds_per_image_p95, 3),
            "replicas": self.replicas,
            "totalHourlyPrice": round(self.total_hourly_price, 4),
            "costPerMillionTokens": _round(self.cost_per_million_tokens, 4),
            "costPerImage": _round(self.cost_per_image, 6),
            "minReplicas": self.min_replicas,
            "maxReplicas": self.max_replicas,
            "evidence": self.evidence,
            "errorBand": _round(self.error_band, 4),
        }  # fmt: skip


@dataclass(frozen=True)
class WorkloadRecommendation:
    model: str
    location: str | None
    currency: str
    workload: Workload
    options: tuple[WorkloadOption, ...]  # best (cheapest in total) first
    rejected: tuple[WorkloadOption, ...]
    assumptions: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def best(self) -> WorkloadOption | None:
        return self.options[0] if self.options else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        return {
            "model": self.model,
            "location": self.location,
            "currency": self.currency,
            "workload": self.workload.to_dict(),
            "best": None if best is None else best.to_dict(),
            "options": [o.to_dict() for o in self.options],
            "rejected": [o.to_dict() for o in self.rejected],
            "assumptions": dict(self.assumptions),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# --- chat -----------------------------------------------------------------------------


def chat_performance(
    model: ModelSpec,
    gpu: GpuType,
    count: int,
    batch: int,
    work: ChatWorkload,
    params: Parameters | None = None,
    chunked_prefill: bool = True,
) -> Performance:
    """One replica at `batch` requests in flight, in vLLM's steady state
    (`chunked_prefill` False: the engine settings turned it off, so prompts
    run as passes of their own)."""
    arch = model.chat
    params = params or fitted().parameters
    step = loaded_step(
        params, arch, precision_of(arch), gpu, count, batch,
        work.prompt_tokens, work.output_tokens, scheduler_limits(gpu).token_budget,
        chunked_prefill,
    )  # fmt: skip
    seq = work.prompt_tokens + work.output_tokens
    return Performance(
        batch=batch,
        throughput=step.output_tokens_per_s,
        requests_per_s=step.output_tokens_per_s / work.output_tokens,
        ttft_p95_s=TTFT_P95_OVER_MEAN * step.ttft_s,
        tpot_p95_s=TPOT_P95_OVER_MEAN * step.step_s,
        memory_gb=chat_memory(arch, count, batch, seq).total_gb,
    )


def _chat_misses(p: Performance, work: ChatWorkload, available: float) -> list[str]:
    misses = []
    if p.memory_gb > available:
        misses.append(f"needs {p.memory_gb:.1f} GB, {available:.1f} GB usable")
    assert p.ttft_p95_s is not None and p.tpot_p95_s is not None
    if work.ttft_p95_s is not None and p.ttft_p95_s > work.ttft_p95_s:
        misses.append(
            f"TTFT p95 {p.ttft_p95_s * 1000:.0f} ms > target {work.ttft_p95_s * 1000:.0f} ms"
        )
    if work.tpot_p95_s is not None and p.tpot_p95_s > work.tpot_p95_s:
        misses.append(
            f"TPOT p95 {p.tpot_p95_s * 1000:.1f} ms > target {work.tpot_p95_s * 1000:.1f} ms"
        )
    return misses


def _largest_batch(evaluate: Any, misses: Any, limit: int) -> tuple[Performance | None, list[str]]:
    """The largest batch in 1..limit that `misses` nothing; every quantity
    grows with the batch, so a binary search finds it."""
    first = evaluate(1)
    problems = misses(first)
    if problems:
        return None, problems
    lo, hi = 1, limit
    best = first
    while lo < hi:
        mid = (lo + hi + 1) // 2
        p = evaluate(mid)
        if misses(p):
            hi = mid - 1
        else:
            lo, best = mid, p
    return best, []


def _measured_label(profile: MeasuredProfile) -> str:
    day = profile.measured_at[:10] or "an unknown date"
    return f"measured on {profile.gpu_count} x {profile.gpu_type}, {day}"


# --- image ----------------------------------------------------------------------------


def image_performance(
    model: ModelSpec,
    gpu: GpuType,
    batch: int,
    size: tuple[int, int],
    steps: int,
    params: Parameters | None = None,
) -> Performance:
    arch = model.image
    assert model.default_size is not None
    pixels = size[0] * size[1] / (model.default_size[0] * model.default_size[1])
    params = params or fitted().parameters
    seconds = perfmodel.image_seconds(params, arch, gpu, batch, steps, pixels)
    weights = arch.parameters * arch.bytes_per_param / 1e9
    memory = weights + arch.activation_gb_per_image * pixels * batch + _overhead_gb(weights, 1)
    return Performance(
        batch=batch,
        throughput=batch / seconds,
        requests_per_s=batch / seconds,
        seconds_per_image_p95=IMAGE_P95_OVER_MEAN * seconds,
        memory_gb=memory,
    )


def _image_misses(p: Performance, work: ImageWorkload, available: float) -> list[str]:
    misses = []
    if p.memory_gb > available:
        misses.append(f"needs {p.memory_gb:.1f} GB, {available:.1f} GB usable")
    assert p.seconds_per_image_p95 is not None
    target = work.seconds_per_image_p95
    if target is not None and p.seconds_per_image_p95 > target:
        misses.append(f"{p.seconds_per_image_p95:.2f} s per image (p95) > target {target:g} s")
    return misses


# --- one option -----------------------------------------------------------------------


def _evaluate(
    model: ModelSpec,
    gpus: GpuCatalog,
    location: str,
    gpu_type: str,
    count: int,
    work: Workload,
    profile: MeasuredProfile | None,
    batch_cap: int | None = None,
    chunked_prefill: bool = True,
) -> WorkloadOption:
    gpu = gpus.gpu_types[gpu_type]
    price = gpus.price_per_gpu(location, gpu_type) * count
    available = count * gpu.total_memory_gb * USABLE_MEMORY_FRACTION
    params, basis, band, evidence = _estimate_basis(model, gpu, work, profile)
    base = WorkloadOption(
        location=location,
        gpu_type=gpu_type,
        gpu_count=count,
        fits=False,
        reasons=(),
        hourly_price=price,
        basis=basis,
        memory_available_gb=available,
        evidence=evidence,
        error_band=band,
    )
    problems = _structural_problems(model, gpus, gpu_type, count)
    if problems:
        return replace(base, reasons=tuple(problems))
    # A refitted model is trusted up to the largest concurrency measured.
    measured_max = max((p.concurrency for p in profile.points), default=0) if profile else 0
    if isinstance(work, ChatWorkload):
        most = scheduler_limits(gpu).max_sequences
        limit = min(most, measured_max or most)
        capped = batch_cap is not None and batch_cap < limit
        limit = min(limit, batch_cap or limit)
        perf, reasons = _chat_option(
            model, gpu, count, work, available, params, limit, capped, chunked_prefill
        )
        load = work.requests_per_s
    else:
        limit = min(MAX_IMAGE_BATCH, measured_max or MAX_IMAGE_BATCH)
        perf, reasons = _image_option(model, gpu, work, available, params, limit)
        load = work.images_per_minute / 60
    if perf is None:
        return replace(base, reasons=tuple(reasons))
    replicas = max(1, math.ceil(load / (TARGET_UTILIZATION * perf.requests_per_s) - 1e-9))
    total = replicas * price
    reasons.append(
        f"{replicas} replica(s) at {TARGET_UTILIZATION:.0%} of {perf.requests_per_s:.3g} "
        f"{'requests' if isinstance(work, ChatWorkload) else 'images'}/s each serve "
        f"{load:.3g}/s: {total:.2f} {gpus.currency}/h"
    )
    reasons.append(f"rests on: {evidence}")
    out = replace(
        base,
        fits=True,
        reasons=tuple(reasons),
        performance=perf,
        replicas=replicas,
        total_hourly_price=total,
        min_replicas=replicas,
        max_replicas=math.ceil(PEAK_OVER_STATED_LOAD * replicas),
    )
    if isinstance(work, ChatWorkload):
        tokens_per_hour = work.requests_per_s * work.output_tokens * 3600
        return replace(out, cost_per_million_tokens=total / tokens_per_hour * 1e6)
    return replace(out, cost_per_image=total / (work.images_per_minute * 60))


def _estimate_basis(
    model: ModelSpec, gpu: GpuType, work: Workload, profile: MeasuredProfile | None
) -> tuple[Parameters, str, float, str]:
    """The parameters to estimate with, the basis label, the error band and
    what it rests on: the published fit, or that fit refitted to this
    option's own measured profile."""
    fit = fitted()
    precision = "image" if isinstance(work, ImageWorkload) else precision_of(model.chat).weights
    band, evidence = fit.band(gpu.name, gpu.generation, precision)
    if profile is None:
        return fit.parameters, "estimated", band, evidence
    rows = profile_rows(profile, "bf16" if isinstance(work, ImageWorkload) else precision)
    if not rows:
        return fit.parameters, "estimated", band, evidence + " (the measured profile has no points)"
    ctx = Context(cast(Catalog, _ProfileCatalog(model, gpu)), {})
    params = refit_for(fit.parameters, rows, ctx, gpu.generation)
    from inferd.catalog.fit import median_abs, predict, relative_error

    err = median_abs(relative_error(predict(params, r, ctx), r) for r in rows)
    label = f"{_measured_label(profile)}, model refitted to {len(rows)} measured points"
    return (
        params,
        label,
        err,
        (
            f"±{err:.0%} (the model refitted to {len(rows)} measured points of "
            f"{profile.endpoint or 'this endpoint'} on {profile.gpu_count} x {profile.gpu_type}; "
            f"published fit alone: {evidence})"
        ),
    )


class _ProfileCatalog:
    """Just enough of a Catalog for predicting one model on one GPU type."""

    def __init__(self, model: ModelSpec, gpu: GpuType) -> None:
        self.models = _One(model)
        self.gpus = _OneGpu(gpu)


class _One:
    def __init__(self, model: ModelSpec) -> None:
        self._model = model

    def get(self, name: str) -> ModelSpec:
        return self._model


class _OneGpu:
    def __init__(self, gpu: GpuType) -> None:
        self._gpu = gpu

    def gpu_type(self, name: str) -> GpuType:
        return self._gpu


def profile_rows(profile: MeasuredProfile, precision: str = "bf16") -> list[Row]:
    """A measured profile as rows of the fit: each concurrency's throughput
    and TPOT (chat), or seconds per batch of images. `precision`: the
    model's weights (bf16, fp8, int4, ...), so that the refit keeps its
    quantized kernels' costs."""
    rows: list[Row] = []
    common = dict(
        source="measured", model=profile.model_name, stated_model=profile.model_name,
        gpu=profile.gpu_type, gpus=profile.gpu_count, precision=precision,
        engine="inferd bench", stated="measured",
    )  # fmt: skip
    for point in profile.points:
        if profile.kind == ModelKind.IMAGE:
            if point.images_per_s > 0:
                rows.append(Row(**common, scenario="image", batch=1,  # type: ignore[arg-type]
                                steps=profile.output_tokens or 30,
                                value=point.concurrency / point.images_per_s
                                / max(1, point.concurrency)))  # fmt: skip
            continue
        if point.output_tokens_per_s > 0:
            rows.append(Row(**common, scenario="served", batch=point.concurrency,  # type: ignore[arg-type]
                            input=profile.prompt_tokens, output=profile.output_tokens,
                            value=point.output_tokens_per_s))  # fmt: skip
        if point.tpot_p95_s > 0:
            rows.append(Row(**common, scenario="served-tpot", batch=point.concurrency,  # type: ignore[arg-type]
                            input=profile.prompt_tokens, output=profile.output_tokens,
                            value=1000 * point.tpot_p95_s / TPOT_P95_OVER_MEAN))  # fmt: skip
    return rows


def _chat_option(
    model: ModelSpec,
    gpu: GpuType,
    count: int,
    work: ChatWorkload,
    available: float,
    params: Parameters,
    max_batch: int | None = None,
    settings_cap: bool = False,
    chunked_prefill: bool = True,
) -> tuple[Performance | None, list[str]]:
    """`settings_cap`: `max_batch` is the endpoint's maxNumSeqs (else the
    largest measured concurrency, or the scheduler's limit)."""
    scheduler_max = scheduler_limits(gpu).max_sequences
    max_batch = scheduler_max if max_batch is None else max_batch
    seq = work.prompt_tokens + work.output_tokens
    if seq > model.chat.context_length:
        return None, [
            f"prompt + output = {seq} tokens exceeds the model's context of "
            f"{model.chat.context_length}"
        ]

    def misses(p: Performance) -> list[str]:
        return _chat_misses(p, work, available)

    found, problems = _largest_batch(
        lambda b: chat_performance(model, gpu, count, b, work, params, chunked_prefill),
        misses,
        max_batch,
    )
    if found is None:
        return None, [f"even one sequence at a time: {'; '.join(problems)}"]
    perf = found
    assert perf.ttft_p95_s is not None and perf.tpot_p95_s is not None
    limit = (
        "the engine settings' maxNumSeqs; it meets" if settings_cap and perf.batch == max_batch
        else "the largest measured" if max_batch < scheduler_max and perf.batch == max_batch
        else "the scheduler's limit" if perf.batch == scheduler_max
        else "the largest that meets"
    )  # fmt: skip
    return perf, [
        f"estimated: batch {perf.batch} ({limit} the targets and fits "
        f"{perf.memory_gb:.1f} of {available:.1f} GB): {perf.throughput:,.0f} output tokens/s "
        f"with prefill counted, TTFT p95 {perf.ttft_p95_s * 1000:.0f} ms, "
        f"TPOT p95 {perf.tpot_p95_s * 1000:.1f} ms"
    ]


def _image_option(
    model: ModelSpec,
    gpu: GpuType,
    work: ImageWorkload,
    available: float,
    params: Parameters,
    max_batch: int = MAX_IMAGE_BATCH,
) -> tuple[Performance | None, list[str]]:
    assert model.default_size is not None and model.default_steps is not None
    size = work.size or model.default_size
    steps = work.steps or model.default_steps

    def misses(p: Performance) -> list[str]:
        return _image_misses(p, work, available)

    found, problems = _largest_batch(
        lambda b: image_performance(model, gpu, b, size, steps, params), misses, max_batch
    )
    if found is None:
        return None, [f"even one image at a time: {'; '.join(problems)}"]
    perf = found
    assert perf.seconds_per_image_p95 is not None
    return perf, [
        f"estimated: {perf.batch} image(s) per batch at {size[0]}x{size[1]}, {steps} steps: "
        f"{perf.throughput * 60:.1f} images/minute, {perf.seconds_per_image_p95:.2f} s per "
        f"image (p95), {perf.memory_gb:.1f} of {available:.1f} GB"
    ]


# --- the whole answer -----------------------------------------------------------------


def assumptions(work: Workload) -> dict[str, Any]:
    fit = fitted()
    common: dict[str, Any] = {
        "targetUtilization": TARGET_UTILIZATION,
        "maxReplicasOverLoad": PEAK_OVER_STATED_LOAD,
        "usableMemoryFraction": USABLE_MEMORY_FRACTION,
        "overheadGbPerGpu": OVERHEAD_GB_PER_GPU,
        "overheadFractionOfWeights": OVERHEAD_FRACTION_OF_WEIGHTS,
        "basis": "the step-time model fitted to published measurements "
        "(docs/recommendation.md), refitted to a measured profile where one exists",
        "fittedParameters": perfmodel.describe(fit.parameters),
        "heldOutMedianAbsError": fit.overall_error,
    }
    if isinstance(work, ChatWorkload):
        return {
            **common,
            "batching": "vLLM continuous batching with chunked prefill: a step carries the "
            "batch's decodes plus batch x prompt/output prompt tokens, within the token budget "
            "(chunked prefill off in the engine settings: prompts run as passes of their own)",
            "ttft": "the wait for a slot + the step in progress + the prompt's own prefill at "
            "that load, never below the prompt's prefill time",
            "schedulerLimits": {
                "smallGpus": vars(SMALL_GPU_LIMITS),
                "gpusOf70GiBOrMoreButA100": vars(LARGE_GPU_LIMITS),
                "gpusOf160GiBOrMore": vars(HUGE_GPU_LIMITS),
            },
            "ttftP95OverMean": TTFT_P95_OVER_MEAN,
            "tpotP95OverMean": TPOT_P95_OVER_MEAN,
            "maxBatch": MAX_CHAT_BATCH,
        }
    return {
        **common,
        "secondsPerImageP95OverMean": IMAGE_P95_OVER_MEAN,
        "maxBatch": MAX_IMAGE_BATCH,
    }


def _rank_key(option: WorkloadOption) -> tuple[float, int, float, str, str]:
    return (
        float(f"{option.total_hourly_price:.9g}"),
        option.replicas * option.gpu_count,
        option.hourly_price,
        option.location,
        option.gpu_type,
    )


def validate(model: ModelSpec, work: Workload) -> None:
    """ValueError naming what does not match the model or is out of range."""
    if isinstance(work, ChatWorkload):
        if model.kind != ModelKind.CHAT:
            raise ValueError(f"model {model.name!r} makes images: give imagesPerMinute")
        if work.requests_per_s <= 0 or work.prompt_tokens < 1 or work.output_tokens < 1:
            raise ValueError("requests/s must be positive, prompt and output tokens at least 1")
    else:
        if model.kind != ModelKind.IMAGE:
            raise ValueError(f"model {model.name!r} is a chat model: give requestsPerSecond")
        if work.images_per_minute <= 0:
            raise ValueError("images per minute must be positive")
        if work.steps is not None and work.steps < 1:
            raise ValueError("steps must be at least 1")


def recommend_for_workload(
    model: ModelSpec,
    gpus: GpuCatalog,
    work: Workload,
    location: str | None = None,
    *,
    gpu_type: str | None = None,
    gpu_count: int | None = None,
    profiles: Iterable[MeasuredProfile] = (),
    engine_settings: EngineSettings | None = None,
) -> WorkloadRecommendation:
    """Every offered (location, GPU type, count) for `work`, cheapest total first.

    Raises ValueError for a workload that does not suit the model, KeyError
    for an unknown location or GPU type (as `recommend` does).
    `engine_settings`: an endpoint's (the model as its engine holds it; the
    batch at most their maxNumSeqs; prompts as passes of their own where
    they turn chunked prefill off).
    """
    model = sized_for(model, engine_settings)
    validate(model, work)
    measured = {(p.gpu_type, p.gpu_count): p for p in profiles if p.model_name == model.name}
    batch_cap = max_sequences(engine_settings)
    chunked = chunked_prefill(engine_settings)
    options = [
        _evaluate(
            model, gpus, loc, name, count, work, measured.get((name, count)), batch_cap, chunked
        )
        for loc, name, count in _candidates(model, gpus, location, gpu_type, gpu_count)
    ]
    return WorkloadRecommendation(
        model=model.name,
        location=location,
        currency=gpus.currency,
        workload=work,
        options=tuple(sorted((o for o in options if o.fits), key=_rank_key)),
        rejected=tuple(o for o in options if not o.fits),
        assumptions=MappingProxyType(assumptions(work)),
    )
