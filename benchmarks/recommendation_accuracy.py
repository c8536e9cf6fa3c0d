"""The recommender's accuracy on figures it was not fitted to, before and
after, in one run: leave-one-source-out and leave-one-GPU-out median error,
and how often each figure's error band holds its held-out error.

"Before" is other commits' code (default: main before the step-time fixes
and bands of docs/recommendation.md, and main before the last model step),
each unpacked with `git archive` into a
temporary directory; "after" is this tree. Each side runs in its own Python
process with its own `inferd` on the path and is asked about two datasets:
its own `published.yaml`, and this tree's (the figures "before" never saw;
rows of a scenario its code cannot model are left out and counted).

Band coverage: for every figure, the band its side would quote computed
without the figure's source, and whether the figure's held-out error falls
inside. Before: the median held-out error of the figures of its GPU
generation and precision (its rule: a 50% band by construction). After: the
80% split-conformal band of `inferd.catalog.bands`.

    python benchmarks/recommendation_accuracy.py [--before REF ...]

CPU only: about two minutes on 2 shared cores (three sides, each refitted
per source and per GPU type).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from common import write_report
from results_format import goal, table

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = Path("inferd/catalog/data/published.yaml")
# main before issue 33's work (TTFT floor, additive prefill, engine factors,
# bands), and main before the step that stopped counting the input embedding
# table as a read of every decode step.
BEFORE = ("2d2ceec", "f58b045")
LOSO_GOAL, SOURCE_GOAL, LOGO_GOAL, COVERAGE_GOAL = 0.10, 0.25, 0.15, 0.75

# Runs inside each side's tree: prints one JSON object.
MEASURE = r"""
import json, statistics, sys
from pathlib import Path
from inferd.catalog import load_catalog
import inferd.catalog.fit as F

REGIMES = {"first-token": "ttft", "served-ttft": "ttft", "single-stream": "per-token",
           "served-tpot": "per-token", "batch-latency": "per-token", "static-batch": "throughput",
           "max-throughput": "throughput", "served": "throughput", "image": "image"}

def cls(row):
    if row.scenario == "image":
        return "image"
    sixteen = {"bf16": "16-bit", "fp16": "16-bit", "fp32": "16-bit", "fp8": "FP8"}
    return sixteen.get(row.precision, "INT4/INT8")

def med(xs):
    xs = [abs(x) for x in xs]
    return statistics.median(xs) if xs else None

data = F.published(Path(sys.argv[1]))
ctx = F.context(load_catalog(), data)
full = F.fit(data.rows, ctx)
loso = F.leave_one_source_out(data, ctx, full)
gpus = sorted({r.gpu for r in data.rows})
logo = {g: F.leave_one_gpu_out(data, ctx, g, full) for g in gpus}
figs = [dict(source=p.row.source, gpu=p.row.gpu, gen=ctx.gpu(p.row.gpu).generation,
             precision=cls(p.row), regime=REGIMES[p.row.scenario], error=p.error) for p in loso]
try:
    from inferd.catalog import bands as B
    rule = "80% split-conformal (inferd.catalog.bands)"
    def band(fig, others):
        res = [B.Residual(o["source"], o["gpu"], o["gen"], o["precision"], o["regime"], o["error"])
               for o in others]
        b = B.band_for(res, fig["gen"], fig["precision"], fig["regime"])
        return None if b is None else b.value
except ImportError:
    rule = "median held-out error of the generation and precision (Fitted.band)"
    overall_all = med(f["error"] for f in figs)
    def band(fig, others):
        key = (fig["gen"], fig["precision"])
        same = [o["error"] for o in others if (o["gen"], o["precision"]) == key]
        if len(same) >= 2:
            return med(same)
        near = [med([o["error"] for o in others if (o["gen"], o["precision"]) == key])
                for key in {(o["gen"], o["precision"]) for o in others
                            if o["gen"] == fig["gen"] and o["precision"] != "image"}]
        return max([med(o["error"] for o in others), *near])
cover = {}
for fig in figs:
    b = band(fig, [o for o in figs if o["source"] != fig["source"]])
    cover.setdefault(fig["regime"], []).append(b is not None and abs(fig["error"]) <= b)
