"""The recommender against published measurements (docs/recommendation.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from inferd.catalog import load_catalog
from inferd.catalog.calibration import (
    MEDIAN_ERROR_GOAL,
    PUBLISHED,
    compare,
    median_absolute_error,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "recommendation_table.py"


def test_median_absolute_error_meets_the_goal() -> None:
    comparisons = compare(load_catalog())
    assert len(comparisons) >= 8
    assert all(c.row.source for c in comparisons)
    assert {c.row.gpu_type for c in comparisons} <= {"H100-80GB", "A100-80GB", "L40S", "L4"}
    assert median_absolute_error(comparisons) <= MEDIAN_ERROR_GOAL


def test_sdxl_rows_are_the_h100_figures_of_results_md() -> None:
    results = (SCRIPT.parents[1] / "benchmarks" / "RESULTS.md").read_text()
    sdxl = [r for r in PUBLISHED if r.model == "sdxl-base-1.0"]
    assert sdxl and all(r.gpu_type == "H100-80GB" for r in sdxl)
    for row in sdxl:
        assert f"| {row.value:.2f} |" in results


def test_the_document_is_what_the_script_renders() -> None:
    spec = importlib.util.spec_from_file_location("recommendation_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
