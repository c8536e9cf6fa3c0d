"""The GPU recommender, against numbers worked out by hand.

Two kinds of cases: the real catalog (70B on H100s/H200, 0.5B on an L4; the
GPU figures are datasheet facts) and a hand-made GPU table with round
numbers, where every throughput and cost below is computed in the comments.
The arithmetic runs with the performance model's prior parameters pinned
(75% of bandwidth, 50% of compute, 45% for images, 3 ms a step, 0.9 per TP
doubling, 0.1 s an image, no per-sequence cost); the fitted values are held
to published measurements in test_calibration.py.
"""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from inferd.catalog import (
    Catalog,
    ChatArchitecture,
    GpuCatalog,
    GpuOption,
    GpuType,
    ImageArchitecture,
    Location,
    ModelSpec,
    load_catalog,
    recommend,
)
from inferd.catalog import fit as fit_module
from inferd.catalog.bands import conformal_band
from inferd.catalog.perfmodel import PRIOR, Parameters


def _pin(monkeypatch: pytest.MonkeyPatch, **overrides: float) -> None:
    params = Parameters({**PRIOR, "sequenceOverheadSeconds": 0.0, **overrides})
    monkeypatch.setattr(fit_module, "_CURRENT", fit_module.Fitted(params, {}, 0.1))


@pytest.fixture(autouse=True)
def prior_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    _pin(monkeypatch)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _option(rec_options: tuple[GpuOption, ...], gpu_type: str, count: int) -> GpuOption:
    matches = [o for o in rec_options if o.gpu_type == gpu_type and o.gpu_count == count]
    assert len(matches) == 1, f"{count} x {gpu_type} not among {[o.label for o in rec_options]}"
    return matches[0]


# --- the real catalog -------------------------------------------------------------
#
# llama-3.1-70b-instruct: 70,553,706,496 parameters, bf16 -> weights 141.107 GB.
# KV per token: 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 B.
# Default: 16 sequences x 4096 tokens -> 65,536 tokens x 327,680 B = 21.475 GB.
# Overhead: 1.5 GB per GPU + 2% of weights (2.822 GB).
#   1 GPU: 141.107 + 21.475 + 4.322 = 166.90 GB;  2 GPUs: 168.40;  4 GPUs: 171.40
# Usable per GPU (0.9 of the driver's total, GB of 10^9 bytes):
#   H100 80GB: 81,559 MiB = 85.521 GB -> 76.97;  H200: 143,771 MiB = 150.755 GB -> 135.68
#   2 x H100: 153.94 < 168.40 (no); 4 x H100: 307.87 (yes)
#   1 x H200: 135.68 < 141.1 of weights alone (no); 2 x H200: 271.36 (yes)
# At concurrency 4: KV 5.369 GB -> 2 GPUs need 141.107 + 5.369 + 5.822 = 152.30 <= 153.94.
FIT_CASES = [
    # model, gpu type, count, concurrency, fits
    ("llama-3.1-70b-instruct", "H100-80GB", 1, 16, False),
    ("llama-3.1-70b-instruct", "H100-80GB", 2, 16, False),
    ("llama-3.1-70b-instruct", "H100-80GB", 2, 4, True),
    ("llama-3.1-70b-instruct", "H100-80GB", 4, 16, True),
    ("llama-3.1-70b-instruct", "A100-80GB", 1, 1, False),
    ("llama-3.1-70b-instruct", "H200", 1, 1, False),
    ("llama-3.1-70b-instruct", "H200", 2, 16, True),
    # 8 x L4: 8 x 24.15 x 0.9 = 173.9 GB < 141.1 + 21.5 + 12 + 2.8 = 177.4 GB
    ("llama-3.1-70b-instruct", "L4", 8, 16, False),
    # 0.5B: 0.988 GB weights + 0.805 GB KV (12,288 B/token x 65,536) + 1.52 overhead
    ("qwen2.5-0.5b-instruct", "L4", 1, 16, True),
    # 8B: 16.06 + 8.59 + 1.82 = 26.5 GB > 21.7 GB usable on a 24 GB card
    ("llama-3.1-8b-instruct", "L4", 1, 16, False),
    ("llama-3.1-8b-instruct", "L40S", 1, 16, True),
    ("sdxl-base-1.0", "H100-80GB", 1, 16, True),
    # SDXL: 6.94 GB weights + 4 images x 3.7 GB + 1.64 GB = 23.4 GB > 21.7 GB usable
    ("sdxl-base-1.0", "L4", 1, 16, False),
    ("sdxl-turbo", "L4", 1, 16, True),
]


