"""The recommender sizes a model as its engine holds it under an endpoint's
engine settings: context, dtype, FP8 weights, FP8 KV cache, batch bound."""

from __future__ import annotations

from typing import Any

import pytest

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import load_catalog, recommend
from inferd.catalog.engine_sizing import sized_for
from inferd.catalog.recommend import GpuOption
from inferd.catalog.workload import ChatWorkload, recommend_for_workload
from inferd.control.endpoints.placement import resolve_placement
from inferd.errors import BadRequest

CATALOG = load_catalog()
LLAMA_8B = CATALOG.models.get("llama-3.1-8b-instruct")
LLAMA_70B = CATALOG.models.get("llama-3.1-70b-instruct")


def settings(**values: Any) -> EngineSettings:
    return EngineSettings.model_validate(values)


def option(model_name: str, gpu: str, count: int, value: EngineSettings | None) -> GpuOption:
    rec = recommend(
        CATALOG.models.get(model_name), CATALOG.gpus, "us-east", gpu_type=gpu, gpu_count=count,
        engine_settings=value,
    )  # fmt: skip
    (only,) = rec.options + rec.rejected
    return only


def test_the_architecture_follows_the_settings() -> None:
    arch = LLAMA_8B.chat
    assert sized_for(LLAMA_8B, None) is LLAMA_8B
    assert sized_for(LLAMA_8B, EngineSettings()) is LLAMA_8B
    short = sized_for(LLAMA_8B, settings(maxModelLen=1024)).chat
    assert short.context_length == 1024
    fp8_cache = sized_for(LLAMA_8B, settings(kvCacheDtype="fp8_e5m2")).chat
    assert fp8_cache.kv_bytes_per_token * 2 == arch.kv_bytes_per_token
    fp8 = sized_for(LLAMA_8B, settings(quantization="fp8")).chat
    assert (fp8.quantization, fp8.weight_bits) == ("fp8", 8.0)
    # The linear layers halve; embeddings and the LM head stay 16-bit.
    assert arch.weight_bytes / 2 < fp8.weight_bytes < arch.weight_bytes * 0.6
    assert sized_for(LLAMA_8B, settings(dtype="float32")).chat.weight_bytes == 2 * arch.weight_bytes
    # The catalog's facts do not change, and nothing of an image model does.
    assert LLAMA_8B.chat is arch and "kvCacheDtype" not in arch.to_dict()
    sdxl = CATALOG.models.get("tiny-sdxl")
    assert sized_for(sdxl, settings(maxNumSeqs=2)) is sdxl


def test_fp8_weights_fit_a_70b_model_on_one_h200() -> None:
    bf16 = option("llama-3.1-70b-instruct", "H200", 1, None)
    fp8 = option("llama-3.1-70b-instruct", "H200", 1, settings(quantization="fp8"))
    both = option(
        "llama-3.1-70b-instruct", "H200", 1, settings(quantization="fp8", kvCacheDtype="fp8")
    )
    assert not bf16.fits and fp8.fits and both.fits
    assert both.memory_needed_gb < fp8.memory_needed_gb < bf16.memory_needed_gb
    assert "weights 72.7 GB" in fp8.reasons[0]
    # FP8 weights are read in half the bytes per decode step: faster.
    plain = option("llama-3.1-8b-instruct", "H100-80GB", 1, None).est_output_tokens_per_s
    quick = option("llama-3.1-8b-instruct", "H100-80GB", 1, settings(quantization="fp8"))
    assert plain is not None and quick.est_output_tokens_per_s is not None
    assert quick.est_output_tokens_per_s > plain * 1.2


def test_the_context_and_batch_the_settings_allow_size_the_kv_cache() -> None:
    default = option("llama-3.1-8b-instruct", "L4", 1, None)
    short = option("llama-3.1-8b-instruct", "L4", 1, settings(maxModelLen=1024))
    few = option("llama-3.1-8b-instruct", "L4", 1, settings(maxNumSeqs=4))
    assert not default.fits and short.fits and few.fits
    assert short.memory_needed_gb < default.memory_needed_gb
    # A context longer than the batch's tokens needs room for one whole sequence.
    long = option("llama-3.1-8b-instruct", "H100-80GB", 1, settings(maxModelLen=131072))
    assert "KV cache 17.2 GB" in long.reasons[0]
    rec = recommend(LLAMA_8B, CATALOG.gpus, "us-east", engine_settings=settings(maxNumSeqs=4))
    assert rec.assumptions["concurrency"] == 4


def test_a_workload_is_sized_with_the_settings() -> None:
    work = ChatWorkload(requests_per_s=5, prompt_tokens=1000, output_tokens=200)
    capped = recommend_for_workload(
        LLAMA_8B, CATALOG.gpus, work, "us-east", gpu_type="H100-80GB", gpu_count=1,
        engine_settings=settings(maxNumSeqs=8),
    )  # fmt: skip
    (best,) = capped.options
    assert best.performance is not None and best.performance.batch == 8
    assert "batch 8 (the engine settings' maxNumSeqs; it meets the targets" in best.reasons[0]
    short = recommend_for_workload(
        LLAMA_8B, CATALOG.gpus, work, "us-east", gpu_type="H100-80GB", gpu_count=1,
        engine_settings=settings(maxModelLen=512),
    )  # fmt: skip
    assert (
        not short.options and "exceeds the model's context of 512" in short.rejected[0].reasons[0]
    )


def test_placement_fits_the_model_as_the_settings_hold_it() -> None:
    def place(value: EngineSettings | None) -> str:
        return resolve_placement(
            CATALOG, model_name="llama-3.1-70b-instruct", location_name="us-east",
            gpu_type="H200", gpu_count=1, engine_settings=value,
        ).gpu_type  # fmt: skip

    with pytest.raises(BadRequest) as caught:
        place(None)
    assert caught.value.code == "model_does_not_fit"
    assert place(settings(quantization="fp8")) == "H200"
