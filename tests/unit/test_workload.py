"""The workload-aware recommender, as tables over the real catalog and price
table. Pure: no clock, no I/O."""

from __future__ import annotations

import pytest

from inferd.catalog import Catalog, load_catalog
from inferd.catalog.registered import MeasuredProfile, ProfilePoint
from inferd.catalog.workload import (
    TARGET_UTILIZATION,
    ChatWorkload,
    ImageWorkload,
    chat_performance,
    recommend_for_workload,
)

# The README's first example: a busy chat service with a tight per-token target.
BUSY_CHAT = ChatWorkload(requests_per_s=20, prompt_tokens=1000, output_tokens=200,
                         ttft_p95_s=1.0, tpot_p95_s=0.030)  # fmt: skip


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_a_busy_workload_with_a_tight_latency_target(catalog: Catalog) -> None:
    rec = recommend_for_workload(
        catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus, BUSY_CHAT, "us-east"
    )
    best = rec.best()
    # Several A100-40GB replicas at batch 50 cost less than fewer, larger H100s.
    assert best is not None and best.gpu_type == "A100-40GB" and best.gpu_count == 1
    assert best.performance is not None and best.performance.tpot_p95_s is not None
    assert best.performance.tpot_p95_s <= 0.030
    # An L4 cannot meet 30 ms per token at any batch: rejected, with the reason.
    reasons = {o.gpu_type: o.reasons for o in rec.rejected if o.gpu_count == 1}
    assert "TPOT p95" in reasons["L4"][0]
    # Each option says what it rests on, with its error band.
    assert best.error_band is not None and 0 < best.error_band < 0.25
    # The A100-40GB has no figure of its own: its band says so.
    assert "no figure for this GPU" in best.evidence
    assert best.reasons[-1] == f"rests on: {best.evidence}"
    assert best.to_dict()["evidence"] == best.evidence
    # ... and every fitting option costs at least as much in total.
    assert all(o.total_hourly_price >= best.total_hourly_price for o in rec.options)
    assert best.min_replicas == best.replicas and best.max_replicas == 2 * best.replicas


def test_a_light_workload_picks_a_small_gpu(catalog: Catalog) -> None:
    light = ChatWorkload(2, 500, 200, ttft_p95_s=2.0, tpot_p95_s=0.1)
    rec = recommend_for_workload(
        catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus, light, "us-east"
    )
    best = rec.best()
    assert best is not None and (best.gpu_type, best.replicas) == ("L4", 1)
    # The band rests on the published L4 figures.
    assert "published figures of ada 16-bit throughput" in best.evidence
    assert "figures of L4 itself" in best.evidence


@pytest.mark.parametrize(
    ("rps", "replicas"),
    # One 1 x H100 replica at its largest batch meeting the targets serves
    # `capacity` requests/s; replicas = ceil(rps / (0.8 x capacity)).
    [(0.1, 1), (5, 1), (20, 2), (60, 6)],
)
def test_replicas_follow_the_load(catalog: Catalog, rps: float, replicas: int) -> None:
    work = ChatWorkload(rps, 1000, 200, 1.0, 0.030)
    rec = recommend_for_workload(
        catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus, work, "us-east",
        gpu_type="H100-80GB", gpu_count=1,
    )  # fmt: skip
    option = rec.options[0]
    assert option.performance is not None
    capacity = option.performance.requests_per_s
    assert option.replicas == replicas
    assert rps <= TARGET_UTILIZATION * capacity * option.replicas
    assert rps > TARGET_UTILIZATION * capacity * (option.replicas - 1)


def test_prefill_is_counted(catalog: Catalog) -> None:
    model = catalog.models.get("llama-3.1-8b-instruct")
    gpu = catalog.gpus.gpu_types["H100-80GB"]
    short = chat_performance(model, gpu, 1, 32, ChatWorkload(1, 100, 200))
    long = chat_performance(model, gpu, 1, 32, ChatWorkload(1, 8000, 200))
    assert long.throughput < short.throughput
    assert long.ttft_p95_s is not None and short.ttft_p95_s is not None
    assert long.ttft_p95_s > 3 * short.ttft_p95_s
    # Chunked prefill: every step carries prompt tokens, so each token comes slower.
    assert long.tpot_p95_s is not None and short.tpot_p95_s is not None
    assert long.tpot_p95_s > 2 * short.tpot_p95_s


