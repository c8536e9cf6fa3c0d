"""inferd's replica against vLLM's own OpenAI server: same model, same engine
configuration, same closed-loop load, one run.

    python benchmarks/replica_vs_vllm.py [--requests 64 --concurrency 8 --max-tokens 64]

Both servers are started at once and measured in alternating rounds (so
drift on a shared machine hits both), streamed and not, then the same with
tools offered (tool_choice auto: every delta through vLLM's `hermes` tool
parser on both sides). Goals: inferd's output tokens/s >= 0.95 of vLLM's
server (tool calling too); TTFT p50 within +5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

from common import (
    TOOL_PARSER,
    TOOLS_BODY,
    LoadResult,
    chat_rounds,
    pin_engine_cores,
    pooled,
    print_table,
    start_vllm_server,
    wait_http_ok,
    write_report,
)
from results_format import all_met, goal, not_measured, table

from inferd.engines.base import EngineOptions
from inferd.testing import ReplicaHandle, free_port

GOAL = 0.95
TTFT_SLACK_MS = 5.0
COLUMNS = ["mode", "label", "errors", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
           "latency_p50_ms", "latency_p99_ms", "tok/s ratio", "ttft p50 delta ms"]  # fmt: skip

# One mode as measured: its name, whether it streamed, and the pooled rows
# (`common.pooled`) of vLLM's server and of inferd's replica.
Measured = tuple[str, bool, dict[str, Any], dict[str, Any]]


def tokens_ratio(base: dict[str, Any], ours: dict[str, Any]) -> float | None:
    """inferd's output tokens/s over vLLM's server's; None when the server
    delivered none, leaving nothing to compare against."""
    theirs = base["output_tokens_per_s"]
    return ours["output_tokens_per_s"] / theirs if theirs else None


def ttft_delta(base: dict[str, Any], ours: dict[str, Any]) -> float | None:
    """inferd's TTFT p50 minus vLLM's server's, in ms; None unless both sides
    streamed a first token (a non-streamed answer has none)."""
    if base["ttft_p50_ms"] is None or ours["ttft_p50_ms"] is None:
        return None
    return round(ours["ttft_p50_ms"] - base["ttft_p50_ms"], 3)


def errors_why(base: dict[str, Any], ours: dict[str, Any]) -> str:
    """A failed request is missing from its side's figures, so a mode with
    any fails its goals however the figures compare."""
    errors = base["errors"] + ours["errors"]
    if not errors:
        return ""
    return f"{errors} errors ({ours['errors']} inferd, {base['errors']} vLLM's server)"


def reasons(*why: str) -> str:
    return "; ".join(w for w in why if w)


def mode_goals(
    mode: str, stream: bool, base: dict[str, Any], ours: dict[str, Any]
) -> list[dict[str, Any]]:
    """The docstring's goals for one mode: output tokens/s, and TTFT p50 where
    the mode streams."""
    failed = errors_why(base, ours)
    name = f"{mode}: output tokens/s vs vLLM's server"
    target = f">= {GOAL}x"
    ratio = tokens_ratio(base, ours)
    if ratio is None:
        why = reasons("vLLM's server delivered no output tokens", failed)
        goals = [not_measured(name, target, why)]
    else:
        met = ratio >= GOAL and not failed
        why = reasons(failed, "" if ratio >= GOAL else "slower than vLLM's server in this run")
        goals = [goal(name, target, round(ratio, 3), met, why)]
    if not stream:
        return goals
    name = f"{mode}: TTFT p50, inferd's minus vLLM server's"
    target = f"<= +{TTFT_SLACK_MS:g} ms"
    delta = ttft_delta(base, ours)
    if delta is None:
        why = reasons("a side streamed no first token", failed)
        goals.append(not_measured(name, target, why))
    else:
        met = delta <= TTFT_SLACK_MS and not failed
        later = "" if delta <= TTFT_SLACK_MS else "a later first token than vLLM's server's"
        goals.append(goal(name, target, delta, met, reasons(failed, later)))
    return goals


def mode_rows(mode: str, base: dict[str, Any], ours: dict[str, Any]) -> list[dict[str, Any]]:
    ratio = tokens_ratio(base, ours)
    return [
        {"mode": mode, **base},
        {
            "mode": mode,
            **ours,
            "tok/s ratio": None if ratio is None else round(ratio, 3),
            "ttft p50 delta ms": ttft_delta(base, ours),
        },
    ]


def build_report(args: argparse.Namespace, measured: list[Measured]) -> dict[str, Any]:
    """The run as a result file (`results_format`): the printed table, every
    mode's goals, and each mode's raw figures under `results`."""
    rows: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    for mode, stream, base, ours in measured:
        rows += mode_rows(mode, base, ours)
        judged = mode_goals(mode, stream, base, ours)
        goals += judged
        ratio = tokens_ratio(base, ours)
        results[mode] = {
            "vllm_server": base,
            "inferd_replica": ours,
            "tokens_per_s_ratio": None if ratio is None else round(ratio, 4),
            "ttft_p50_delta_ms": ttft_delta(base, ours),
            "goal_met": all_met(judged),
        }
    pinned = "pinned as inferd pins its own" if args.reference_pinned else "as shipped"
    return {
        "title": f"inferd's replica against vLLM's own OpenAI server ({args.model})",
        "workload": (
            f"{args.requests} requests x {args.rounds} alternating rounds per mode, "
            f"{args.concurrency} concurrent, {args.max_tokens} output tokens (ignore_eos), "
            f"greedy, device {args.device}; chat streamed and not, then the same with a tool "
            f"offered (tool_choice auto, the `{TOOL_PARSER}` parser on both sides); vLLM's "
            f"engine core {pinned}"
        ),
        "config": vars(args) | {"out": str(args.out)},
        "tables": [table("Per mode and server", COLUMNS, rows)],
        "goals": goals,
        "results": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-chat", help="catalog name or local directory")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--reference-pinned",
        action="store_true",
        help="run vLLM's engine core on its workers' CPUs in the reference server too, as "
        "inferd does on a CPU (see keep_engine_core_with_its_workers); default: as shipped",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from inferd.catalog import load_catalog, resolve_model

    model_path = resolve_model(args.model, load_catalog().models).path
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    options = EngineOptions(engine="vllm", device=args.device)
    vllm_port = free_port()
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    reference = start_vllm_server(model_path, options, vllm_port, logs / "bench-vllm-server.log")
    replica = ReplicaHandle(
        str(model_path),
        [
            *("--engine", "vllm", "--device", args.device, "--served-model-name", "tiny-chat"),
            *("--tool-call-parser", TOOL_PARSER),
        ],
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{vllm_port}/health", reference, timeout=600)
        if args.reference_pinned:
            print("reference engine cores pinned:", pin_engine_cores(reference.pid))
        replica.wait_ready(timeout=600)
        targets: dict[str, tuple[str, dict[str, str]]] = {
            "vllm-server": (f"http://127.0.0.1:{vllm_port}/v1/chat/completions", {}),
            "inferd-replica": (f"{replica.url}/openai/v1/chat/completions", {}),
        }

        def measure(
            rounds: int, requests: int, stream: bool, extra: dict[str, Any] | None = None
        ) -> dict[str, list[LoadResult]]:
            return asyncio.run(
                chat_rounds(targets, model="tiny-chat", rounds=rounds, requests=requests,
                            concurrency=args.concurrency, max_tokens=args.max_tokens,
                            stream=stream, extra=extra)
            )  # fmt: skip

        measure(1, 16, True)  # warm both: first requests pay for lazy initialisation
        measured: list[Measured] = []
        parts = [(False, None), (True, None), (False, TOOLS_BODY), (True, TOOLS_BODY)]
        for stream, extra in parts:
            runs = measure(args.rounds, args.requests, stream, extra)
            mode = ("tools " if extra else "") + ("stream" if stream else "non-stream")
            base = pooled("vllm-server", runs["vllm-server"])
            ours = pooled("inferd-replica", runs["inferd-replica"])
            measured.append((mode, stream, base, ours))
        report = build_report(args, measured)
        print_table(
            f"replica vs vLLM server: {args.requests} requests x {args.rounds} rounds, "
            f"{args.concurrency} concurrent, {args.max_tokens} output tokens",
            report["tables"][0]["rows"],
            COLUMNS,
        )
        write_report("replica_vs_vllm", report, args.out)
    finally:
        replica.stop()
        reference.terminate()
        try:
            reference.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(reference.pid, 9)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
