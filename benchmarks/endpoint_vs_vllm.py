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

from inferd.testing import ServeHandle, free_port

GOAL = 0.95
MODEL = "tiny-chat"


def start_endpoint(serve: ServeHandle) -> tuple[str, dict[str, str]]:
    created = serve.create_endpoint(name="bench", modelName=MODEL, minReplicas=1, maxReplicas=1)
    serve.wait_record(
        created["id"], lambda r: r["status"] == "running" and r["currentReplicas"] == 1, 900, 0.5
    )
    url = f"{created['url']}/openai/v1/chat/completions"
    return url, {"Authorization": f"Bearer {created['accessToken']}"}


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
        report: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}, "results": {}}
        rows = []
        parts = [(False, None), (True, None), (False, TOOLS_BODY), (True, TOOLS_BODY)]
        for stream, extra in parts:
            mode = ("tools " if extra else "") + ("stream" if stream else "non-stream")
            load_before = load_average()
            runs = measure(args.rounds, args.requests, stream, extra)
            base = pooled("vllm-server", runs["vllm-server"])
            ours = pooled("inferd-endpoint", runs["inferd-endpoint"])
            rounds_rate = {
                name: [round(r.tokens_per_s, 1) for r in results] for name, results in runs.items()
            }
            base["tok/s rounds"] = rounds_rate["vllm-server"]
            ours["tok/s rounds"] = rounds_rate["inferd-endpoint"]
            ratio = ours["output_tokens_per_s"] / base["output_tokens_per_s"]
            ours["tok/s ratio"] = round(ratio, 3)
            if base["ttft_p50_ms"] is not None and ours["ttft_p50_ms"] is not None:
                ours["ttft p50 delta ms"] = round(ours["ttft_p50_ms"] - base["ttft_p50_ms"], 3)
            rows += [{"mode": mode, **base}, {"mode": mode, **ours}]
            report["results"][mode] = {
                "vllm_server": base,
                "inferd_endpoint": ours,
                "tokens_per_s_ratio": round(ratio, 4),
                "goal_met": ratio >= GOAL,
                "load_before": load_before,
                "load_after": load_average(),
            }
        print_table(
            f"endpoint (gateway + replica) vs vLLM server: {args.requests} requests x "
            f"{args.rounds} alternating rounds, {args.concurrency} concurrent, "
            f"{args.max_tokens} output tokens; {load_average()}",
            rows,
            ["mode", "label", "requests", "errors", "output_tokens_per_s", "tok/s rounds",
             "tok/s ratio", "ttft_p50_ms", "ttft p50 delta ms", "latency_p50_ms",
             "latency_p99_ms"],
        )  # fmt: skip
        met = all(r["goal_met"] for r in report["results"].values())
        short = [m for m, r in report["results"].items() if not r["goal_met"]]
        print(
            f"\ngoal: endpoint output tokens/s >= {GOAL} x vLLM server's, streamed and not: "
            + ("met" if met else f"NOT met ({', '.join(short)})")
        )
        report["goal"] = f"endpoint output tokens/s >= {GOAL} x vLLM server"
        report["goal_met"] = met
        report["vllm_bench_serve"] = bench_with_vllm_client(
            args, model_path, endpoint_url, endpoint_headers, vllm_port
        )
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
    results: dict[str, Any] = {}
    rows = []
    keep = ("completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
            "median_tpot_ms", "median_e2el_ms")  # fmt: skip
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
        results[label] = {key: result.get(key) for key in keep}
        rows.append({"label": label, **results[label]})
    ratio = (
        results["inferd-endpoint"]["output_throughput"]
        / results["vllm-server"]["output_throughput"]
    )
    rows[0]["tok/s ratio"] = round(ratio, 3)
    results["output_throughput_ratio"] = round(ratio, 4)
    print_table(
        f"vLLM's benchmark client (vllm bench serve --backend openai-chat): "
        f"{args.vllm_bench_prompts} prompts, {args.concurrency} concurrent, "
        f"{args.vllm_bench_input_len} in / {args.max_tokens} out tokens",
        rows,
        ["label", *keep, "tok/s ratio"],
    )
    return results


if __name__ == "__main__":
    raise SystemExit(main())
