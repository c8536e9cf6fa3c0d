"""Rebuild docs/recommendation.md: published measurements of catalog models
next to inferd's estimate for the same setting, the error of each, and the
median absolute error.

    python scripts/recommendation_table.py          # rewrite the file
    python scripts/recommendation_table.py --check  # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferd.catalog import load_catalog
from inferd.catalog.calibration import MEDIAN_ERROR_GOAL, compare, median_absolute_error

DOC = Path(__file__).resolve().parent.parent / "docs" / "recommendation.md"

HEADER = """# How good is the GPU recommendation?

The recommender (`inferd.catalog.recommend`, `inferd.catalog.workload`) is a
roofline: decode bound by memory bandwidth, prefill and diffusion by compute,
with the efficiencies and fixed costs its module docstrings state. This page
holds it against figures others published for models of the catalog, each in
the setting it was measured in, and against inferd's own H100 measurements.
Rebuilt by `python scripts/recommendation_table.py`; `tests/unit/test_calibration.py`
holds the median absolute error to the goal (<= {goal:.0%}) and this file to the script.

Where an endpoint has been measured (`inferd bench ENDPOINT`), recommendations
use the measured profile instead and say "measured on ...".

| model | GPUs | setting | published | inferd estimate | error | source |
| --- | --- | --- | --- | --- | --- | --- |
"""

FOOTER = """
**Median absolute error: {median:.1%}** over {count} rows (goal <= {goal:.0%}).

Where it misses:

- SDXL on an H100 is estimated at the roofline's 45% of peak dense FLOP/s, which
  an A100 reaches (diffusers' 2.54 s for a tuned SDXL is 52%); the H100 measured
  here reaches 16% of its peak uncompiled and 28% with `torch.compile`. The
  estimate is optimistic for H100 image serving; a measured profile corrects it.
- 72B AWQ on two A100s: vLLM 0.6.3's AWQ kernels at batch 1 read weights more
  slowly than the bf16 path the roofline's 75% of bandwidth describes.
- The small models are bound by per-step fixed costs (3 ms assumed), which vary
  with the vLLM version and CUDA graphs.
"""


def render() -> str:
    comparisons = compare(load_catalog())
    lines = []
    for c in comparisons:
        r = c.row
        digits = 2 if r.metric == "s/image" else 1
        lines.append(
            f"| {r.model} | {r.gpu_count} x {r.gpu_type} | {r.setting} | "
            f"{r.value:.{digits}f} {r.metric} | {c.estimate:.{digits}f} {r.metric} | "
            f"{c.error:+.1%} | {r.source} |"
        )
    median = median_absolute_error(comparisons)
    return (
        HEADER.format(goal=MEDIAN_ERROR_GOAL)
        + "\n".join(lines)
        + "\n"
        + FOOTER.format(median=median, count=len(comparisons), goal=MEDIAN_ERROR_GOAL)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python scripts/recommendation_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
