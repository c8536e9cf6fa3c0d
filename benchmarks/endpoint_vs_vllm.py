"""The whole inferd path (gateway + replica, started by `inferd serve`)
against vLLM's own OpenAI server: same tiny model, same engine
configuration, same closed-loop load, one run.

    .venv/bin/python benchmarks/endpoint_vs_vllm.py [--requests 64 --concurrency 8
        --max-tokens 64 --rounds 3]

- endpoint: `inferd serve` (a real process, its own state directory) with an
  endpoint of tiny-chat, minReplicas = maxReplicas = 1, so one vLLM replica
  on the CPU serves it; requests go to the endpoint's `url` with its bearer
  token, as a client's would.
- vllm-server: `python -m vllm.entrypoints.openai.api_server` with the
  engine arguments inferd's vLLM engine uses for that replica
  (`engine_args_for` with `--device cpu`), VLLM_CPU_KVCACHE_SPACE=1.

Both are up at once and measured in alternating rounds, non-streamed and
streamed (`ignore_eos`, so every request makes exactly --max-tokens tokens);
output tokens/s is the median over rounds. Then the same with tools offered
(tool_choice auto, vLLM's `hermes` parser on both sides: the catalog's
toolCallParser for the endpoint). Goal: the endpoint's output tokens/s >=
0.95 of vLLM's server in every mode.

Last, vLLM's own benchmark client (`vllm bench serve --backend openai-chat`,
random prompts of --vllm-bench-input-len tokens, --max-tokens out) against
the endpoint URL and vLLM's server, one after the other in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from common import (
    TOOLS_BODY,
    LoadResult,
    chat_rounds,
    load_average,
    pin_engine_cores,
    pooled,
    print_table,
    start_vllm_server,
    stop_process_group,
    vllm_bench_serve,
    wait_http_ok,
    write_report,
)
from results_format import all_met, goal, not_measured, table

from inferd.testing import ServeHandle, free_port

GOAL = 0.95
MODEL = "tiny-chat"
COLUMNS = ["mode", "label", "requests", "errors", "output_tokens_per_s", "tok/s rounds",
           "tok/s ratio", "ttft_p50_ms", "ttft p50 delta ms", "latency_p50_ms",
           "latency_p99_ms"]  # fmt: skip
# What the result keeps of `vllm bench serve`'s figures, per side.
CLIENT_KEEP = ("completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
               "median_tpot_ms", "median_e2el_ms")  # fmt: skip
CLIENT_COLUMNS = ["label", *CLIENT_KEEP, "tok/s ratio"]
CLIENT_SIDES = ("inferd-endpoint", "vllm-server")


def start_endpoint(serve: ServeHandle) -> tuple[str, dict[str, str]]:
    created = serve.create_endpoint(name="bench", modelName=MODEL, minReplicas=1, maxReplicas=1)
    serve.wait_record(
        created["id"], lambda r: r["status"] == "running" and r["currentReplicas"] == 1, 900, 0.5
    )
    url = f"{created['url']}/openai/v1/chat/completions"
    return url, {"Authorization": f"Bearer {created['accessToken']}"}


def side_row(label: str, runs: dict[str, list[LoadResult]]) -> dict[str, Any]:
    row = pooled(label, runs[label])
    row["tok/s rounds"] = [round(r.tokens_per_s, 1) for r in runs[label]]
    return row


def tokens_ratio(ours: float | None, theirs: float | None) -> float | None:
    """The endpoint's rate over vLLM's server's; None when the server
    delivered nothing, leaving nothing to compare against."""
    return ours / theirs if ours is not None and theirs else None


def mode_result(
    base: dict[str, Any], ours: dict[str, Any], load_before: str, load_after: str
) -> dict[str, Any]:
    """One mode's raw figures; the endpoint's row gains the ratio and the TTFT
    difference the table shows."""
    ratio = tokens_ratio(ours["output_tokens_per_s"], base["output_tokens_per_s"])
    ours["tok/s ratio"] = None if ratio is None else round(ratio, 3)
    if base["ttft_p50_ms"] is not None and ours["ttft_p50_ms"] is not None:
        ours["ttft p50 delta ms"] = round(ours["ttft_p50_ms"] - base["ttft_p50_ms"], 3)
    return {
        "vllm_server": base,
        "inferd_endpoint": ours,
        "tokens_per_s_ratio": None if ratio is None else round(ratio, 4),
        "load_before": load_before,
        "load_after": load_after,
    }


def reasons(*why: str) -> str:
    return "; ".join(w for w in why if w)


def ratio_goal(
    name: str, ratio: float | None, ours_errors: int, theirs_errors: int
) -> dict[str, Any]:
    """`ratio` against GOAL. A failed request is missing from its side's
    figures, so any fails the goal however the figures compare."""
    target = f">= {GOAL}x"
    errors = ours_errors + theirs_errors
    failed = (
        f"{errors} errors ({ours_errors} endpoint, {theirs_errors} vLLM's server)" if errors else ""
    )
    if ratio is None:
        return not_measured(name, target, reasons("vLLM's server delivered no tokens", failed))
    slower = "" if ratio >= GOAL else "slower than vLLM's server in this run"
    met = ratio >= GOAL and not failed
    return goal(name, target, round(ratio, 3), met, reasons(failed, slower))


def mode_goals(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The docstring's goal, in every mode."""
    goals = {}
    for mode, result in results.items():
        ours, theirs = result["inferd_endpoint"], result["vllm_server"]
        goals[mode] = ratio_goal(
            f"{mode}: endpoint output tokens/s vs vLLM's server",
            tokens_ratio(ours["output_tokens_per_s"], theirs["output_tokens_per_s"]),
            ours["errors"],
            theirs["errors"],
        )
    return goals


