"""Sizing an embedding or rerank model for a load: requests/s x tokens per input.

A pooling model decodes nothing: each input is one forward pass (a prefill),
so its cost is input tokens. The fixed-batch recommendation
(`inferd.catalog.recommend`, its fitted prefill model) gives each option's
input tokens/s at a batch of `BATCH` inputs; the load needs
`requests/s x inputs per request x tokens per input` of them, with the
headroom a replica keeps for bursts. Kept apart from the chat and image
workload model (`inferd.catalog.workload`), which it does not change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferd.catalog.gpus import GpuCatalog
from inferd.catalog.models import ModelSpec
from inferd.catalog.recommend import POOLING_KINDS, pooling_tokens_per_s, recommend

BATCH = 16  # inputs per engine step, as the fixed recommendation assumes
# Run each replica at most this busy: a burst of inputs queues instead of
# being refused, and latency stays near one forward pass.
TARGET_UTILISATION = 0.7


@dataclass(frozen=True)
class PoolingWorkload:
    requests_per_s: float
    tokens_per_input: int
    inputs_per_request: int = 1

    @property
    def input_tokens_per_s(self) -> float:
        return self.requests_per_s * self.inputs_per_request * self.tokens_per_input


def size_pooling(
    model: ModelSpec, gpus: GpuCatalog, work: PoolingWorkload, location: str | None = None
) -> dict[str, Any]:
    """Every fitting option with the replicas the load needs, cheapest first.
    ValueError for a model that is not a pooling model, or a load out of range."""
    if model.kind not in POOLING_KINDS:
        raise ValueError(f"model {model.name!r} is a {model.kind} model, not an embedder")
    if work.requests_per_s <= 0 or work.tokens_per_input < 1 or work.inputs_per_request < 1:
        raise ValueError("requests/s must be positive, tokens and inputs per request at least 1")
    if work.tokens_per_input > model.chat.context_length:
        raise ValueError(
            f"{work.tokens_per_input} tokens per input exceed the model's context of "
            f"{model.chat.context_length}"
        )
    fixed = recommend(
        model, gpus, location, concurrency=BATCH, context_tokens=work.tokens_per_input
    )
    need = work.input_tokens_per_s
    options = []
    for option in fixed.options:
        gpu = gpus.gpu_types[option.gpu_type]
        rate = pooling_tokens_per_s(model.chat, gpu, option.gpu_count, BATCH, work.tokens_per_input)
        replicas = max(1, math.ceil(need / (rate * TARGET_UTILISATION)))
        total = replicas * option.hourly_price
        options.append(
            {
                "location": option.location,
                "gpuType": option.gpu_type,
                "gpuCount": option.gpu_count,
                "inputTokensPerSPerReplica": round(rate, 1),
                "replicas": replicas,
                "hourlyPrice": option.hourly_price,
                "totalHourlyPrice": round(total, 4),
                # At the load asked for, not at full utilisation.
                "costPerMillionTokens": round(total / (3600 * need) * 1e6, 6),
                "reasons": list(option.reasons),
            }
        )
    options.sort(key=lambda o: (o["totalHourlyPrice"], o["gpuCount"], o["location"]))
    return {
        "model": model.name,
        "location": location,
        "currency": gpus.currency,
        "workload": {
            "requestsPerSecond": work.requests_per_s,
            "tokensPerInput": work.tokens_per_input,
            "inputsPerRequest": work.inputs_per_request,
            "inputTokensPerS": need,
        },
        "options": options,
        "rejected": [o.to_dict() for o in fixed.rejected],
        "assumptions": {
            "inputsPerBatch": BATCH,
            "targetUtilisation": TARGET_UTILISATION,
            "decode": "none: one forward pass per input",
            "costPerMillionTokensCounts": "input tokens",
        },
    }
