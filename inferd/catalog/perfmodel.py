"""The step-time model behind every estimate: how long one engine step takes
on a GPU type, from a handful of named, physically meaningful parameters
fitted to published measurements (`inferd.catalog.fit`).

One step of a chat engine runs the decode of every sequence in flight plus,
with chunked prefill, some prompt tokens of waiting requests. It reads the
weights once (all but the input embedding table, of which a step looks up
only its tokens' rows: `weight_read_bytes`) and each decoding sequence's KV
cache, and computes 2 x parameters FLOPs per token plus attention. Its time
is the slower of

    bytes read / (peak bandwidth x bandwidthEfficiency[generation]
                  x weightOnlyBandwidthFactor for AWQ/GPTQ weights)
    FLOPs / (peak tensor FLOP/s x computeEfficiency[generation]
             x 2 x fp8ComputeFactor where FP8 weights meet FP8 tensor cores)

(measurements taken with TensorRT-LLM: computeEfficiency x
tensorrtLlmComputeFactor; the estimates are of vLLM) plus
`stepOverheadSeconds` (scheduling, kernel launches) and
`sequenceOverheadSeconds` per decoding sequence (sampling, detokenizing,
the scheduler's bookkeeping). Tensor
parallelism over N GPUs multiplies both rates by N x tpScalingPerDoubling ^
log2(N). An FP8 KV cache halves its bytes. An image step is the UNet's FLOPs
at imageComputeRatio x computeEfficiency[generation] x
imageEfficiency[generation] (an adjustment, prior 1: diffusion kernels reach
about the same share of what the LLM GEMMs reach on every generation, so a
generation without image figures carries its LLM compute efficiency over;
x compiledImageSpeedup where the pipeline is compiled), with
`imageOverheadSeconds` per image.

Decode reads each sequence's KV cache through the engine's attention kernels.
Current vLLM (V1, 0.8 and later) is the reference: its KV read runs at the
weights' bandwidth efficiency. An older engine reads it at
attentionEfficiency[engine class] of that (`engine_traits`): paged-attention
kernels of vLLM V0 and TensorRT-LLM's earlier releases handled grouped-query
heads less well, so a long-context figure measured with them is fitted with
its own factor instead of bending the model of current vLLM.

Prefill and decode: with chunked prefill (vLLM V1 and the engine settings'
default) a step carries the decodes and prompt chunks together, so a prompt's
compute hides the decodes' weight read. Without it (`enableChunkedPrefill:
false`, vLLM V0's default) a prompt runs as a pass of its own and the two add
up (`loaded_step`).

Generations: ampere (A100, A10G), ada (L40S, L4), hopper (H100, H200). Ada
and Hopper have FP8 tensor cores at twice the 16-bit peak; on Ampere FP8
weights are read as 8 bits but computed in 16.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferd.catalog.gpus import GpuType
from inferd.catalog.models import ChatArchitecture, ImageArchitecture

GENERATIONS = ("ampere", "ada", "hopper")
FP8_GENERATIONS = frozenset({"ada", "hopper"})
_PER_GENERATION = ("bandwidthEfficiency", "computeEfficiency", "imageEfficiency")
# Engine classes whose attention kernels differ from current vLLM's (the
# reference, factor 1): see `engine_traits`.
ATTENTION_CLASSES = ("vllm-v0", "tensorrt-llm-0", "tensorrt-llm-1")
_GLOBAL = (
    "fp8ComputeFactor",
    "weightOnlyBandwidthFactor",
    "stepOverheadSeconds",
    "sequenceOverheadSeconds",
    "tpScalingPerDoubling",
    "tensorrtLlmComputeFactor",
    "nimComputeFactor",
    "nimBandwidthFactor",
    "compiledImageSpeedup",
    "imageOverheadSeconds",
    "imageComputeRatio",
)

# Starting points and the prior the fit is pulled towards where data is
# thin: the roofline's former constants (75% of bandwidth, 50% of compute,
# images at 90% of that, 3 ms a step, 0.9 per TP doubling over NVLink).
PRIOR: Mapping[str, float] = {
    **{f"{name}.{gen}": value for gen in GENERATIONS for name, value in (
        ("bandwidthEfficiency", 0.75), ("computeEfficiency", 0.5), ("imageEfficiency", 1.0))},
    **{f"attentionEfficiency.{cls}": 1.0 for cls in ATTENTION_CLASSES},
    "fp8ComputeFactor": 0.8,
    "weightOnlyBandwidthFactor": 0.8,
    "stepOverheadSeconds": 0.003,
    "sequenceOverheadSeconds": 0.00002,
    "tpScalingPerDoubling": 0.9,
    "tensorrtLlmComputeFactor": 1.0,
    "nimComputeFactor": 1.0,
    "nimBandwidthFactor": 1.0,
    "compiledImageSpeedup": 1.3,
    "imageOverheadSeconds": 0.1,
    "imageComputeRatio": 0.9,
}  # fmt: skip
PARAMETER_NAMES: tuple[str, ...] = tuple(PRIOR)
# A CPU "GPU" has no published figures: it keeps the prior, as Ampere would.
_FALLBACK_GENERATION = "ampere"


@dataclass(frozen=True)
class Parameters:
    values: Mapping[str, float]

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    def per_generation(self, name: str, generation: str) -> float:
        key = f"{name}.{generation}"
        if key not in self.values:
            key = f"{name}.{_FALLBACK_GENERATION}"
        return self.values[key]

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.values.items()}


PRIOR_PARAMETERS = Parameters(dict(PRIOR))


@dataclass(frozen=True)
class Precision:
    """How a model runs: weights, KV cache."""

    weights: str = "bf16"  # bf16 | fp16 | fp32 | fp8 | int8 | int4
    kv_cache: str = "auto"  # auto (the weights' 16-bit type) | fp8

    @property
    def weight_bits(self) -> float:
        return {"fp32": 32, "fp8": 8, "int8": 8, "int4": 4.16}.get(self.weights, 16.0)

    @property
    def kv_bytes(self) -> int:
        return 1 if self.kv_cache == "fp8" else (4 if self.weights == "fp32" else 2)

    @property
    def label(self) -> str:
        if self.weights in ("bf16", "fp16"):
            return "16-bit"
        return self.weights.upper()


# The key `for_engine` sets: the attention efficiency of the engine a step
# runs in (absent: current vLLM's, 1).
ACTIVE_ATTENTION = "attentionEfficiency"
# Engine families whose kernels reach another fraction of peak compute.
_COMPUTE_FACTORS = {"tensorrt-llm": "tensorrtLlmComputeFactor", "nim": "nimComputeFactor"}
# vLLM's V1 engine (default from 0.8): chunked prefill always, new kernels.
_VLLM_V1 = (0, 8)


@dataclass(frozen=True)
class EngineTraits:
    """What the model tells apart about the engine a figure was measured with."""

    family: str  # "vllm" | "tensorrt-llm" | "nim" | "other"
    attention_class: str | None  # None: current vLLM's kernels (the reference)
    chunked_prefill: bool  # prompt chunks ride in decode steps


def _version(text: str) -> tuple[int, int] | None:
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def engine_traits(engine: str) -> EngineTraits:
    """From a figure's engine as `published.yaml` names it ("vLLM 0.6.3",
    "TensorRT-LLM 0.6.1", "NVIDIA NIM 1.8.0 (TensorRT-LLM)"). vLLM before
    0.8 ran its V0 engine, chunked prefill off by default; a vLLM without a
    version (a CI build) counts as current. TensorRT-LLM's in-flight batching
    puts whole prompts into decode steps, which the step model treats as
    chunked (the two share one weight read)."""
    low = engine.lower()
    if "tensorrt-llm" in low:
        major = (_version(low.split("tensorrt-llm", 1)[1]) or (1, 0))[0]
        return EngineTraits("tensorrt-llm", f"tensorrt-llm-{min(major, 1)}", True)
    if "nim" in low.split():
        # NVIDIA NIM runs TensorRT-LLM or vLLM profiles; where the source does
        # not say which, its compute gets a factor of its own.
        return EngineTraits("nim", None, True)
    if low.startswith("vllm"):
        version = _version(low)
        if version is not None and version < _VLLM_V1:
            return EngineTraits("vllm", "vllm-v0", False)
        return EngineTraits("vllm", None, True)
    return EngineTraits("other", None, True)


def for_engine(params: Parameters, engine: str) -> Parameters:
    """The parameters as a measurement's engine sees them. The model is of
    current vLLM (what inferd serves with); TensorRT-LLM's fused GEMM and
    attention kernels reach a different fraction of peak compute, one factor
    for every generation (`tensorrtLlmComputeFactor`), and an older engine's
    attention kernels read the KV cache at its class's attention efficiency."""
    traits = engine_traits(engine)
    values = dict(params.values)
    if traits.family in _COMPUTE_FACTORS:
        factor = params[_COMPUTE_FACTORS[traits.family]]
        values = {k: v * factor if k.startswith("computeEfficiency.") else v
                  for k, v in values.items()}  # fmt: skip
    if traits.family == "nim":
        # Neither the kernels nor the parallel runtime are known: its decode
        # reads get a factor of their own too.
        factor = params["nimBandwidthFactor"]
        values = {k: v * factor if k.startswith("bandwidthEfficiency.") else v
                  for k, v in values.items()}  # fmt: skip
    if traits.attention_class is not None:
        values[ACTIVE_ATTENTION] = params[f"attentionEfficiency.{traits.attention_class}"]
    return Parameters(values)


