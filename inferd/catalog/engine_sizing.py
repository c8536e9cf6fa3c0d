"""A model as its engine holds it under an endpoint's engine settings (pure).

The recommender sizes memory and speed from a model's architecture facts;
an endpoint's `EngineSettings` change some of them: its context (the KV
cache a sequence may fill), its dtype, FP8 weights quantized as they load,
and an FP8 KV cache. `sized_for` gives the architecture the engine will
actually hold, so every estimate (fit, decode speed, the placement of a
create) follows the settings; `max_sequences` is the batch the settings cap.
"""

from __future__ import annotations

from dataclasses import replace

from inferd.api.engine_settings import EngineSettings
from inferd.catalog.models import TEXT_KINDS, ModelSpec

# vLLM's dtype names -> the catalog's.
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def sized_for(model: ModelSpec, settings: EngineSettings | None) -> ModelSpec:
    """`model` with the architecture its engine holds under `settings`."""
    if settings is None or settings.is_empty() or model.kind not in TEXT_KINDS:
        return model
    arch = model.chat
    if settings.maxModelLen is not None:
        # Never longer than the model's own (the API refuses that anyway).
        arch = replace(arch, context_length=min(settings.maxModelLen, arch.context_length))
    if settings.dtype in DTYPES:
        arch = replace(arch, dtype=DTYPES[settings.dtype])
    if settings.quantization == "fp8" and arch.quantization is None:
        # vLLM quantizes the linear layers as they load; embeddings and the
        # LM head stay in the activation dtype.
        embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
        arch = replace(arch, quantization="fp8", weight_bits=8.0, unquantized_parameters=embeddings)
    if settings.kvCacheDtype is not None and settings.kvCacheDtype.startswith("fp8"):
        arch = replace(arch, kv_cache_dtype="fp8")
    elif settings.kvCacheDtype == "auto":
        arch = replace(arch, kv_cache_dtype=None)
    return replace(model, architecture=arch)


def max_sequences(settings: EngineSettings | None) -> int | None:
    """The batch the settings allow at most (None: the engine's own limit)."""
    return None if settings is None else settings.maxNumSeqs


def chunked_prefill(settings: EngineSettings | None) -> bool:
    """Whether prompt chunks ride in decode steps: vLLM's default (V1 always
    chunks) unless the settings turn it off."""
    return settings is None or settings.enableChunkedPrefill is not False
