"""Per-endpoint engine settings: one typed object from the API to the engine.

An endpoint carries `EngineSettings` (context length, dtype, quantization,
KV-cache dtype, batch bound, prefix caching, chunked prefill, speculative
decoding). The same object is the request's field, the stored document, the
record's field, what the launcher passes a replica (as one JSON argument)
and what the engine maps to its own arguments
(`inferd.engines.vllm_settings`); no flag strings are glued together on the
way. A field left out (or null) means "the server's default": the
operator's `replica_args`, else the engine's own.

Wire rules as for every management request: strict types, unknown fields
refused, integers bounded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The longest context a setting may ask for (the model's own is checked at
# create and PATCH); bounded so that a number is never an overflow.
MAX_CONTEXT_TOKENS = 10_000_000
MAX_NUM_SEQS_LIMIT = 4096
MAX_SPECULATIVE_TOKENS = 16

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
# vLLM's names of the weight formats a checkpoint can carry (and `fp8`, which
# vLLM can also apply to 16-bit weights as it loads them).
Quantization = Literal[
    "fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "bitsandbytes", "compressed-tensors"
]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
# LoRA: the ranks vLLM reserves room for (its max_lora_rank), and a bound on
# adapter slots per replica (each holds a copy of every adapted matrix).
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
DEFAULT_LORA_RANK = 16
MAX_LORAS = 256


class _Settings(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class SpeculativeDecoding(_Settings):
    """A small draft model proposes tokens that the endpoint's model checks
    in one step: faster decoding when the draft guesses well."""

    draftModel: str = Field(
        min_length=1,
        max_length=128,
        description="A chat model of GET /inference/models with the same tokenizer "
        "(vocabulary) as the endpoint's model.",
    )
    numSpeculativeTokens: int = Field(
        ge=1, le=MAX_SPECULATIVE_TOKENS, description="Tokens the draft proposes per step."
    )


class EngineSettings(_Settings):
    """How the endpoint's replicas run their engine. Omitted or null: the
    server's default (its `replica_args`, else the engine's own)."""

    maxModelLen: int | None = Field(
        default=None,
        ge=16,
        le=MAX_CONTEXT_TOKENS,
        description="Context length (prompt + output tokens); at most the model's own.",
    )
    dtype: Dtype | None = Field(default=None, description="Activations' and 16-bit weights' dtype.")
    quantization: Quantization | None = Field(
        default=None,
        description="Weight format: the checkpoint's own (awq, gptq, ...), or fp8 for a "
        "16-bit checkpoint (quantized as it loads).",
    )
    kvCacheDtype: KvCacheDtype | None = Field(
        default=None, description="KV-cache element type: fp8 halves the cache of a 16-bit model."
    )
    maxNumSeqs: int | None = Field(
        default=None, ge=1, le=MAX_NUM_SEQS_LIMIT, description="Sequences batched at most per step."
    )
    enablePrefixCaching: bool | None = Field(
        default=None, description="Reuse the KV cache of a prompt prefix seen before."
    )
    enableChunkedPrefill: bool | None = Field(
        default=None, description="Split long prompts into chunks batched with decoding."
    )
    speculativeDecoding: SpeculativeDecoding | None = None
    maxLoras: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LORAS,
        description="LoRA adapters one replica serves in the same batch (vLLM's max_loras); "
        "more registered adapters are loaded on demand, the least recently used evicted. "
        "Omitted or 0: the replicas run without LoRA and no adapter can be registered.",
    )
    maxLoraRank: LoraRank | None = Field(
        default=None,
        description="The largest adapter rank the replicas reserve room for (vLLM's "
        f"max_lora_rank). Omitted: {DEFAULT_LORA_RANK}.",
    )

    @property
    def lora_rank(self) -> int:
        """The largest adapter rank the replicas serve."""
        return self.maxLoraRank or DEFAULT_LORA_RANK

    def given(self) -> dict[str, Any]:
        """The settings that are set, as JSON values (camelCase)."""
        return self.model_dump(mode="json", exclude_none=True)

    def is_empty(self) -> bool:
        return not self.given()

    def merged(self, patch: EngineSettings) -> EngineSettings:
        """These settings changed by `patch`, as a JSON merge patch: a field
        the patch names replaces this one (null clears it), the others stay."""
        values = self.given()
        for name in patch.model_fields_set:
            value = getattr(patch, name)
            if value is None:
                values.pop(name, None)
            else:
                values[name] = (
                    value.model_dump(mode="json") if isinstance(value, BaseModel) else value
                )
        return EngineSettings.model_validate(values)

    def overridden_by(self, other: EngineSettings) -> EngineSettings:
        """These settings (defaults) with every setting `other` sets in their place."""
        return EngineSettings.model_validate({**self.given(), **other.given()})

    def to_json(self) -> str:
        """The stored and command-line form: the set fields, keys sorted."""
        return json.dumps(self.given(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> EngineSettings:
        if not text:
            return cls()
        return cls.model_validate_json(text)


NO_ENGINE_SETTINGS = EngineSettings()

# The settings that change what a replica needs (memory, batch), as query
# parameters of a recommendation: an endpoint's answer, before it exists.
SIZING_QUERY = {
    "maxModelLen": int,
    "dtype": str,
    "quantization": str,
    "kvCacheDtype": str,
    "maxNumSeqs": int,
}


def sizing_from_query(params: Mapping[str, str]) -> dict[str, Any]:
    """The sizing settings a query names, typed (an integer that is not one
    is left as text, for the model's validation to refuse by name)."""
    values: dict[str, Any] = {}
    for name, kind in SIZING_QUERY.items():
        raw = params.get(name)
        if raw is None:
            continue
        values[name] = int(raw) if kind is int and raw.lstrip("-").isdigit() else raw
    return values