def mode_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for mode, result in results.items():
        rows += [
            {"mode": mode, **result["vllm_server"]},
            {"mode": mode, **result["inferd_endpoint"]},
        ]
    return rows


def client_ratio(client: dict[str, Any]) -> float | None:
    ours, theirs = (client[label]["output_throughput"] for label in CLIENT_SIDES)
    return tokens_ratio(ours, theirs)


def client_rows(client: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{"label": label, **client[label]} for label in CLIENT_SIDES]
    ratio = client_ratio(client)
    rows[0]["tok/s ratio"] = None if ratio is None else round(ratio, 3)
    return rows


def client_goal(client: dict[str, Any]) -> dict[str, Any]:
    """The docstring's goal held under vLLM's own benchmark client too: its
    figures are the ones a vLLM user would compare."""
    ours, theirs = (client[label].get("failed") or 0 for label in CLIENT_SIDES)
    name = "vllm bench serve: endpoint output throughput vs vLLM's server"
    return ratio_goal(name, client_ratio(client), ours, theirs)


def client_title(args: argparse.Namespace) -> str:
    return (
        f"vLLM's benchmark client (vllm bench serve --backend openai-chat): "
        f"{args.vllm_bench_prompts} prompts, {args.concurrency} concurrent, "
        f"{args.vllm_bench_input_len} in / {args.max_tokens} out tokens"
    )