def precision_of(arch: ChatArchitecture, kv_cache: str | None = None) -> Precision:
    """The precision a catalog architecture runs at (its KV cache: as asked,
    else as the architecture's engine settings chose, else 16-bit)."""
    if kv_cache is None:
        kv_cache = "fp8" if (arch.kv_cache_dtype or "").startswith("fp8") else "auto"
    q = (arch.quantization or "").lower()
    if q == "fp8":
        return Precision("fp8", kv_cache)
    if q in ("awq", "gptq", "compressed-tensors", "marlin"):
        bits = arch.weight_bits or 4.0
        return Precision("int8" if bits > 6 else "int4", kv_cache)
    return Precision(arch.dtype if arch.dtype in ("fp32", "fp16", "bf16") else "bf16", kv_cache)


def generation(gpu: GpuType) -> str:
    return gpu.generation


def tp_scale(params: Parameters, gpu: GpuType, count: int) -> float:
    if count <= 1:
        return 1.0
    per_doubling = (
        params["tpScalingPerDoubling"]
        if gpu.interconnect == "nvlink"
        else (params["tpScalingPerDoubling"] - 0.1)
    )
    return count * per_doubling ** math.log2(count)


def weight_bytes(arch: ChatArchitecture, precision: Precision) -> float:
    """Weights as loaded: embeddings and LM head stay 16-bit under AWQ/GPTQ/FP8."""
    if precision.weights in ("bf16", "fp16", "fp32"):
        return float(arch.parameters * (4 if precision.weights == "fp32" else 2))
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    quantized = arch.parameters - embeddings
    return quantized * precision.weight_bits / 8 + embeddings * 2


