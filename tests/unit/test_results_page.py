"""benchmarks/RESULTS.md is generated from the committed result files, and
nothing a result file states is lost on the way: a goal without a figure is
"not measured" with why, and a benchmark with no result is still listed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report  # noqa: E402
import results_format  # noqa: E402


def result(**fields: Any) -> dict[str, Any]:
    return {
        "format": 1,
        "benchmark": "demo",
        "command": "python benchmarks/demo.py --rounds 1",
        "commit": "0123456789abcdef",
        "date": "2026-11-27T10:00:00+00:00",
        "machine": {"cpus": 2, "platform": "Linux"},
        "load": {"start": [1.0, 1.5, 2.0], "end": [1.1, 1.2, 1.3]},
        "_file": "benchmarks/results/demo.json",
        **fields,
    }


def test_the_committed_page_is_what_the_command_makes_from_the_committed_results() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/report.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr + "\nrun `make results` and commit"


def test_every_committed_result_is_a_valid_result_file() -> None:
    for entry in report.load(report.RESULTS_DIR):
        assert results_format.problems(entry) == [], entry["_file"]


def test_a_goal_without_a_figure_reads_not_measured_with_why() -> None:
    goals = [
        results_format.goal("fast", "<= 1", 0.5, True),
        results_format.goal("slow", "<= 1", 3.0, False, "the machine was loaded"),
        results_format.goal("unrun", "<= 2", None, None, "needs a GPU"),
    ]
    page = report.render([result(goals=goals)], ["demo"])
    assert "| fast | <= 1 | 0.500 | **met** | - |" in page
    assert "| slow | <= 1 | 3.000 | **not met** | the machine was loaded |" in page
    assert "| unrun | <= 2 | - | **not measured** | needs a GPU |" in page
    assert results_format.all_met(goals) is False


def test_a_benchmark_with_no_result_is_listed_as_not_measured() -> None:
    page = report.render([result(goals=[])], ["demo", "gpu_images", "other"])
    assert "| `gpu_images` | all of its goals | - | - | **not measured** | needs a CUDA GPU" in page
    assert "| `other` | all of its goals | - | - | **not measured** | no committed result" in page


def test_a_file_in_its_own_layout_is_rendered_from_its_lists() -> None:
    own = result(results=[{"mode": "stream", "tok/s": 12.5}, {"mode": "plain", "extra": 1}])
    page = report.render([own], ["demo"])
    assert "| mode | tok/s | extra |" in page
    assert "| stream | 12.500 | - |" in page
    # It states no goal in the shared format, so none is claimed.
    assert "**not measured** | the file states no goal" in page


def test_the_page_states_command_commit_and_load() -> None:
    page = report.render([result(goals=[])], ["demo"])
    assert "    python benchmarks/demo.py --rounds 1" in page
    assert "Commit `0123456789ab`" in page
    assert "load average 1.00/1.50/2.00 at the start, 1.10/1.20/1.30 at the end" in page


def test_invalid_goals_are_reported() -> None:
    bad = result(goals=[{"goal": "x", "target": "-", "figure": None, "status": "met"}])
    assert any("without a figure" in p for p in results_format.problems(bad))
    bad = result(goals=[{"goal": "x", "target": "-", "figure": None, "status": "not measured"}])
    assert any("needs a 'why'" in p for p in results_format.problems(bad))
    assert "not a valid result" in report.render([bad], ["demo"])
