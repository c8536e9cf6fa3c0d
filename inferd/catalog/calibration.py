"""Published measurements of catalog models, next to the recommender's
estimate for the same setting: how far off the roofline is.

`scripts/recommendation_table.py` renders these rows into
`docs/recommendation.md`; a unit test holds the median absolute error to
the goal. A row names its source; the figures are copied, not measured here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from inferd.catalog import Catalog
from inferd.catalog.models import ChatArchitecture
from inferd.catalog.recommend import decode_tokens_per_s, image_seconds

MEDIAN_ERROR_GOAL = 0.25

QWEN_SPEED = "https://qwen.readthedocs.io/en/latest/benchmark/speed_benchmark.html"
RESULTS = "benchmarks/RESULTS.md (gpu_images, 2026, one H100 80GB HBM3)"
# AWQ and GPTQ group-wise 4-bit weights: 4 bits plus scales and zeros.
_QUANT_BITS = {"AWQ": 4.16, "GPTQ-Int4": 4.16, "GPTQ-Int8": 8.0}


@dataclass(frozen=True)
class Published:
    model: str  # catalog name
    gpu_type: str
    gpu_count: int
    setting: str  # what was measured, in words
    metric: str  # "tokens/s" (one sequence) or "s/image"
    value: float
    source: str
    quantization: str = "BF16"
    input_tokens: int = 1
    output_tokens: int = 2048


# Qwen's own speed benchmark: vLLM 0.6.3, A100 80GB, one sequence,
# 2048 output tokens, input length as given.
PUBLISHED: tuple[Published, ...] = (
    Published("qwen2.5-0.5b-instruct", "A100-80GB", 1, "vLLM, batch 1, input 1", "tokens/s",
              311.55, QWEN_SPEED),
    Published("qwen2.5-1.5b-instruct", "A100-80GB", 1, "vLLM, batch 1, input 1", "tokens/s",
              183.33, QWEN_SPEED),
    Published("qwen2.5-7b-instruct", "A100-80GB", 1, "vLLM, batch 1, input 1", "tokens/s",
              84.28, QWEN_SPEED),
    Published("qwen2.5-7b-instruct", "A100-80GB", 1, "vLLM, batch 1, input 14336", "tokens/s",
              77.69, QWEN_SPEED, input_tokens=14336),
    Published("qwen2.5-7b-instruct", "A100-80GB", 1, "vLLM, batch 1, input 1, AWQ", "tokens/s",
              148.10, QWEN_SPEED, quantization="AWQ"),
    Published("qwen2.5-7b-instruct", "A100-80GB", 1, "vLLM, batch 1, input 1, GPTQ-Int8",
              "tokens/s", 122.01, QWEN_SPEED, quantization="GPTQ-Int8"),
    Published("qwen2.5-72b-instruct", "A100-80GB", 4, "vLLM, batch 1, input 1, TP 4",
              "tokens/s", 31.37, QWEN_SPEED),
    Published("qwen2.5-72b-instruct", "A100-80GB", 2, "vLLM, batch 1, input 1, AWQ, TP 2",
              "tokens/s", 44.30, QWEN_SPEED, quantization="AWQ"),
    Published("sdxl-base-1.0", "H100-80GB", 1, "1024x1024, 30 steps, engine default",
              "s/image", 2.59, RESULTS),
    Published("sdxl-base-1.0", "H100-80GB", 1, "1024x1024, 30 steps, engine optimize=True",
              "s/image", 1.50, RESULTS),
)  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    row: Published
    estimate: float

    @property
    def error(self) -> float:
        """Signed relative error of the estimate against the published figure."""
        return (self.estimate - self.row.value) / self.row.value


def quantized(arch: ChatArchitecture, scheme: str) -> ChatArchitecture:
    """The architecture with weight-only quantization: embeddings and the LM
    head stay in bf16, as in Qwen's AWQ and GPTQ checkpoints."""
    if scheme == "BF16":
        return arch
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return replace(
        arch,
        quantization=scheme.split("-")[0].lower(),
        weight_bits=_QUANT_BITS[scheme],
        unquantized_parameters=embeddings,
    )


def estimate(row: Published, catalog: Catalog) -> float:
    spec = catalog.models.get(row.model)
    gpu = catalog.gpus.gpu_type(row.gpu_type)
    if row.metric == "s/image":
        return image_seconds(spec, gpu)[0]
    arch = quantized(spec.chat, row.quantization)
    seq = row.input_tokens + row.output_tokens
    avg_context = row.input_tokens + row.output_tokens / 2
    rate, _ = decode_tokens_per_s(arch, gpu, row.gpu_count, 1, seq, avg_context=avg_context)
    return rate


def compare(catalog: Catalog) -> list[Comparison]:
    return [Comparison(row, estimate(row, catalog)) for row in PUBLISHED]


def median_absolute_error(comparisons: list[Comparison]) -> float:
    return statistics.median(abs(c.error) for c in comparisons)