def weight_read_bytes(arch: ChatArchitecture, precision: Precision) -> float:
    """Weight bytes one engine step reads: all of them but the input
    embedding table, which is a lookup of the step's tokens' rows, not a
    read of the table. Where the embeddings are tied, the LM head reads that
    same table in full, so nothing is left out."""
    if arch.tie_word_embeddings:
        return weight_bytes(arch, precision)
    element = 4 if precision.weights == "fp32" else 2  # embeddings stay 16-bit when quantized
    return weight_bytes(arch, precision) - arch.vocab_size * arch.hidden_size * element


def kv_bytes_per_token(arch: ChatArchitecture, precision: Precision, count: int = 1) -> float:
    replication = max(1.0, count / arch.kv_heads)
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * precision.kv_bytes * replication


def _compute_rate(params: Parameters, gpu: GpuType, precision: Precision) -> float:
    """Achievable dense FLOP/s of one GPU for this precision."""
    eff = params.per_generation("computeEfficiency", gpu.generation)
    peak = gpu.bf16_tflops * 1e12
    if precision.weights == "fp8" and gpu.generation in FP8_GENERATIONS:
        return peak * 2 * eff * params["fp8ComputeFactor"]
    if precision.weights == "fp32":
        return peak * 0.5 * eff  # TF32
    return peak * eff


def image_efficiency(params: Parameters, generation: str) -> float:
    """The fraction of the 16-bit peak an uncompiled diffusion pipeline reaches."""
    return (
        params["imageComputeRatio"]
        * params.per_generation("computeEfficiency", generation)
        * params.per_generation("imageEfficiency", generation)
    )


def _bandwidth(params: Parameters, gpu: GpuType, precision: Precision) -> float:
    eff = params.per_generation("bandwidthEfficiency", gpu.generation)
    if precision.weights in ("int4", "int8"):
        eff *= params["weightOnlyBandwidthFactor"]
    return gpu.memory_bandwidth_gbps * 1e9 * eff