def test_a_measured_profile_refits_the_model(catalog: Catalog) -> None:
    # Measured about 30% slower than the published fit predicts for an H100.
    profile = MeasuredProfile(
        model_name="llama-3.1-8b-instruct", gpu_type="H100-80GB", gpu_count=1, kind="chat",
        prompt_tokens=1000, output_tokens=200, measured_at="2026-11-23T10:00:00Z",
        endpoint="chat-8b",
        points=(ProfilePoint(1, 10, 70.0, 0.05, 0.0165), ProfilePoint(16, 50, 900.0, 0.2, 0.0200),
                ProfilePoint(64, 100, 2200.0, 1.5, 0.0330)),
    )  # fmt: skip
    model = catalog.models.get("llama-3.1-8b-instruct")
    estimated = recommend_for_workload(
        model, catalog.gpus, BUSY_CHAT, "us-east", gpu_type="H100-80GB", gpu_count=1
    ).options[0]
    measured = recommend_for_workload(
        model, catalog.gpus, BUSY_CHAT, "us-east", gpu_type="H100-80GB", gpu_count=1,
        profiles=[profile],
    ).options[0]  # fmt: skip
    assert measured.basis == (
        "measured on 1 x H100-80GB, 2026-11-23, model refitted to 6 measured points"
    )
    assert "refitted to 6 measured points of chat-8b" in measured.evidence
    assert measured.error_band is not None and measured.error_band < 0.25
    assert estimated.performance is not None and measured.performance is not None
    assert measured.performance.requests_per_s < estimated.performance.requests_per_s
    assert measured.replicas >= estimated.replicas
    # Another GPU type keeps the published fit.
    other = recommend_for_workload(
        model, catalog.gpus, BUSY_CHAT, "us-east", gpu_type="H200", gpu_count=1, profiles=[profile]
    )
    assert other.options[0].basis == "estimated"


@pytest.mark.parametrize(
    ("work", "best_type", "rejected_type", "reason"),
    [
        (ImageWorkload(30, None, None, 10.0), "L40S", "A10G", "s per image (p95) > target"),
        (ImageWorkload(30, None, None, 2.5), "H100-80GB", "L40S", "s per image (p95) > target"),
        (ImageWorkload(10, (512, 512), 4, 1.0), "L4", "cpu", "s per image (p95) > target"),
    ],
)
def test_image_workloads(
    catalog: Catalog, work: ImageWorkload, best_type: str, rejected_type: str, reason: str
) -> None:
    rec = recommend_for_workload(catalog.models.get("sdxl-base-1.0"), catalog.gpus, work, "us-east")
    best = rec.best()
    assert best is not None and best.gpu_type == best_type
    assert best.cost_per_image == pytest.approx(
        best.total_hourly_price / (work.images_per_minute * 60)
    )
    rejected = {o.gpu_type: o for o in rec.rejected}
    assert reason in " ".join(rejected[rejected_type].reasons)


@pytest.mark.parametrize(
    ("model", "work", "message"),
    [
        ("sdxl-base-1.0", ChatWorkload(1, 10, 10), "give imagesPerMinute"),
        ("llama-3.1-8b-instruct", ImageWorkload(1), "give requestsPerSecond"),
        ("llama-3.1-8b-instruct", ChatWorkload(0, 10, 10), "positive"),
    ],
)
def test_workloads_that_do_not_suit_the_model(
    catalog: Catalog, model: str, work: ChatWorkload | ImageWorkload, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        recommend_for_workload(catalog.models.get(model), catalog.gpus, work)


def test_too_long_for_the_context_is_a_reason(catalog: Catalog) -> None:
    rec = recommend_for_workload(
        catalog.models.get("qwen2.5-0.5b-instruct"), catalog.gpus,
        ChatWorkload(1, 32000, 1000), "us-east",
    )  # fmt: skip
    assert not rec.options
    singles = [o for o in rec.rejected if o.gpu_count == 1]
    assert singles and all("exceeds the model's context" in o.reasons[0] for o in singles)