@pytest.mark.parametrize(("model", "gpu_type", "count", "concurrency", "fits"), FIT_CASES)
def test_fit_on_the_real_catalog(
    catalog: Catalog, model: str, gpu_type: str, count: int, concurrency: int, fits: bool
) -> None:
    rec = recommend(
        catalog.models.get(model),
        catalog.gpus,
        "us-east",
        gpu_type=gpu_type,
        gpu_count=count,
        concurrency=concurrency,
    )
    option = _option(rec.options + rec.rejected, gpu_type, count)
    assert option.fits is fits, option.reasons
    assert (option in rec.options) is fits


def test_70b_on_one_h100_says_why(catalog: Catalog) -> None:
    rec = recommend(catalog.models.get("llama-3.1-70b-instruct"), catalog.gpus, "us-east")
    one = _option(rec.rejected, "H100-80GB", 1)
    assert one.reasons == (
        "needs 166.9 GB (weights 141.1 GB + KV cache 21.5 GB + overhead 4.3 GB); "
        "1 x H100-80GB has 77.0 GB usable",
    )
    assert one.memory_needed_gb == pytest.approx(166.90, abs=0.01)
    assert one.est_output_tokens_per_s is None and one.cost_per_million_tokens is None
    # Two fit the weights but not 16 x 4096 tokens of KV cache: say how many would.
    two = _option(rec.rejected, "H100-80GB", 2)
    assert "room for 5 sequences of 4096 tokens" in two.reasons[0]
    assert all(o.gpu_count >= 2 for o in rec.options)


def test_70b_four_h100_estimate(catalog: Catalog) -> None:
    # Step reads 141.107 GB of weights less the input embedding table (a lookup:
    # 128,256 x 8,192 x 2 B = 2.101 GB) + 16 x 2048 x 327,680 B = 10.737 GB of KV
    # = 149.743 GB at 4 x 3350 GB/s x 0.75 x 0.9^2 (NVLink, two doublings) = 8140.5 GB/s
    # -> 18.395 ms; compute (16 x 141.2 GFLOP at 4 x 989 x 0.5 x 0.81 TFLOP/s) is
    # 1.41 ms; + 3 ms overhead -> 21.395 ms per step -> 16 / 0.021395 = 747.8 tokens/s.
    # Cost: 4 x 2.99 USD/h / (3600 x 747.8) x 1e6 = 4.442 USD per million tokens.
    rec = recommend(
        catalog.models.get("llama-3.1-70b-instruct"),
        catalog.gpus,
        "us-east",
        gpu_type="H100-80GB",
        gpu_count=4,
    )
    (option,) = rec.options
    assert option.hourly_price == pytest.approx(4 * 2.99)
    assert option.est_output_tokens_per_s == pytest.approx(747.8, rel=1e-3)
    assert option.cost_per_million_tokens == pytest.approx(4.442, rel=1e-3)
    assert "memory-bandwidth-bound" in option.reasons[1]


def test_heads_must_split_over_the_gpus(catalog: Catalog) -> None:
    rec = recommend(catalog.models.get("qwen2.5-0.5b-instruct"), catalog.gpus, "us-east")
    four = _option(rec.rejected, "L4", 4)
    assert "14 attention heads do not split evenly over 4 GPUs" in four.reasons[0]
    assert _option(rec.options, "L4", 2).fits