@dataclass(frozen=True)
class StepTime:
    memory_s: float  # reading weights and KV cache at the fitted bandwidth
    compute_s: float  # the FLOPs at the fitted compute rate
    fixed_s: float  # step and per-sequence overheads

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s) + self.fixed_s

    @property
    def bound(self) -> str:
        return "memory-bandwidth" if self.memory_s >= self.compute_s else "compute"


def step_seconds(
    params: Parameters,
    arch: ChatArchitecture,
    precision: Precision,
    gpu: GpuType,
    count: int,
    decoding: float,
    context: float,
    prefill_tokens: float = 0.0,
    prefill_context: float = 0.0,
) -> float:
    """One engine step: `decoding` sequences each attending to `context`
    tokens, plus `prefill_tokens` prompt tokens attending to
    `prefill_context` tokens on average."""
    return step_time(
        params, arch, precision, gpu, count, decoding, context, prefill_tokens, prefill_context
    ).seconds


def step_time(
    params: Parameters,
    arch: ChatArchitecture,
    precision: Precision,
    gpu: GpuType,
    count: int,
    decoding: float,
    context: float,
    prefill_tokens: float = 0.0,
    prefill_context: float = 0.0,
) -> StepTime:
    """`step_seconds`, with which roof bounds it."""
    scale = tp_scale(params, gpu, count)
    kv = kv_bytes_per_token(arch, precision, count)
    # Decode attention reads the cache through the engine's kernels.
    attention_read = decoding * context * kv / params.values.get(ACTIVE_ATTENTION, 1.0)
    bytes_read = weight_read_bytes(arch, precision) + attention_read + prefill_tokens * kv
    attention = 4 * arch.layers * arch.attention_heads * arch.head_dim
    flops = (decoding + prefill_tokens) * 2 * arch.parameters + attention * (
        decoding * context + prefill_tokens * prefill_context
    )
    t_memory = bytes_read / (_bandwidth(params, gpu, precision) * scale)
    t_compute = flops / (_compute_rate(params, gpu, precision) * scale)
    fixed = params["stepOverheadSeconds"] + decoding * params["sequenceOverheadSeconds"]
    return StepTime(t_memory, t_compute, fixed)


def prefill_seconds(
    params: Parameters,
    arch: ChatArchitecture,
    precision: Precision,
    gpu: GpuType,
    count: int,
    prompt_tokens: int,
    sequences: int = 1,
) -> float:
    """`sequences` prompts of `prompt_tokens` through the model in one pass."""
    return step_seconds(
        params, arch, precision, gpu, count, 0, 0,
        prefill_tokens=sequences * prompt_tokens, prefill_context=prompt_tokens / 2,
    )  # fmt: skip


def kv_capacity_tokens(
    arch: ChatArchitecture, precision: Precision, gpu: GpuType, count: int, fraction: float
) -> float:
    """Tokens of KV cache that fit beside the weights in `fraction` of memory."""
    free = count * gpu.total_memory_gb * 1e9 * fraction - weight_bytes(arch, precision)
    free -= 1.5e9 * count  # CUDA context, graphs, activations
    return max(0.0, free / kv_bytes_per_token(arch, precision, count))


@dataclass(frozen=True)
class LoadedStep:
    """vLLM's scheduler at `concurrency` requests in flight, in steady state."""

    decoding: float  # sequences decoding in each step
    prefill_tokens: float  # prompt tokens chunked into each step (0: separate passes)
    step_s: float  # = mean time per output token
    ttft_s: float  # mean time to first token
    output_tokens_per_s: float
    prefill_s: float = 0.0  # the prompt's own prefill at this load (<= ttft_s)


def own_prefill_seconds(
    params: Parameters,
    arch: ChatArchitecture,
    precision: Precision,
    gpu: GpuType,
    count: int,
    prompt_tokens: int,
    token_budget: int,
    decoding: float = 0.0,
    context: float = 0.0,
    chunked_prefill: bool = True,
) -> float:
    """One prompt's prefill while `decoding` other sequences (attending to
    `context` tokens) decode. Chunked: the prompt is cut into the budget the
    decodes leave free, each chunk a step that also carries the decodes (and
    attends to the chunks before it). Not chunked: one pass of its own. Never
    below the prompt's prefill with nothing else running."""
    alone = prefill_seconds(params, arch, precision, gpu, count, prompt_tokens)
    if not chunked_prefill or prompt_tokens <= 0:
        return alone
    chunk = max(1.0, token_budget - decoding)
    total, done = 0.0, 0.0
    while done < prompt_tokens:
        tokens = min(chunk, prompt_tokens - done)
        total += step_seconds(
            params, arch, precision, gpu, count, decoding, context, tokens, done + tokens / 2
        )
        done += tokens
    return max(total, alone)


