"""Rebuild, from the published measurements in inferd/catalog/data/published.yaml:
the fitted parameters and leave-one-source-out errors
(inferd/catalog/data/fitted.json), docs/recommendation.md, and the README's
worked examples (between the `recommendation-examples` markers).

    python scripts/recommendation_table.py          # rewrite the three
    python scripts/recommendation_table.py --check  # exit 1 if any is stale
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

from inferd.catalog import load_catalog
from inferd.catalog.bands import COVERAGE, MIN_FIGURES
from inferd.catalog.fit import (
    FITTED,
    GPU_HELD_OUT_GOAL,
    MEDIAN_ERROR_GOAL,
    SOURCE_ERROR_GOAL,
    context,
    fit,
    fitted_document,
    published,
    reload,
)
from inferd.catalog.perfmodel import PRIOR, Precision, weight_bytes, weight_read_bytes
from inferd.catalog.workload import (
    ChatWorkload,
    ImageWorkload,
    WorkloadOption,
    WorkloadRecommendation,
    recommend_for_workload,
)
from inferd.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "recommendation.md"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BEGIN, END = "<!-- recommendation-examples:begin -->", "<!-- recommendation-examples:end -->"

# The three workloads the recommendation is judged by.
WORKLOADS: tuple[tuple[str, str, ChatWorkload | ImageWorkload, str], ...] = (
    ("llama-3.1-8b-instruct", "--requests-per-second 20 --prompt-tokens 1000 --output-tokens 200 "
     "--ttft-p95-ms 1000 --tpot-p95-ms 30", ChatWorkload(20, 1000, 200, 1.0, 0.030),
     "8B chat: 20 requests/s, 1,000-token prompts, 200-token answers, TTFT p95 1 s, "
     "TPOT p95 30 ms"),
    ("llama-3.1-70b-instruct", "--requests-per-second 5 --prompt-tokens 1000 --output-tokens 200 "
     "--ttft-p95-ms 2000 --tpot-p95-ms 50", ChatWorkload(5, 1000, 200, 2.0, 0.050),
     "70B chat: 5 requests/s, 1,000-token prompts, 200-token answers, TTFT p95 2 s, "
     "TPOT p95 50 ms"),
    ("sdxl-base-1.0", "--images-per-minute 60", ImageWorkload(60),
     "SDXL: 60 images per minute at 1024x1024, 30 steps"),
)  # fmt: skip


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def cli_output(argv: list[str]) -> str:
    """What `inferd ARGV` prints, run in this process: the examples are the
    command's own output, whole, never a second rendering of it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(argv)
    if status != 0:
        raise RuntimeError(f"inferd {' '.join(argv)} exited with {status}")
    return out.getvalue().rstrip("\n")


def render_examples() -> str:
    out = []
    for model, flags, _, _ in WORKLOADS:
        argv = ["recommend", model, "--location", "us-east", *flags.split()]
        out.append(f"$ inferd {' '.join(argv)}\n{cli_output(argv)}")
    return "```\n" + "\n\n".join(out) + "\n```"


