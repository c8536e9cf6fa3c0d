"""The recommender's model against published measurements it was not fitted
to (docs/recommendation.md): leave-one-source-out, from the dataset."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from inferd.catalog import load_catalog
from inferd.catalog.bands import MIN_FIGURES, conformal_band
from inferd.catalog.fit import (
    FITTED,
    GPU_HELD_OUT_GOAL,
    MEDIAN_ERROR_GOAL,
    SOURCE_ERROR_GOAL,
    Dataset,
    context,
    current,
    fit,
    leave_one_gpu_out,
    leave_one_source_out,
    median_abs,
    predict,
    published,
    relative_error,
)
from inferd.catalog.models import ModelSpec
from inferd.catalog.perfmodel import PRIOR_PARAMETERS
from inferd.catalog.workload import (
    TPOT_P95_OVER_MEAN,
    ChatWorkload,
    chat_performance,
    recommend_for_workload,
    scheduler_limits,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "recommendation_table.py"
# Sources whose held-out error misses the per-source goal, with the reason
# docs/recommendation.md gives (none since a generation's image efficiency is
# carried over from its LLM compute efficiency).
KNOWN_MISSES: set[str] = set()
# Sources added for figures the model had few of (TTFT of long prompts at low
# concurrency, FP8 70B on H100 with a current engine): each held out must
# meet the per-source goal.
NEW_SOURCES = ("nim-llm-1.8",)


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return published()


def test_the_dataset_covers_what_the_fit_needs(dataset: Dataset) -> None:
    rows = dataset.rows
    assert len(rows) >= 40 and len(dataset.sources) >= 6
    assert {"A100-80GB", "H100-80GB", "H200", "L40S", "L4"} <= {r.gpu for r in rows}
    assert {"bf16", "fp8", "int4"} <= {r.precision for r in rows}
    assert any(r.scenario == "image" for r in rows)
    assert any(r.input >= 2000 and r.output <= 128 for r in rows)  # prefill-heavy
    assert any(r.input <= 128 and r.output >= 2048 for r in rows)  # decode-heavy
    assert all(r.value > 0 and r.stated and dataset.sources[r.source].address for r in rows)


def test_leave_one_source_out_error_meets_the_goal(dataset: Dataset) -> None:
    ctx = context(load_catalog(), dataset)
    predictions = leave_one_source_out(dataset, ctx)
    assert len(predictions) == len(dataset.rows)
    assert median_abs(p.error for p in predictions) <= MEDIAN_ERROR_GOAL
    for source in dataset.sources:
        err = median_abs(p.error for p in predictions if p.row.source == source)
        assert (err <= SOURCE_ERROR_GOAL) == (source not in KNOWN_MISSES), (source, err)


@pytest.mark.parametrize("source", NEW_SOURCES)
def test_each_new_source_held_out_meets_the_goal(dataset: Dataset, source: str) -> None:
    ctx = context(load_catalog(), dataset)
    held = [r for r in dataset.rows if r.source == source]
    assert len(held) >= 10 and any(r.scenario == "served-ttft" for r in held)
    params = fit([r for r in dataset.rows if r.source != source], ctx)
    errors = [relative_error(predict(params, r, ctx), r) for r in held]
    assert median_abs(errors) <= SOURCE_ERROR_GOAL, errors


def test_the_l4_figures_held_out_together_meet_the_goal(dataset: Dataset) -> None:
    """Fitted without a single L4 figure (Ada's efficiencies then rest on the
    L40S's FP8 figures), the model still predicts the L4's: the error an L4
    estimate carried before it had figures of its own."""
    ctx = context(load_catalog(), dataset)
    held = leave_one_gpu_out(dataset, ctx, "L4")
    assert len(held) == sum(1 for r in dataset.rows if r.gpu == "L4") >= 10
    assert median_abs(p.error for p in held) <= GPU_HELD_OUT_GOAL


def test_the_recommenders_l4_estimates_meet_the_l4_figures(dataset: Dataset) -> None:
    """The recommender's own estimate (`chat_performance`: the committed fit,
    vLLM's token budget for an L4) of every published L4 serving figure:
    each within the per-source goal, and at the median within the band an L4
    recommendation quotes."""
    gpu = load_catalog().gpus.gpu_type("L4")
    band, _ = current().band(gpu.name, gpu.generation, "bf16")
    errors = []
    for row in dataset.rows:
        if row.gpu != "L4" or row.scenario not in ("served", "served-tpot"):
            continue
        # Measured under the scheduler limits the recommender assumes for an L4.
        assert row.token_budget == scheduler_limits(gpu).token_budget
        assert row.batch is not None
        arch = dataset.architectures[row.model]
        model = ModelSpec(row.model, "chat", row.stated_model, "", arch)
        work = ChatWorkload(1.0, row.input, row.output)
        perf = chat_performance(model, gpu, row.gpus, row.batch, work)
        assert perf.tpot_p95_s is not None
        estimate = (
            perf.throughput if row.scenario == "served"
            else 1000 * perf.tpot_p95_s / TPOT_P95_OVER_MEAN
        )  # fmt: skip
        errors.append(relative_error(estimate, row))
    assert len(errors) >= 8
    assert all(abs(e) <= SOURCE_ERROR_GOAL for e in errors), errors
    assert median_abs(errors) <= band


def test_an_l4_recommendation_rests_on_the_l4_figures() -> None:
    """An L4 option quotes the 80% band of the Ada 16-bit throughput figures
    held out by source (the L4's own), not a band carried over."""
    catalog = load_catalog()
    fitted = current()
    like = [
        r.error for r in fitted.source_residuals
        if (r.generation, r.precision, r.regime) == ("ada", "16-bit", "throughput")
    ]  # fmt: skip
    assert len(like) >= MIN_FIGURES
    rec = recommend_for_workload(
        catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus,
        ChatWorkload(2, 500, 200, ttft_p95_s=2.0, tpot_p95_s=0.1), "us-east", gpu_type="L4",
    )  # fmt: skip
    assert rec.options
    for option in rec.options:
        assert option.error_band == pytest.approx(conformal_band(like))
        assert f"{len(like)} published figures of ada 16-bit throughput" in option.evidence
        assert "figures of L4 itself" in option.evidence


def test_a_gpu_without_figures_says_so_and_quotes_the_gpu_held_out_band() -> None:
    """The A10G has no published figure: its band comes from every GPU
    type's figures predicted with that GPU type held out, and says so."""
    catalog = load_catalog()
    fitted = current()
    assert "A10G" not in fitted.gpus_measured()
    band, evidence = fitted.band("A10G", "ampere", "bf16")
    like = [
        r.error for r in fitted.gpu_residuals
        if (r.generation, r.precision, r.regime) == ("ampere", "16-bit", "throughput")
    ]  # fmt: skip
    assert band == pytest.approx(conformal_band(like))
    assert "no figure for this GPU" in evidence
    rec = recommend_for_workload(
        catalog.models.get("llama-3.1-8b-instruct"), catalog.gpus,
        ChatWorkload(1, 500, 200), "us-east", gpu_type="A10G",
    )  # fmt: skip
    assert rec.options and all("no figure for this GPU" in o.evidence for o in rec.options)


def test_the_fit_improves_on_the_prior(dataset: Dataset) -> None:
    ctx = context(load_catalog(), dataset)
    fitted = fit(dataset.rows, ctx)
    before = median_abs(relative_error(predict(PRIOR_PARAMETERS, r, ctx), r) for r in dataset.rows)
    after = median_abs(relative_error(predict(fitted, r, ctx), r) for r in dataset.rows)
    assert after < before


def test_fitted_json_and_the_documents_are_what_the_script_renders() -> None:
    spec = importlib.util.spec_from_file_location("recommendation_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
    # Fresh (the check above recomputed it), so its held-out errors are this model's.
    doc = json.loads(FITTED.read_text())
    assert doc["overallMedianAbsError"] <= MEDIAN_ERROR_GOAL
    # Every GPU type with figures, fitted without any of them.
    assert len(doc["gpuHeldOutMedianAbsError"]) >= 5
    for gpu, err in doc["gpuHeldOutMedianAbsError"].items():
        assert err <= GPU_HELD_OUT_GOAL, (gpu, err)