def loaded_step(
    params: Parameters,
    arch: ChatArchitecture,
    precision: Precision,
    gpu: GpuType,
    count: int,
    concurrency: float,
    prompt_tokens: int,
    output_tokens: int,
    token_budget: int,
    chunked_prefill: bool = True,
) -> LoadedStep:
    """Continuous batching at `concurrency` requests in flight.

    Chunked prefill: every step carries each decoding sequence's next token
    and, up to `token_budget` tokens per step, prompt chunks of requests
    waiting to start. In steady state a request's prompt is spread over its
    `output_tokens` decode steps, so a step holds decoding x prompt/output
    prefill tokens. When that exceeds the budget, prefill is the bottleneck:
    fewer sequences decode and the rest wait.

    Without chunked prefill a prompt runs as a pass of its own between decode
    steps, so while a batch decodes its `output_tokens` steps the batch's
    prompts also run: the time per output token is the decode step plus
    their prefill spread over the output, the two added up.

    TTFT = the wait for a slot (Little's law on the requests not decoding) +
    the step in progress when the request arrives (half of one, on average,
    when other requests are in flight) + the prompt's own prefill at this
    load; never below the prompt's prefill time."""
    ratio = prompt_tokens / max(1, output_tokens)
    context = prompt_tokens + output_tokens / 2
    others = max(0.0, concurrency - 1) / max(1, concurrency)
    if chunked_prefill:
        decoding = min(float(concurrency), token_budget / (1 + ratio))
        prefill = decoding * ratio
        step = step_seconds(
            params, arch, precision, gpu, count, decoding, context, prefill, prompt_tokens / 2
        )
    else:
        decoding, prefill = float(concurrency), 0.0
        decode = step_seconds(params, arch, precision, gpu, count, decoding, context)
        # The batch's prompts, in passes of up to the budget (a whole prompt at least).
        per_pass = min(max(1, token_budget // max(1, prompt_tokens)), math.ceil(concurrency))
        passes = concurrency / per_pass
        prompts = prefill_seconds(params, arch, precision, gpu, count, prompt_tokens, per_pass)
        step = decode + passes * prompts / max(1, output_tokens)
    own = own_prefill_seconds(
        params, arch, precision, gpu, count, prompt_tokens, token_budget,
        decoding * others, context, chunked_prefill,
    )  # fmt: skip
    # Requests not decoding wait for a slot: Little's law on the queue.
    waiting = concurrency - decoding
    rate = decoding / (output_tokens * step)  # requests finishing per second
    queue = (waiting / rate if waiting > 0 else 0.0) + others * step / 2
    return LoadedStep(decoding, prefill, step, queue + own, decoding / step, own)


def image_seconds(
    params: Parameters,
    arch: ImageArchitecture,
    gpu: GpuType,
    batch: int,
    steps: int,
    pixel_scale: float = 1.0,
    compiled: bool = False,
) -> float:
    """Seconds for one batch of `batch` images denoised together."""
    evaluations = steps * arch.guidance_evaluations
    tflops = (evaluations * arch.unet_tflops_per_step + arch.vae_decode_tflops) * pixel_scale
    eff = image_efficiency(params, gpu.generation)
    if compiled:
        eff *= params["compiledImageSpeedup"]
    rate = gpu.bf16_tflops * eff * (0.5 if arch.dtype == "fp32" else 1.0)
    unet_bytes = arch.unet_parameters * arch.bytes_per_param
    t_memory = (
        evaluations
        * unet_bytes
        / (
            gpu.memory_bandwidth_gbps
            * 1e9
            * params.per_generation("bandwidthEfficiency", gpu.generation)
        )
    )
    return max(batch * tflops / rate, t_memory) + batch * params["imageOverheadSeconds"]


def describe(params: Parameters) -> dict[str, Any]:
    """The parameters by generation, for answers and the report."""
    out: dict[str, Any] = {
        gen: {name: round(params[f"{name}.{gen}"], 4) for name in _PER_GENERATION}
        for gen in GENERATIONS
    }
    out.update({name: round(params[name], 5) for name in _GLOBAL})
    out["attentionEfficiency"] = {
        cls: round(params[f"attentionEfficiency.{cls}"], 4) for cls in ATTENTION_CLASSES
    }
    return out
