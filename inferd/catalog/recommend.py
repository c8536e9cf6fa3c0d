"""GPU recommendation: which GPU type and count serve a model at the lowest
cost per unit of output, and why every other option was turned down.

A pure function of the model's catalog entry and the GPU price table. The
model of the hardware is a roofline, with the assumptions below stated once
and reported in every `Recommendation.assumptions`:

Fit (GB of 10^9 bytes) -- must not exceed `count x device memory x 0.9`
(0.9: vLLM's default gpu_memory_utilization):
  chat:  weights (parameters x bytes per dtype)
         + KV cache: 2 x layers x KV heads x head_dim x bytes, per token, for
           `concurrency` sequences of `context_tokens` tokens each (default
           16 x 4096, capped at the model's context length). When GPUs
           outnumber KV heads each GPU keeps a copy of one, so the cache grows.
         + overhead: 1.5 GB per GPU (CUDA context, CUDA graphs, NCCL buffers)
           + 2% of the weights (activation workspace).
  image: weights + activations for one request of `max_n` images at the
         default size (the engine runs a request's images as one batch)
         + the same overhead.

Throughput: the step-time model of `inferd.catalog.perfmodel` with the
  parameters fitted to published measurements (docs/recommendation.md):
  chat decode, one step for the whole batch: all weights read once plus each
    sequence's KV cache (on average half its window), against the batch's
    FLOPs, each at the fitted fraction of peak for the GPU's generation and
    the model's precision (FP8 on FP8 tensor cores, AWQ/GPTQ weight-only),
    plus the fitted per-step and per-sequence overheads; tensor parallelism
    at the fitted scaling per doubling. Prefill is not counted: the estimate
    is of output tokens.
  image: the UNet evaluations and VAE decode at the fitted image efficiency
    of the generation, plus the fitted cost per image.
  Every option says what its estimate rests on and its error band (the
  held-out error of the published measurements of that generation and
  precision).

An option that fits but would serve under 5 tokens/s per sequence, or take
over 60 s per image, is rejected as too slow: a CPU may hold a 8B model but
cannot serve it. Fitting options are ranked by cost per million output
tokens (or per image) = hourly price / (3600 x throughput); ties go to fewer
GPUs, then the lower hourly price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import inferd.catalog.fit as fit
import inferd.catalog.perfmodel as perfmodel
from inferd.api.engine_settings import EngineSettings
from inferd.catalog.engine_sizing import max_sequences, sized_for
from inferd.catalog.gpus import GpuCatalog, GpuType
from inferd.catalog.models import TEXT_KINDS, ChatArchitecture, ModelSpec
from inferd.vocab import ModelKind

DEFAULT_CONCURRENCY = 16
DEFAULT_CONTEXT_TOKENS = 4096
USABLE_MEMORY_FRACTION = 0.9
OVERHEAD_GB_PER_GPU = 1.5
OVERHEAD_FRACTION_OF_WEIGHTS = 0.02
MIN_TOKENS_PER_S_PER_SEQUENCE = 5.0
MAX_SECONDS_PER_IMAGE = 60.0
# Embedders and cross-encoders: one forward pass over each input, no decode.
POOLING_KINDS = tuple(kind.value for kind in ModelKind if kind.pooling)


@dataclass(frozen=True)
class GpuOption:
    location: str
    gpu_type: str
    gpu_count: int
    fits: bool
    reasons: tuple[str, ...]  # why it fits and how fast, or why it was rejected
    hourly_price: float  # one replica-hour
    memory_needed_gb: float
    memory_available_gb: float
    est_output_tokens_per_s: float | None = None
    cost_per_million_tokens: float | None = None
    est_seconds_per_image: float | None = None
    cost_per_image: float | None = None
    # What the estimate rests on, in words, and its relative error band.
    evidence: str = ""
    error_band: float | None = None

    @property
    def label(self) -> str:
        return f"{self.location} {self.gpu_count} x {self.gpu_type}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "gpuType": self.gpu_type,
            "gpuCount": self.gpu_count,
            "fits": self.fits,
            "reasons": list(self.reasons),
            "hourlyPrice": self.hourly_price,
            "memoryNeededGb": round(self.memory_needed_gb, 2),
            "memoryAvailableGb": round(self.memory_available_gb, 2),
            "estOutputTokensPerS": _round(self.est_output_tokens_per_s, 1),
            "costPerMillionTokens": _round(self.cost_per_million_tokens, 4),
            "estSecondsPerImage": _round(self.est_seconds_per_image, 3),
            "costPerImage": _round(self.cost_per_image, 6),
            "evidence": self.evidence,
            "errorBand": _round(self.error_band, 4),
        }


@dataclass(frozen=True)
class Recommendation:
    model: str
    location: str | None  # None: every location was considered
    currency: str
    options: tuple[GpuOption, ...]  # fitting, best first
    rejected: tuple[GpuOption, ...]
    assumptions: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def best(self) -> GpuOption | None:
        return self.options[0] if self.options else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        return {
            "model": self.model,
            "location": self.location,
            "currency": self.currency,
            "best": best.to_dict() if best else None,
            "options": [o.to_dict() for o in self.options],
            "rejected": [o.to_dict() for o in self.rejected],
            "assumptions": dict(self.assumptions),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class _Memory:
    weights_gb: float
    cache_gb: float  # KV cache (chat) or activations (image)
    overhead_gb: float
    cache_label: str

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.cache_gb + self.overhead_gb

    def describe(self) -> str:
        return (
            f"weights {self.weights_gb:.1f} GB + {self.cache_label} {self.cache_gb:.1f} GB"
            f" + overhead {self.overhead_gb:.1f} GB"
        )


def _overhead_gb(weights_gb: float, count: int) -> float:
    return OVERHEAD_GB_PER_GPU * count + OVERHEAD_FRACTION_OF_WEIGHTS * weights_gb


def _kv_replication(arch: ChatArchitecture, count: int) -> float:
    return max(1.0, count / arch.kv_heads)


def chat_memory(arch: ChatArchitecture, count: int, concurrency: int, seq_tokens: int) -> _Memory:
    weights = arch.weight_bytes / 1e9
    kv = arch.kv_bytes_per_token * seq_tokens * concurrency * _kv_replication(arch, count) / 1e9
    return _Memory(weights, kv, _overhead_gb(weights, count), "KV cache")


def image_memory(spec: ModelSpec) -> _Memory:
    arch = spec.image
    weights = arch.parameters * arch.bytes_per_param / 1e9
    assert spec.default_size is not None and spec.max_n is not None
    width, height = spec.default_size
    return _Memory(
        weights,
        arch.activation_gb_per_image * spec.max_n,
        _overhead_gb(weights, 1),
        f"activations for {spec.max_n} images at {width}x{height}",
    )


def decode_tokens_per_s(
    arch: ChatArchitecture,
    gpu: GpuType,
    count: int,
    concurrency: int,
    seq_tokens: int,
    avg_context: float | None = None,
) -> tuple[float, str]:
    """Output tokens/s of the whole batch, and which roof bounds it.

    `avg_context`: the tokens each sequence attends to on average (default:
    half of `seq_tokens`, a window filled from empty)."""
    if avg_context is None:
        avg_context = seq_tokens / 2
    step = perfmodel.step_time(
        fit.current().parameters, arch, perfmodel.precision_of(arch), gpu, count,
        concurrency, avg_context,
    )  # fmt: skip
    return concurrency / step.seconds, step.bound


def pooling_tokens_per_s(
    arch: ChatArchitecture, gpu: GpuType, count: int, concurrency: int, seq_tokens: int
) -> float:
    """Input tokens/s of an embedder or cross-encoder: each step is the
    prefill of `concurrency` inputs of `seq_tokens` tokens (the fitted step
    model's prefill), with nothing decoded after it."""
    seconds = perfmodel.prefill_seconds(
        fit.current().parameters, arch, perfmodel.precision_of(arch), gpu, count,
        seq_tokens, concurrency,
    )  # fmt: skip
    return concurrency * seq_tokens / seconds


def image_seconds(spec: ModelSpec, gpu: GpuType) -> tuple[float, float, str]:
    """Seconds per image at the default size and steps, its TFLOPs, and the bound."""
    arch = spec.image
    assert spec.default_steps is not None
    evaluations = spec.default_steps * arch.guidance_evaluations
    tflops = evaluations * arch.unet_tflops_per_step + arch.vae_decode_tflops
    params = fit.current().parameters
    seconds = perfmodel.image_seconds(params, arch, gpu, 1, spec.default_steps)
    compute = tflops / (gpu.bf16_tflops * perfmodel.image_efficiency(params, gpu.generation))
    bound = (
        "compute"
        if compute >= seconds - params["imageOverheadSeconds"] - 1e-12
        else ("memory-bandwidth")
    )
    return seconds, tflops, bound


def _evidence(model: ModelSpec, gpu: GpuType) -> tuple[float, str]:
    precision = (
        "image" if model.kind == ModelKind.IMAGE else perfmodel.precision_of(model.chat).weights
    )
    return fit.current().band(gpu.name, gpu.generation, precision)


def _structural_problems(
    model: ModelSpec, gpus: GpuCatalog, gpu_type: str, count: int
) -> list[str]:
    problems = []
    allowed = gpus.allowed_counts_for(gpu_type)
    if count not in allowed:
        problems.append(
            f"{count} x {gpu_type} is not allowed; GPUs per replica for {gpu_type}: "
            f"{', '.join(map(str, allowed))}"
        )
    if model.kind == ModelKind.IMAGE and count > 1:
        problems.append(
            "an image pipeline runs on one GPU per replica; more GPUs add cost, not speed"
        )
    if model.kind in TEXT_KINDS and model.chat.attention_heads % count:
        problems.append(
            f"{model.chat.attention_heads} attention heads do not split evenly over {count} GPUs "
            "(tensor parallelism needs a divisor)"
        )
    return problems


def _evaluate(
    model: ModelSpec,
    gpus: GpuCatalog,
    location: str,
    gpu_type: str,
    count: int,
    concurrency: int,
    seq_tokens: int,
    full_context: int = 0,
) -> GpuOption:
    """`full_context`: the context length an endpoint's settings promise;
    vLLM starts only if one sequence of it fits in the KV cache."""
    gpu = gpus.gpu_types[gpu_type]
    price = gpus.price_per_gpu(location, gpu_type) * count
    available = count * gpu.total_memory_gb * USABLE_MEMORY_FRACTION
    if model.kind in TEXT_KINDS:
        # A pooling model keeps no cache between steps, but vLLM sizes one
        # for a decoder embedder's prefill: the chat bound is a safe one.
        memory = chat_memory(model.chat, count, concurrency, seq_tokens)
        if full_context > concurrency * seq_tokens:
            memory = chat_memory(model.chat, count, 1, full_context)
    else:
        memory = image_memory(model)
    base = GpuOption(
        location=location,
        gpu_type=gpu_type,
        gpu_count=count,
        fits=False,
        reasons=(),
        hourly_price=price,
        memory_needed_gb=memory.total_gb,
        memory_available_gb=available,
    )
    problems = _structural_problems(model, gpus, gpu_type, count)
    fit_text = f"{memory.total_gb:.1f} GB ({memory.describe()})"
    if memory.total_gb > available:
        problems.append(
            f"needs {fit_text}; {count} x {gpu_type} has {available:.1f} GB usable"
            + _room_hint(model, memory, available, count, seq_tokens)
        )
    if problems:
        return replace(base, reasons=tuple(problems))
    reasons = [f"needs {fit_text} of {available:.1f} GB usable"]
    band, evidence = _evidence(model, gpu)
    base = replace(base, evidence=evidence, error_band=band)
    if model.kind in POOLING_KINDS:
        rate = pooling_tokens_per_s(model.chat, gpu, count, concurrency, seq_tokens)
        reasons.append(
            f"{rate:,.0f} input tokens/s for batches of {concurrency} inputs of {seq_tokens} "
            "tokens (one forward pass each, no decode)"
        )
        reasons.append(f"rests on: {evidence}")
        return replace(
            base,
            fits=True,
            reasons=tuple(reasons),
            # Per million input tokens: what an embedding or rerank API bills.
            cost_per_million_tokens=price / (3600 * rate) * 1e6,
        )
    if model.kind == ModelKind.CHAT:
        rate, bound = decode_tokens_per_s(model.chat, gpu, count, concurrency, seq_tokens)
        per_sequence = rate / concurrency
        reasons.append(
            f"decode {bound}-bound: {rate:,.0f} tokens/s for {concurrency} concurrent sequences "
            f"({per_sequence:.1f} per sequence)"
        )
        fits = per_sequence >= MIN_TOKENS_PER_S_PER_SEQUENCE
        if not fits:
            reasons.append(
                f"too slow: under {MIN_TOKENS_PER_S_PER_SEQUENCE:g} tokens/s per sequence"
            )
        else:
            reasons.append(f"rests on: {evidence}")
        return replace(
            base,
            fits=fits,
            reasons=tuple(reasons),
            est_output_tokens_per_s=rate,
            cost_per_million_tokens=price / (3600 * rate) * 1e6,
        )
    seconds, tflops, bound = image_seconds(model, gpu)
    reasons.append(
        f"{model.default_steps} steps x {model.image.guidance_evaluations} UNet evaluations "
        f"+ VAE decode = {tflops:,.1f} TFLOPs per image, {bound}-bound: {seconds:.2f} s per image"
    )
    fits = seconds <= MAX_SECONDS_PER_IMAGE
    if not fits:
        reasons.append(f"too slow: over {MAX_SECONDS_PER_IMAGE:g} s per image")
    else:
        reasons.append(f"rests on: {evidence}")
    return replace(
        base,
        fits=fits,
        reasons=tuple(reasons),
        est_seconds_per_image=seconds,
        cost_per_image=price * seconds / 3600,
    )


def _room_hint(model: ModelSpec, memory: _Memory, available: float, count: int, seq: int) -> str:
    """For a chat model whose weights fit but whose KV cache does not: how
    many sequences would, so the operator can trade concurrency for GPUs."""
    if model.kind != ModelKind.CHAT:
        return ""
    per_sequence = chat_memory(model.chat, count, 1, seq).cache_gb
    room = available - memory.weights_gb - memory.overhead_gb
    if room < per_sequence:
        return ""
    return f" (room for {int(room // per_sequence)} sequences of {seq} tokens at once)"


def _candidates(
    model: ModelSpec,
    gpus: GpuCatalog,
    location: str | None,
    gpu_type: str | None,
    gpu_count: int | None,
) -> list[tuple[str, str, int]]:
    locations = [gpus.location(location)] if location is not None else list(gpus.locations.values())
    if gpu_type is not None:
        gpus.gpu_type(gpu_type)  # KeyError naming the known types
        if location is not None:
            gpus.price_per_gpu(location, gpu_type)  # KeyError: not offered there
        elif not any(gpu_type in loc.offers for loc in locations):
            raise KeyError(f"GPU type {gpu_type!r} is not offered in any location")
    out: list[tuple[str, str, int]] = []
    for loc in locations:
        for name in gpus.gpu_types:  # the price table's order of types
            if name not in loc.offers or (gpu_type is not None and name != gpu_type):
                continue
            if gpu_count is not None:
                counts: tuple[int, ...] = (gpu_count,)
            elif model.kind == ModelKind.IMAGE:
                counts = (1,)  # more GPUs never help one pipeline; see _structural_problems
            else:
                counts = gpus.allowed_counts_for(name)
            out.extend((loc.name, name, c) for c in counts)
    return out


def _rank_key(option: GpuOption) -> tuple[float, int, float, str, str]:
    cost = option.cost_per_million_tokens
    if cost is None:
        cost = option.cost_per_image
    assert cost is not None
    # Nine significant digits: equal costs reached by different float paths tie.
    return (
        float(f"{cost:.9g}"),
        option.gpu_count,
        option.hourly_price,
        option.location,
        option.gpu_type,
    )


def assumptions(model: ModelSpec, concurrency: int, seq_tokens: int) -> dict[str, Any]:
    common: dict[str, Any] = {
        "usableMemoryFraction": USABLE_MEMORY_FRACTION,
        "overheadGbPerGpu": OVERHEAD_GB_PER_GPU,
        "overheadFractionOfWeights": OVERHEAD_FRACTION_OF_WEIGHTS,
        "fittedParameters": perfmodel.describe(fit.current().parameters),
        "heldOutMedianAbsError": fit.current().overall_error,
        "basis": "the step-time model fitted to published measurements (docs/recommendation.md)",
    }
    if model.kind in POOLING_KINDS:
        return {
            "inputsPerBatch": concurrency,
            "tokensPerInput": seq_tokens,
            "costPerMillionTokensCounts": "input tokens",
            **common,
        }
    if model.kind == ModelKind.CHAT:
        return {
            "concurrency": concurrency,
            "contextTokensPerSequence": seq_tokens,
            "averageContextTokens": seq_tokens / 2,
            "minTokensPerSecondPerSequence": MIN_TOKENS_PER_S_PER_SEQUENCE,
            **common,
        }
    return {
        "imagesPerBatch": model.max_n,
        "size": model.to_dict()["defaultSize"],
        "steps": model.default_steps,
        "maxSecondsPerImage": MAX_SECONDS_PER_IMAGE,
        **common,
    }


def recommend(
    model: ModelSpec,
    gpus: GpuCatalog,
    location: str | None = None,
    *,
    gpu_type: str | None = None,
    gpu_count: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    engine_settings: EngineSettings | None = None,
) -> Recommendation:
    """Every offered (location, GPU type, count), fitting ones ranked by cost.

    `location` None considers every location; `gpu_type` / `gpu_count`
    narrow the options (a count the type does not allow comes back rejected,
    with the reason). Raises KeyError for an unknown location or GPU type, or
    a type not offered in the location named.

    `engine_settings`: an endpoint's; the model is sized as its engine will
    hold it (`engine_sizing.sized_for`: context, dtype, FP8 weights or KV
    cache), the KV cache holds at least one sequence of the context they
    set, and their maxNumSeqs caps the concurrency.
    """
    if concurrency < 1 or context_tokens < 1:
        raise ValueError("concurrency and context_tokens must be at least 1")
    model = sized_for(model, engine_settings)
    concurrency = min(concurrency, max_sequences(engine_settings) or concurrency)
    seq_tokens = min(context_tokens, model.chat.context_length) if model.kind in TEXT_KINDS else 0
    full_context = (engine_settings.maxModelLen or 0) if engine_settings is not None else 0
    options = [
        _evaluate(model, gpus, loc, name, count, concurrency, seq_tokens, full_context)
        for loc, name, count in _candidates(model, gpus, location, gpu_type, gpu_count)
    ]
    fitting = sorted((o for o in options if o.fits), key=_rank_key)
    return Recommendation(
        model=model.name,
        location=location,
        currency=gpus.currency,
        options=tuple(fitting),
        rejected=tuple(o for o in options if not o.fits),
        assumptions=MappingProxyType(assumptions(model, concurrency, seq_tokens)),
    )