print(json.dumps({
    "rule": rule,
    "figures": len(data.rows),
    "sources": len(data.sources),
    "loso": med(p.error for p in loso),
    "bySource": {s: med(p.error for p in loso if p.row.source == s) for s in data.sources},
    "byGpu": {g: med(p.error for p in logo[g]) for g in gpus},
    "coverage": {k: [sum(v), len(v)] for k, v in cover.items()},
}))
"""


def side(tree: Path, dataset: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(dataset)],
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def readable(tree: Path, dataset: Path, into: Path) -> tuple[Path, int]:
    """`dataset` with only the rows `tree`'s code can model; how many left out."""
    sys.path.insert(0, str(tree))
    scenarios = _scenarios(tree)
    data = yaml.safe_load(dataset.read_text())
    kept = [r for r in data["rows"] if r["scenario"] in scenarios]
    data["rows"] = kept
    data["sources"] = {
        k: v for k, v in data["sources"].items() if any(r["source"] == k for r in kept)
    }
    into.write_text(yaml.safe_dump(data))
    return into, len(yaml.safe_load(dataset.read_text())["rows"]) - len(kept)


def _scenarios(tree: Path) -> set[str]:
    text = (tree / "inferd/catalog/fit.py").read_text()
    start = text.index("SCENARIOS = (")
    names = text[start : text.index(")", start)]
    return {
        s.strip().strip('"')
        for s in names.split("(", 1)[1].replace("\n", " ").split(",")
        if s.strip()
    }


def _share(counts: list[int] | None) -> str:
    if not counts:
        return "-"
    inside, n = counts
    return f"{inside}/{n} ({inside / n:.0%})"


def _goal(name: str, target: float, figure: float, why: str, least: bool = False) -> dict[str, Any]:
    met = figure >= target if least else figure <= target
    sign = ">=" if least else "<="
    return goal(name, f"{sign} {target:.0%}", round(figure, 4), met, "" if met else why)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", action="append", help=f"a commit measured as before (default: {BEFORE})"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    befores = args.before or list(BEFORE)
    runs: dict[str, dict[str, Any]] = {}
    left_out: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ref in befores:
            before = Path(tmp) / ref
            before.mkdir()
            archive = subprocess.run(
                ["git", "archive", ref], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
            new_rows, left_out[ref] = readable(before, ROOT / PUBLISHED, Path(tmp) / f"{ref}.yaml")
            if (before / PUBLISHED).read_text() != (ROOT / PUBLISHED).read_text():
                runs[f"before ({ref}), its own figures"] = side(before, before / PUBLISHED)
            runs[f"before ({ref}), every figure it can model"] = side(before, new_rows)
        runs["after"] = side(ROOT, ROOT / PUBLISHED)
    regimes = sorted({k for r in runs.values() for k in r["coverage"]})
    gpus = sorted({g for r in runs.values() for g in r["byGpu"]})
    rows = []
    for name, r in runs.items():
        row: dict[str, Any] = {
            "run": name, "figures": r["figures"], "sources": r["sources"],
            "LOSO median": f"{r['loso']:.1%}",
            "worst source": "{} {:.0%}".format(*max(r["bySource"].items(), key=lambda kv: kv[1])),
            "band rule": r["rule"],
        }  # fmt: skip
        rows.append(row)
    gpu_rows = [
        {"run": n, **{g: f"{r['byGpu'][g]:.1%}" if g in r["byGpu"] else "-" for g in gpus}}
        for n, r in runs.items()
    ]
    cov_rows = [
        {"run": n, **{k: _share(r["coverage"].get(k)) for k in regimes}} for n, r in runs.items()
    ]
    after = runs["after"]
    worst = max(after["bySource"].values())
    why = "see docs/recommendation.md"
    goals = [
        _goal("leave-one-source-out median error", LOSO_GOAL, after["loso"], why),
        _goal("every source held out", SOURCE_GOAL, worst, why),
    ]
    for g, err in after["byGpu"].items():
        goals.append(_goal(f"leave-one-GPU-out, {g}", LOGO_GOAL, err, why))
    for k, (inside, n) in after["coverage"].items():
        goals.append(_goal(f"80% band coverage, {k}", COVERAGE_GOAL, inside / n, why, least=True))
    report = {
        "title": "Recommendation accuracy on figures it was not fitted to",
        "workload": "published figures: before at "
        + ", ".join(
            f"{ref} ({n} of this tree's figures of a scenario its code cannot model)"
            for ref, n in left_out.items()
        )
        + ", after this tree",
        "tables": [
            table("Leave-one-source-out", list(rows[0]), rows),
            table("Leave-one-GPU-out median error", ["run", *gpus], gpu_rows),
            table(
                "Band coverage, each figure's band computed without its source",
                ["run", *regimes],
                cov_rows,
            ),
        ],
        "goals": goals,
        "runs": runs,
    }
    for t in report["tables"]:
        print(f"\n{t['title']}")
        for r in t["rows"]:
            print("  " + " | ".join(str(r.get(c, "-")) for c in t["columns"]))
    for g in goals:
        print(f"{g['goal']}: {g['figure']} ({g['target']}) {g['status']}")
    write_report("recommendation_accuracy", report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