def render_doc(doc: dict[str, Any]) -> str:
    dataset = published()
    catalog = load_catalog()
    lines = [
        "# How good is the GPU recommendation?",
        "",
        "Every estimate the recommender makes (`inferd.catalog.workload`) comes from one",
        "step-time model (`inferd.catalog.perfmodel`): a step reads the weights and the",
        "KV cache at a fraction of peak bandwidth and computes at a fraction of peak",
        "tensor FLOP/s, plus a fixed overhead; vLLM's chunked-prefill scheduler decides",
        "what a step carries under load. Its parameters are fitted",
        "(`inferd.catalog.fit`) to the published measurements in",
        "`inferd/catalog/data/published.yaml` and checked on the ones they were not",
        "fitted to: for every source, the model is refitted without that source and",
        "predicts its figures. Rebuilt by `python scripts/recommendation_table.py`;",
        "`tests/unit/test_calibration.py` holds the errors to the goal and these",
        "files to the script.",
        "",
        *render_before_after(doc),
        "",
        "## The parameters",
        "",
        "| parameter | fitted | prior |",
        "| --- | --- | --- |",
    ]
    for name, value in doc["parameters"].items():
        lines.append(f"| `{name}` | {value:.4g} | {PRIOR[name]:.4g} |")
    lines += [
        "",
        "`imageEfficiency.<generation>` adjusts `imageComputeRatio` x that generation's",
        "`computeEfficiency` (prior 1): a generation without image figures carries its",
        "LLM compute efficiency over. `attentionEfficiency.<engine class>` is the KV-cache",
        "read of an older engine's attention kernels against current vLLM's (the",
        "reference, 1): vLLM before 0.8 (V0), TensorRT-LLM 0.x and 1.x. vLLM V0 runs",
        "prompts as passes of their own (no chunked prefill), so prefill and decode add",
        "up there, as they do wherever the engine settings turn chunked prefill off.",
        "Time to first token is the wait for a slot, the step in progress and the",
        "prompt's own prefill at the load given, never below the prompt's prefill time.",
        "",
        "FP8 weights on Ada and Hopper compute at twice the 16-bit peak times",
        "`fp8ComputeFactor`; an FP8 KV cache (where the engine settings ask for one)",
        "stores one byte per element; AWQ/GPTQ weights are read at",
        "`weightOnlyBandwidthFactor` of the 16-bit bandwidth efficiency. The fit",
        "minimises the squared log error plus a log-normal pull (sigma 1) towards the",
        "prior, so a parameter no measurement constrains (Ada's image adjustment) keeps",
        "its prior.",
        "",
        "## Leave-one-source-out error",
        "",
        f"**Overall median absolute error: {doc['overallMedianAbsError']:.1%}** over "
        f"{doc['rows']} published figures from {len(dataset.sources)} sources "
        f"(goal <= {MEDIAN_ERROR_GOAL:.0%} overall, <= {SOURCE_ERROR_GOAL:.0%} per source).",
        "",
        "| source | figures | held-out median abs error | goal met |",
        "| --- | --- | --- | --- |",
    ]
    for key, src in dataset.sources.items():
        err = doc["sourceMedianAbsError"][key]
        n = sum(1 for r in dataset.rows if r.source == key)
        lines.append(f"| [{src.title}]({src.address}) | {n} | {err:.1%} | "
                     f"{'yes' if err <= SOURCE_ERROR_GOAL else '**no**'} |")  # fmt: skip
    lines += [
        "",
        "By GPU generation and precision (median; the bands each option quotes are the",
        "80% bands below):",
        "",
        "| group | measurements | sources | GPUs | held-out median abs error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, g in doc["evidence"].items():
        lines.append(f"| {key} | {g['measurements']} | {', '.join(g['sources'])} | "
                     f"{', '.join(g['gpus'])} | {g['medianAbsError']:.1%} |")  # fmt: skip
    lines += [
        "",
        "Each GPU type held out (fitted without any of its figures, from every other",
        "GPU type's): the error of an estimate for a GPU type nobody has measured,",
        "carried over from its generation's other GPU types, or from the prior where",
        "the generation has none.",
        "",
        "| GPU type held out | figures | held-out median abs error |",
        "| --- | --- | --- |",
    ]
    for gpu, err in doc["gpuHeldOutMedianAbsError"].items():
        n = sum(1 for r in dataset.rows if r.gpu == gpu)
        lines.append(f"| {gpu} | {n} | {err:.1%} |")
    lines += ["", *render_bands(doc)]
    l4 = [r for r in dataset.rows if r.gpu == "L4"]
    l4_sources = sorted({r.source for r in l4})
    lines += [
        "",
        f"**L4**: {len(l4)} figures from {', '.join(l4_sources)} (vLLM serving",
        "Qwen2.5-7B-Instruct and Qwen2.5-0.5B-Instruct in 16-bit, one request at a",
        "time to 64 in flight). Held out entirely, the fit from the other GPU types",
        "(Ada's efficiencies then rest on the L40S's FP8 figures alone) predicts them",
        f"within {doc['gpuHeldOutMedianAbsError']['L4']:.0%} (median): how far L4 estimates "
        "were off before these",
        "figures. They are community benchmarks, not a vendor's table: no NVIDIA,",
        "Google Cloud or AWS page with a stated L4 setting and a number (not a chart)",
        "was found. Not used: inference-bench's short regime (its stated ~200-token",
        "prompts are one-line questions in its published prompt file), its AWQ runs",
        "(the non-Marlin kernel with `--enforce-eager`) and its SGLang and llama.cpp",
        "runs (other engines). L4 FP8 and INT4 have no figure and carry over from",
        "the L40S's FP8 and Ampere's INT4; **Ada images** have none and keep the prior.",
        "",
        "**L4 latency figures looked at and not used.** inference-bench's TTFT (p50",
        "76 ms at concurrency 1 for its stated ~1,800-token prompts): prefilling",
        "1,800 tokens through Qwen2.5-7B is 27 TFLOP, 227 ms at the L4's full bf16",
        "peak, so those prompts hit vLLM's prefix cache (on by default in the V1",
        "engine; the padding is likely shared) and the figure is not a prefill",
        "time; its throughput rows may carry some of that saving too. ai.wmx.dev's",
        "TTFT p50 (27 ms at concurrency 1 rising to 135 ms at 32) and ITL p50",
        "(5.1 to 7.1 ms) for Qwen2.5-0.5B: added to the fit, the leave-one-source-out",
        "median went to 17% and inference-bench held out to 51%; with a per-request",
        "API-server cost and per-engine step overheads as parameters, 12.7%, L4",
        "held out 24% (measured when this step was made). The model has no host",
        "side: TTFT that grows fivefold while the GPU step grows 1.4x is the API",
        "server on a 4-vCPU host, and a 5.1 ms step for a 1 GB model is a smaller",
        "step overhead (vLLM 0.23) than the CI and GPUStack figures show (about",
        "2.7 ms). Both are named here as the next assumptions to fix, not fudged.",
        "",
        "**Figures added where the model had few** (time to first token of long",
        "prompts at low concurrency, FP8 70B with a current engine): NVIDIA NIM 1.8.0's",
        "Llama-3.3-70B table on 2 x H100 (fp8, TP 2; 5,000-token prompts at",
        "concurrency 1 to 50 and 500-token prompts at 1: TTFT, ITL, throughput) and",
        "GPUStack's mean TTFT at concurrency 4. The NIM page does not say which backend",
        "ran (TensorRT-LLM or vLLM), so its figures carry compute and bandwidth factors",
        f"of their own (fitted: {doc['parameters']['nimComputeFactor']:.2f} and "
        f"{doc['parameters']['nimBandwidthFactor']:.2f}) rather than bend the model of vLLM.",
        "Left out, and why: NIM's concurrency 100 to 250 (requests queue for KV-cache",
        "room, which the served model does not estimate); a vLLM 0.23 sweep of",
        'Llama-3.1-8B on an A100 40GB (johnmusgrave.com; only its prose, "about 75',
        'tokens/sec" at one request, was readable, not its table); a 2 x A10G vLLM',
        "run (arc53/llm-price-compass#6: a fine-tuned model whose ShareGPT answers",
        "average 43 tokens, the vLLM version unstated); MLPerf Inference results (no",
        "entry with a stated per-GPU setting for a catalog GPU and model was found in",
        "the searchable sources); vLLM's blog charts (bars, no numbers). **A10G and",
        "A100-40GB still have no figure**: their options quote the band of every GPU",
        "type's figures held out GPU by GPU, and say so. The served TTFT carries no",
        "API-server cost: GPUStack's 64 ms for 233-token prompts is four times the",
        "model's.",
        "",
        *goal_notes(doc),
        "",
        "Other misses, and why:",
        "",
        "- **inferd's own H100 SDXL figures** are the only Hopper image measurements;",
        "  held out, Hopper's image efficiency is carried over from its LLM compute",
        "  efficiency at Ampere's image-to-LLM ratio "
        f"({doc['parameters']['imageComputeRatio']:.2f}), and the H100's uncompiled",
        "  SDXL falls further short of that than the A100's does "
        f"({doc['sourceMedianAbsError']['inferd-h100']:.0%} held out, 51% before).",
        "- TensorRT-LLM v0.6's LLaMA 70B at batch 480 (128 in / 2048 out) is the",
        "  largest single miss (the model is about twice too fast): no other figure",
        "  shows that engine's large-batch slowdown.",
        "",
        "Reading the parameters: TensorRT-LLM reaches "
        f"{doc['parameters']['tensorrtLlmComputeFactor']:.2f}x vLLM's fraction of peak",
        "compute (one factor over every generation; the estimates are of vLLM). vLLM's",
        "prefill-heavy serving on an H100 reaches "
        f"{doc['parameters']['computeEfficiency.hopper']:.0%} of the bf16 peak "
        "(GPUStack's Qwen3-14B runs),",
        f"an A100 {doc['parameters']['computeEfficiency.ampere']:.0%}; decode reads reach "
        f"{doc['parameters']['bandwidthEfficiency.hopper']:.0%} of",
        "Hopper's peak bandwidth, at the edge of what HBM3 delivers, and",
        f"tensor parallelism keeps {doc['parameters']['tpScalingPerDoubling']:.0%} per "
        "doubling of the GPUs: so a",
        "4-way 70B replica is compute-bound on its prompts well before its",
        "bandwidth is used up.",
        "",
        "## Every figure",
        "",
        "`estimate` is the full fit's; `held out` is the fit without the row's source.",
        "",
        "| source | model (as stated) | GPUs | precision | engine | setting | published | "
        "estimate | held out | error (held out) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, p in zip(dataset.rows, doc["predictions"], strict=True):
        err = (p["heldOut"] - row.value) / row.value
        gpus = f"{row.gpus} x {row.gpu}"
        prec = row.precision + (" (FP8 KV)" if row.kv_cache == "fp8" else "")
        lines.append(
            f"| {row.source} | {row.stated_model} | {gpus} | {prec} | {row.engine} | "
            f"{row.setting()} | {row.stated} | {_num(p['inSample'])} {row.unit} | "
            f"{_num(p['heldOut'])} {row.unit} | {_pct(err)} |"
        )
    lines += ["", "## The three workloads", ""]
    for model, _flags, work, title in WORKLOADS:
        rec = recommend_for_workload(catalog.models.get(model), catalog.gpus, work, "us-east")
        lines += [f"### {title}", "", *explain(rec), ""]
    lines += [
        "Where an endpoint has been measured (`inferd bench ENDPOINT`), the",
        "recommendation refits the bandwidth and compute efficiencies of that GPU's",
        "generation and the step overhead to the endpoint's own throughput and TPOT,",
        'estimates that option with them, and says so ("measured on ..., model',
        "refitted to N measured points\", with the refit's error).",
        "",
    ]
    return "\n".join(lines)


COVERAGE_GOAL = 0.75  # of an 80% band, in every regime
# Before and after measured in one run (each side's code fitted and held out
# in its own process): benchmarks/recommendation_accuracy.py.
ACCURACY = ROOT / "benchmarks" / "results" / "recommendation_accuracy.json"


def accuracy_run() -> dict[str, Any]:
    return dict(json.loads(ACCURACY.read_text()))


def accuracy_is_stale(doc: dict[str, Any]) -> bool:
    """Whether the committed before/after run measured other code or figures
    than these: its "after" is this tree's fit, so its figures must be this
    fit's (to the rounding `fitted.json` keeps)."""
    after = accuracy_run()["runs"]["after"]
    same = round(after["loso"], 4) == doc["overallMedianAbsError"] and all(
        round(err, 4) == doc["gpuHeldOutMedianAbsError"][gpu] for gpu, err in after["byGpu"].items()
    )
    return not same or after["figures"] != doc["rows"]


def render_before_after(doc: dict[str, Any]) -> list[str]:
    run = accuracy_run()
    lines = [
        "## Before and after",
        "",
        f"One run of `{run['command']}` ({run['date'][:10]}, at {run['commit'][:7]};",
        "each side's code fitted to the figures and held out source by source and",
        'GPU type by GPU type in its own process; "every figure it can model": this',
        "tree's `published.yaml`, less rows of a scenario that code does not know).",
    ]
    for t in run["tables"]:
        cols = t["columns"]
        lines += ["", f"{t['title']}:", "", "| " + " | ".join(cols) + " |",
                  "|" + " --- |" * len(cols)]  # fmt: skip
        lines += ["| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |" for r in t["rows"]]
    if accuracy_is_stale(doc):
        lines += ["", "**Stale**: the after run above is not this fit; rerun the benchmark."]
    return lines


def goal_notes(doc: dict[str, Any]) -> list[str]:
    """The goals against this fit, and what the last model step changed."""
    dataset = published()
    ctx = context(load_catalog(), dataset)
    table_share = {
        name: 1 - weight_read_bytes(arch, prec) / weight_bytes(arch, prec)
        for name, prec in (("qwen2.5-7b", Precision("bf16")), ("llama-2-7b", Precision("fp8")))
        for arch in [dataset.architectures[name]]
    }
    without_l4 = fit([r for r in dataset.rows if r.gpu != "L4"], ctx)
    ada_without_l4 = without_l4["bandwidthEfficiency.ada"]
    loso = doc["overallMedianAbsError"]
    worst = sorted(doc["sourceMedianAbsError"].items(), key=lambda kv: -kv[1])[:3]
    by_gpu = doc["gpuHeldOutMedianAbsError"]
    missed_gpus = {g: e for g, e in by_gpu.items() if e > GPU_HELD_OUT_GOAL}
    loso_met = "met" if loso <= MEDIAN_ERROR_GOAL else "**not met**"
    by_source = doc["bandCoverage"]["sourceHeldOut"]
    ttft = [r for r in dataset.rows if r.regime == "ttft"]
    ttft_h100 = sum(1 for r in ttft if r.gpu == "H100-80GB")
    cov_met = all(v["coverage"] >= COVERAGE_GOAL for v in by_source.values())
    gpu_short = {
        k: v for k, v in doc["bandCoverage"]["gpuHeldOut"].items() if v["coverage"] < COVERAGE_GOAL
    }
    lines = [
        "Goals: leave-one-source-out median "
        f"{loso:.1%} (goal {MEDIAN_ERROR_GOAL:.0%}: {loso_met}); "
        "every GPU type held out within "
        f"{max(doc['gpuHeldOutMedianAbsError'].values()):.1%} (goal {GPU_HELD_OUT_GOAL:.0%}: "
        f"{'met' if not missed_gpus else '**not met** for ' + ', '.join(missed_gpus)}); "
        "the sources furthest off held out are "
        + ", ".join(f"{key} ({err:.0%})" for key, err in worst)
        + f" (goal {SOURCE_ERROR_GOAL:.0%} each); band coverage, source held out: "
        + ", ".join(f"{k} {v['coverage']:.0%}" for k, v in by_source.items())
        + f" (goal {COVERAGE_GOAL:.0%} each: {'met' if cov_met else '**not met**'}). "
        "With the GPU type held out instead, "
        + (
            ", ".join(f"{k} {v['coverage']:.0%}" for k, v in gpu_short.items())
            + f" fall short: {ttft_h100} of the {len(ttft)} TTFT figures are an H100's, so "
            "with the H100 held out its TTFT bands rest on "
            f"{len(ttft) - ttft_h100} figures of other GPUs, and the only Hopper image "
            "figures are inferd's own."
            if gpu_short
            else "every regime meets it too."
        ),
        "",
        "What moved L4 held out and the median (before and after: the table above):",
        "a decode step was taken to read every weight, the input embedding table",
        "too, but the step looks up only its tokens' rows of that table",
        "(`perfmodel.weight_read_bytes`; a tied table is the LM head's matrix and",
        f"is still read). That is {table_share['qwen2.5-7b']:.0%} of Qwen2.5-7B's bytes "
        f"(the L4's figures) but {table_share['llama-2-7b']:.0%} of",
        "LLaMA 2 7B's in FP8 (the L40S's), so the L4's decode was overcounted more than",
        "the L40S's. With the L4 held out, Ada's bandwidth efficiency still comes",
        f"from the L40S's TensorRT-LLM FP8 figures alone ({ada_without_l4:.2f}, against "
        f"{doc['parameters']['bandwidthEfficiency.ada']:.2f}",
        "with the L4's): that gap, a different engine, precision and memory",
        "configuration on the same generation, is what L4 held out still misses by.",
        "The same reasoning for compute (a",
        "lookup computes nothing; a prompt's LM head runs for its last token only)",
        "is not in the model: with it the median was 10.5% and H100 held out 15.2%",
        "(measured on this dataset when this step was made), because Hopper's",
        "compute efficiency is set by GPUStack's H100 prefill runs (about 30% of",
        "the bf16 peak), which fewer FLOPs per prompt token push further off.",
    ]
    return lines


def render_bands(doc: dict[str, Any]) -> list[str]:
    """The band rule and how often it held, per regime."""
    lines = [
        "## Error bands",
        "",
        f"Every option quotes an {COVERAGE:.0%} band (`inferd.catalog.bands`, split-conformal):",
        "the ceil((n + 1) x 0.8)-th smallest of the n held-out errors of the nearest group",
        f"of at least {MIN_FIGURES} published figures like the estimate (same GPU generation,",
        "precision and regime; else same generation and regime; else same regime; else",
        "all). With few figures that is the largest or next to largest error seen. A GPU",
        "type with figures of its own draws on the errors with each source held out; one",
        'with none says "no figure for this GPU" and draws on the errors with each GPU',
        "type held out. Chat options quote the throughput regime (what sizes the",
        "replicas); TTFT and per-token latency have their own regimes.",
        "",
        "Coverage: for every figure, the band computed without its source (or its GPU",
        "type), and whether its own held-out error falls inside (goal: at least 75% in",
        "every regime).",
        "",
        "| regime | figures | coverage, source held out | coverage, GPU type held out |",
        "| --- | --- | --- | --- |",
    ]
    by_source, by_gpu = doc["bandCoverage"]["sourceHeldOut"], doc["bandCoverage"]["gpuHeldOut"]
    for regime, cov in by_source.items():
        lines.append(f"| {regime} | {cov['figures']} | {cov['coverage']:.0%} | "
                     f"{by_gpu[regime]['coverage']:.0%} |")  # fmt: skip
    return lines


def _speed(o: WorkloadOption) -> str:
    p = o.performance
    assert p is not None
    if p.seconds_per_image_p95 is not None:
        return (f"batch {p.batch}, {p.throughput * 60:.1f} images/minute a replica, "
                f"{p.seconds_per_image_p95:.2f} s an image (p95)")  # fmt: skip
    assert p.ttft_p95_s is not None and p.tpot_p95_s is not None
    return (f"batch {p.batch}, {p.throughput:,.0f} output tokens/s a replica, TTFT p95 "
            f"{p.ttft_p95_s * 1000:.0f} ms, TPOT p95 {p.tpot_p95_s * 1000:.1f} ms")  # fmt: skip


def explain(rec: WorkloadRecommendation) -> list[str]:
    """The pick, against the cheapest option of every other GPU type, with
    the error bands that decide whether the difference is real."""
    best = rec.best()
    if best is None:
        return ["No option meets the targets."]
    assert best.error_band is not None
    out = [
        f"Pick: **{best.gpu_count} x {best.gpu_type}**, {best.replicas} replica(s), "
        f"{best.total_hourly_price:.2f} {rec.currency}/h ({_speed(best)}). "
        f"The estimate rests on {best.evidence}.",
        "",
    ]
    seen = {best.gpu_type}
    for o in rec.options:
        if o.gpu_type in seen or len(seen) > 4:
            continue
        seen.add(o.gpu_type)
        assert o.error_band is not None
        more = o.total_hourly_price / best.total_hourly_price - 1
        together = best.error_band + o.error_band
        verdict = (
            f"more than both error bands together ({together:.0%}): the pick holds on this evidence"
            if more > together
            else f"within both error bands together ({together:.0%}): on this evidence the two "
            "are not told apart"
        )
        out.append(
            f"- {o.gpu_count} x {o.gpu_type}: {o.replicas} replica(s), "
            f"{o.total_hourly_price:.2f} {rec.currency}/h, {more:+.0%}, {verdict}. "
            f"({_speed(o)}; {o.evidence}.)"
        )
    return out


def replace_examples(page: str, examples: str) -> str:
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + examples + "\n" + page[end:]


def example_pages() -> list[Path]:
    """The pages that show the worked examples (between the markers)."""
    pages = [p for p in (README, *sorted(DOCS.glob("*.md"))) if BEGIN in p.read_text()]
    if not pages:
        raise SystemExit(f"no page has the {BEGIN} marker")
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args(argv)
    dataset = published()
    doc = fitted_document(dataset, context(load_catalog(), dataset))
    fitted_text = json.dumps(doc, indent=1) + "\n"
    if args.check:
        stale = []
        if not FITTED.is_file() or json.loads(FITTED.read_text()) != json.loads(fitted_text):
            stale.append(FITTED)
        if not DOC.is_file() or DOC.read_text() != render_doc(doc):
            stale.append(DOC)
        examples = render_examples()
        for page in example_pages():
            if replace_examples(page.read_text(), examples) != page.read_text():
                stale.append(page)
        if accuracy_is_stale(doc):
            print(f"{ACCURACY} is stale: run python benchmarks/recommendation_accuracy.py "
                  "(then python benchmarks/report.py)", file=sys.stderr)  # fmt: skip
            stale.append(ACCURACY)
        for path in stale:
            print(f"{path} is stale: run python scripts/recommendation_table.py", file=sys.stderr)
        return 1 if stale else 0
    FITTED.write_text(fitted_text)
    reload()
    DOC.write_text(render_doc(doc))
    examples = render_examples()
    pages = example_pages()
    for page in pages:
        page.write_text(replace_examples(page.read_text(), examples))
    print(f"wrote {FITTED}, {DOC}, {', '.join(map(str, pages))}")
    if accuracy_is_stale(doc):
        print(f"{ACCURACY} is stale: run python benchmarks/recommendation_accuracy.py, "
              "then this script again", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