def test_cpu_holds_but_cannot_serve_an_8b_model(catalog: Catalog) -> None:
    rec = recommend(catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus, "local")
    (cpu,) = rec.rejected
    assert cpu.memory_needed_gb <= cpu.memory_available_gb
    assert cpu.est_output_tokens_per_s is not None and cpu.est_output_tokens_per_s < 16 * 5
    assert "too slow" in cpu.reasons[-1]
    assert rec.best() is None
    # The tiny model is served locally, for nothing.
    tiny = recommend(catalog.models.get("tiny-chat"), catalog.gpus, "local")
    best = tiny.best()
    assert best is not None and (best.gpu_type, best.hourly_price) == ("cpu", 0.0)


# --- a hand-made GPU table ------------------------------------------------------------


def _gpu(name: str, memory_gb: float, bandwidth: float, tflops: float = 100) -> GpuType:
    return GpuType(name, name, memory_gb, bandwidth, tflops, interconnect="nvlink")


def _gpus(
    offers: dict[str, float], *types: GpuType, counts: tuple[int, ...] = (1, 2)
) -> GpuCatalog:
    return GpuCatalog(
        gpu_types=MappingProxyType({g.name: g for g in types}),
        locations=MappingProxyType({"here": Location("here", "test", MappingProxyType(offers))}),
        currency="EUR",
        allowed_counts=counts,
    )


# 10e9 parameters in bf16 (20 GB); 10 layers, 10 heads, 2 KV heads of 100:
# KV = 2 x 10 x 2 x 100 x 2 B = 8,000 B per token. Context 1000 tokens.
ROUND_CHAT = ModelSpec(
    name="round",
    kind="chat",
    source="builtin:none",
    description="round numbers",
    architecture=ChatArchitecture(
        family="llama",
        parameters=10_000_000_000,
        layers=10,
        hidden_size=1000,
        intermediate_size=4000,
        attention_heads=10,
        kv_heads=2,
        head_dim=100,
        vocab_size=1000,
        context_length=1000,
        dtype="bf16",
        tie_word_embeddings=False,
    ),
)
FAST, MID, SLOW = _gpu("fast", 100, 2000), _gpu("mid", 100, 1000), _gpu("slow", 100, 500)
SMALL = _gpu("small", 16, 1000)
TABLE = _gpus({"fast": 1.5, "mid": 1.0, "slow": 0.5, "small": 0.8}, FAST, MID, SLOW, SMALL)


def test_ranking_by_cost_on_a_hand_made_table() -> None:
    # Concurrency 10, context capped at the model's 1000 tokens:
    #   memory, 1 GPU: 20 + 0.08 KV + (1.5 + 0.4) = 21.98 GB; 2 GPUs: 23.48 GB.
    #   small x 1 has 14.4 GB usable: rejected; small x 2 has 28.8: fits.
    # Decode step reads 20 GB less the input embedding table (a lookup: 1000 x
    # 1000 x 2 B = 0.002 GB) + 10 x 500 x 8,000 B = 20.038 GB (compute, 200.2 GFLOP
    # at 50 TFLOP/s = 4 ms, never binds), then + 3 ms:
    #   fast x1: 20.038/1500 = 13.36 ms -> 16.36 ms -> 611.30 tok/s -> 1.5/h: 0.6816 /1M
    #   slow x1: 53.43 ms -> 56.43 -> 177.20 tok/s -> 0.5/h: 0.7838
    #   small x2: 20.038/(2 x 750 x 0.9) = 14.84 ms -> 17.84 -> 560.45 -> 1.6/h: 0.7930
    #   mid x1: 26.72 ms -> 29.72 -> 336.50 -> 1.0/h: 0.8255
    #   fast x2: 7.42 ms -> 10.42 -> 959.56 -> 3.0/h: 0.8685
    #   slow x2: 29.69 ms -> 32.69 -> 305.94 -> 1.0/h: 0.9079
    #   mid x2: 14.84 ms -> 17.84 -> 560.45 -> 2.0/h: 0.9913
    rec = recommend(ROUND_CHAT, TABLE, "here", concurrency=10)
    ranked = [(o.gpu_type, o.gpu_count) for o in rec.options]
    assert ranked == [
        ("fast", 1),
        ("slow", 1),
        ("small", 2),
        ("mid", 1),
        ("fast", 2),
        ("slow", 2),
        ("mid", 2),
    ]
    costs = [o.cost_per_million_tokens for o in rec.options]
    assert costs == pytest.approx(
        [0.6816, 0.7838, 0.7930, 0.8255, 0.8685, 0.9079, 0.9913], abs=1e-4
    )
    assert rec.options[0].est_output_tokens_per_s == pytest.approx(611.30, rel=1e-4)
    assert [(o.gpu_type, o.gpu_count) for o in rec.rejected] == [("small", 1)]
    assert rec.rejected[0].reasons == (
        "needs 22.0 GB (weights 20.0 GB + KV cache 0.1 GB + overhead 1.9 GB); "
        "1 x small has 14.4 GB usable",
    )
    assert rec.best() == rec.options[0]
    assert rec.currency == "EUR"


