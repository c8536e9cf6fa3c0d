"""The recommender's model against published measurements it was not fitted
to (docs/recommendation.md): leave-one-source-out, from the dataset."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from inferd.catalog import load_catalog
from inferd.catalog.fit import (
    FITTED,
    MEDIAN_ERROR_GOAL,
    SOURCE_ERROR_GOAL,
    Dataset,
    context,
    fit,
    leave_one_source_out,
    median_abs,
    predict,
    published,
    relative_error,
)
from inferd.catalog.perfmodel import PRIOR_PARAMETERS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "recommendation_table.py"
# Sources whose held-out error misses the per-source goal, with the reason
# docs/recommendation.md gives: the only Hopper image figures, so without them
# Hopper's image efficiency is the prior's.
KNOWN_MISSES = {"inferd-h100"}


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return published()


def test_the_dataset_covers_what_the_fit_needs(dataset: Dataset) -> None:
    rows = dataset.rows
    assert len(rows) >= 40 and len(dataset.sources) >= 6
    assert {"A100-80GB", "H100-80GB", "H200", "L40S"} <= {r.gpu for r in rows}
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
    assert json.loads(FITTED.read_text())["overallMedianAbsError"] <= MEDIAN_ERROR_GOAL