def build_report(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    goals: dict[str, dict[str, Any]],
    client: dict[str, Any],
) -> dict[str, Any]:
    """The run as a result file (`results_format`): both printed tables,
    every mode's goal and vLLM's client's, and the raw figures (`results`,
    `vllm_bench_serve`) as before."""
    pinned = "pinned as inferd pins its own" if args.reference_pinned else "as shipped"
    return {
        "title": "The whole inferd path (inferd serve endpoint) against vLLM's own OpenAI "
        "server (tiny-chat, CPU)",
        "workload": (
            f"{args.requests} requests x {args.rounds} alternating rounds per mode, "
            f"{args.concurrency} concurrent, {args.max_tokens} output tokens (ignore_eos), "
            "chat streamed and not, then the same with a tool offered (tool_choice auto); "
            f"then vllm bench serve: {args.vllm_bench_prompts} random prompts of "
            f"{args.vllm_bench_input_len} tokens, {args.max_tokens} out, "
            f"{args.concurrency} concurrent; vLLM's engine core {pinned}"
        ),
        "config": vars(args) | {"out": str(args.out)},
        "tables": [
            table("Per mode and side (closed loop, median of rounds)", COLUMNS, mode_rows(results)),
            table(client_title(args), CLIENT_COLUMNS, client_rows(client)),
        ],
        "goals": [*goals.values(), client_goal(client)],
        "results": {
            mode: {**result, "goal_met": goals[mode]["status"] == "met"}
            for mode, result in results.items()
        },
        "goal": f"endpoint output tokens/s >= {GOAL} x vLLM server",
        "goal_met": all_met(list(goals.values())),
        "vllm_bench_serve": client,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=64, help="per round and side")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reference-pinned",
        action="store_true",
        help="run vLLM's engine core on its workers' CPUs in the reference server too, as "
        "inferd does on a CPU (see keep_engine_core_with_its_workers); default: as shipped",
    )
    parser.add_argument("--vllm-bench-prompts", type=int, default=64)
    parser.add_argument("--vllm-bench-input-len", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from inferd.catalog.tiny import ensure_tiny_model
    from inferd.engines.base import EngineOptions

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model_path = ensure_tiny_model(MODEL)
    print(f"{load_average()}")
    work = Path(tempfile.mkdtemp(prefix="bench-endpoint-"))
    vllm_port = free_port()
    reference = start_vllm_server(
        model_path,
        EngineOptions(engine="vllm", device="cpu"),
        vllm_port,
        work / "vllm-server.log",
        served_name=MODEL,
    )
    serve = ServeHandle(work / "serve", settings={"replica_args": "--cpu-kv-cache-gib 1"})
    try:
        serve.start()
        endpoint_url, endpoint_headers = start_endpoint(serve)
        wait_http_ok(f"http://127.0.0.1:{vllm_port}/health", reference, timeout=900)
        if args.reference_pinned:
            print("reference engine cores pinned:", pin_engine_cores(reference.pid))
        targets = {
            "vllm-server": (f"http://127.0.0.1:{vllm_port}/v1/chat/completions", {}),
            "inferd-endpoint": (endpoint_url, endpoint_headers),
        }

        def measure(
            rounds: int, requests: int, stream: bool, extra: dict[str, Any] | None = None
        ) -> dict[str, list[LoadResult]]:
            return asyncio.run(
                chat_rounds(targets, model=MODEL, rounds=rounds, requests=requests,
                            concurrency=args.concurrency, max_tokens=args.max_tokens,
                            stream=stream, extra=extra)
            )  # fmt: skip

        # Warm both paths (connections, first-call costs); not measured.
        for stream in (False, True):
            measure(1, 16, stream)
        results: dict[str, dict[str, Any]] = {}
        parts = [(False, None), (True, None), (False, TOOLS_BODY), (True, TOOLS_BODY)]
        for stream, extra in parts:
            mode = ("tools " if extra else "") + ("stream" if stream else "non-stream")
            load_before = load_average()
            runs = measure(args.rounds, args.requests, stream, extra)
            base = side_row("vllm-server", runs)
            ours = side_row("inferd-endpoint", runs)
            results[mode] = mode_result(base, ours, load_before, load_average())
        print_table(
            f"endpoint (gateway + replica) vs vLLM server: {args.requests} requests x "
            f"{args.rounds} alternating rounds, {args.concurrency} concurrent, "
            f"{args.max_tokens} output tokens; {load_average()}",
            mode_rows(results),
            COLUMNS,
        )
        goals = mode_goals(results)
        short = [mode for mode, judged in goals.items() if judged["status"] != "met"]
        print(
            f"\ngoal: endpoint output tokens/s >= {GOAL} x vLLM server's, streamed and not: "
            + (f"NOT met ({', '.join(short)})" if short else "met")
        )
        client = bench_with_vllm_client(args, model_path, endpoint_url, endpoint_headers, vllm_port)
        report = build_report(args, results, goals, client)
        write_report("endpoint_vs_vllm", report, args.out)
    finally:
        serve.cleanup()
        stop_process_group(reference)
    return 0


def bench_with_vllm_client(
    args: argparse.Namespace,
    model_path: Path,
    endpoint_url: str,
    endpoint_headers: dict[str, str],
    vllm_port: int,
) -> dict[str, Any]:
    """vLLM's benchmark client against both, the endpoint first."""
    base, _, path = endpoint_url.partition("/openai/v1/")
    sides = {
        "inferd-endpoint": (f"{base}/openai", "/v1/" + path, endpoint_headers),
        "vllm-server": (f"http://127.0.0.1:{vllm_port}", "/v1/chat/completions", {}),
    }
    client: dict[str, Any] = {}
    for label, (base_url, endpoint, headers) in sides.items():
        result = vllm_bench_serve(
            base_url,
            endpoint,
            model=MODEL,
            tokenizer=model_path,
            num_prompts=args.vllm_bench_prompts,
            concurrency=args.concurrency,
            input_len=args.vllm_bench_input_len,
            output_len=args.max_tokens,
            headers=headers,
        )
        client[label] = {key: result.get(key) for key in CLIENT_KEEP}
    ratio = client_ratio(client)
    client["output_throughput_ratio"] = None if ratio is None else round(ratio, 4)
    print_table(client_title(args), client_rows(client), CLIENT_COLUMNS)
    return client


if __name__ == "__main__":
    raise SystemExit(main())
