"""An endpoint's `EngineSettings` as vLLM engine arguments (pure; no vLLM import).

Each setting is one field of vLLM's `AsyncEngineArgs`, typed on both sides:
the mapping is a table, not a command line. The draft model of speculative
decoding is the one path the replica resolves itself (its weights are on
the replica's machine), so it comes in as an argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferd.api.engine_settings import EngineSettings

# EngineSettings field -> AsyncEngineArgs field, for the settings that map one to one.
VLLM_FIELDS = {
    "maxModelLen": "max_model_len",
    "dtype": "dtype",
    "quantization": "quantization",
    "kvCacheDtype": "kv_cache_dtype",
    "maxNumSeqs": "max_num_seqs",
    "enablePrefixCaching": "enable_prefix_caching",
    "enableChunkedPrefill": "enable_chunked_prefill",
}


def vllm_args(settings: EngineSettings, draft_model_path: Path | None = None) -> dict[str, Any]:
    """vLLM's engine arguments for the settings that are set (the others are
    left to the operator's defaults and vLLM's own)."""
    args: dict[str, Any] = {}
    for ours, theirs in VLLM_FIELDS.items():
        value = getattr(settings, ours)
        if value is not None:
            args[theirs] = value
    if settings.maxLoras:
        # Adapters are added at run time (the replica loads one when a
        # request names it); vLLM keeps max_loras in a batch and evicts the
        # least recently used.
        args["enable_lora"] = True
        args["max_loras"] = settings.maxLoras
        args["max_lora_rank"] = settings.lora_rank
    spec = settings.speculativeDecoding
    if spec is not None:
        args["speculative_config"] = {
            "method": "draft_model",
            "model": str(draft_model_path) if draft_model_path is not None else spec.draftModel,
            "num_speculative_tokens": spec.numSpeculativeTokens,
        }
    return args