def test_equal_costs_go_to_fewer_gpus_then_the_lower_price(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the fixed step overhead, throughput is proportional to bandwidth:
    # mid (1000 GB/s, 1.0/h) and fast (2000 GB/s, 2.0/h) cost the same per token.
    _pin(monkeypatch, stepOverheadSeconds=0.0)
    table = _gpus({"fast": 2.0, "mid": 1.0}, FAST, MID, counts=(1,))
    rec = recommend(ROUND_CHAT, table, "here", concurrency=10)
    assert [o.gpu_type for o in rec.options] == ["mid", "fast"]
    assert rec.options[0].cost_per_million_tokens == pytest.approx(
        rec.options[1].cost_per_million_tokens
    )
    # Free GPUs: every cost is 0, one GPU beats two.
    free = _gpus({"fast": 0.0}, FAST)
    assert [o.gpu_count for o in recommend(ROUND_CHAT, free, "here").options] == [1, 2]


ROUND_IMAGE = ModelSpec(
    name="round-image",
    kind="image",
    source="builtin:none",
    description="round numbers",
    architecture=ImageArchitecture(
        family="sdxl",
        parameters=3_000_000_000,
        components=MappingProxyType({"unet": 2_500_000_000, "rest": 500_000_000}),
        dtype="fp16",
        unet_tflops_per_step=5.0,
        vae_decode_tflops=10.0,
        guidance_evaluations=2,
        activation_gb_per_image=2.0,
    ),
    default_size=(512, 512),
    default_steps=10,
    default_guidance_scale=5.0,
    max_n=2,
    min_side=256,
    max_side=1024,
    side_multiple=32,
)


def test_image_seconds_and_cost() -> None:
    # 10 steps x 2 evaluations x 5 TFLOPs + 10 = 110 TFLOPs at 100 x 0.45 = 45 TFLOP/s
    # = 2.4444 s (weight reads: 20 x 5 GB / 750 GB/s = 0.133 s, not binding)
    # + 0.1 s = 2.5444 s; at 1.0/h: 2.5444 / 3600 = 0.00070679 per image.
    # Memory: 6 GB + 2 images x 2 GB + 1.5 + 0.12 = 11.62 GB.
    table = _gpus({"mid": 1.0, "tiny": 0.1}, MID, _gpu("tiny", 10, 1000))
    rec = recommend(ROUND_IMAGE, table, "here")
    (option,) = rec.options
    assert option.est_seconds_per_image == pytest.approx(2.5444, rel=1e-4)
    assert option.cost_per_image == pytest.approx(0.00070679, rel=1e-4)
    assert option.est_output_tokens_per_s is None
    # Image pipelines are offered on one GPU only, unless a count is asked for.
    (tiny,) = rec.rejected
    assert tiny.reasons == (
        "needs 11.6 GB (weights 6.0 GB + activations for 2 images at 512x512 4.0 GB "
        "+ overhead 1.6 GB); 1 x tiny has 9.0 GB usable",
    )
    two = recommend(ROUND_IMAGE, table, "here", gpu_type="mid", gpu_count=2)
    assert not two.options
    assert "one GPU per replica" in two.rejected[0].reasons[0]


def test_too_slow_images_are_rejected_with_their_estimate() -> None:
    # 110 TFLOPs at 1 x 0.45 TFLOP/s = 244 s per image: over the 60 s limit.
    table = _gpus({"weak": 0.0}, _gpu("weak", 100, 1000, tflops=1))
    rec = recommend(ROUND_IMAGE, table, "here")
    (weak,) = rec.rejected
    assert weak.est_seconds_per_image == pytest.approx(244.54, rel=1e-3)
    assert weak.reasons[-1] == "too slow: over 60 s per image"


def test_filters_and_errors(catalog: Catalog) -> None:
    model = catalog.models.get("qwen2.5-7b-instruct")
    rec = recommend(model, catalog.gpus, None, gpu_type="H200")
    assert {o.location for o in rec.options} == {"us-east", "eu-west"}
    assert {o.gpu_type for o in rec.options + rec.rejected} == {"H200"}
    # A count the type does not allow comes back rejected, with the reason.
    rec = recommend(model, catalog.gpus, "us-east", gpu_type="L4", gpu_count=3)
    assert "GPUs per replica for L4: 1, 2, 4, 8" in rec.rejected[0].reasons[0]
    with pytest.raises(KeyError, match="unknown location 'mars'"):
        recommend(model, catalog.gpus, "mars")
    with pytest.raises(KeyError, match="unknown GPU type 'B200'"):
        recommend(model, catalog.gpus, "us-east", gpu_type="B200")
    with pytest.raises(KeyError, match="not offered in location 'ap-northeast'"):
        recommend(model, catalog.gpus, "ap-northeast", gpu_type="H200")
    with pytest.raises(ValueError, match="concurrency"):
        recommend(model, catalog.gpus, "us-east", concurrency=0)


def test_to_dict_is_camel_case_json(catalog: Catalog) -> None:
    rec = recommend(catalog.models.get("sdxl-turbo"), catalog.gpus, "us-east")
    data = json.loads(json.dumps(rec.to_dict()))
    assert data["model"] == "sdxl-turbo" and data["currency"] == "USD"
    assert data["best"] == data["options"][0]
    assert set(data["options"][0]) == {
        "location",
        "gpuType",
        "gpuCount",
        "fits",
        "reasons",
        "hourlyPrice",
        "memoryNeededGb",
        "memoryAvailableGb",
        "estOutputTokensPerS",
        "costPerMillionTokens",
        "estSecondsPerImage",
        "costPerImage",
        "evidence",
        "errorBand",
    }
    assert data["assumptions"]["steps"] == 1


def test_every_option_states_what_it_rests_on(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fit_module, "_CURRENT", None)  # the committed fit
    rec = recommend(catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus, "us-east")
    h100 = _option(rec.options, "H100-80GB", 1)
    assert h100.error_band is not None and 0 < h100.error_band < 0.5
    assert "published figures of hopper 16-bit throughput" in h100.evidence
    assert h100.reasons[-1] == f"rests on: {h100.evidence}"
    # The L4's band is the 80% band of the Ada 16-bit throughput figures held
    # out by source (the L4's own among them).
    l4 = _option(rec.options, "L4", 2)
    like = [
        r.error for r in fit_module.current().source_residuals
        if (r.generation, r.precision, r.regime) == ("ada", "16-bit", "throughput")
    ]  # fmt: skip
    assert "figures of L4 itself" in l4.evidence
    assert l4.error_band == pytest.approx(conformal_band(like))
