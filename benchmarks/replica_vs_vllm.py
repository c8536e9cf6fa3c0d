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

from inferd.engines.base import EngineOptions
from inferd.testing import ReplicaHandle, free_port


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
        report: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}, "results": {}}
        rows = []
        parts = [(False, None), (True, None), (False, TOOLS_BODY), (True, TOOLS_BODY)]
        for stream, extra in parts:
            runs = measure(args.rounds, args.requests, stream, extra)
            mode = ("tools " if extra else "") + ("stream" if stream else "non-stream")
            base = pooled("vllm-server", runs["vllm-server"])
            ours = pooled("inferd-replica", runs["inferd-replica"])
            ratio = ours["output_tokens_per_s"] / base["output_tokens_per_s"]
            ttft_delta = (
                None
                if base["ttft_p50_ms"] is None
                else round(ours["ttft_p50_ms"] - base["ttft_p50_ms"], 3)
            )
            for row in (base, ours):
                rows.append({"mode": mode, **row})
            rows[-1]["tok/s ratio"] = round(ratio, 3)
            rows[-1]["ttft p50 delta ms"] = ttft_delta
            report["results"][mode] = {
                "vllm_server": base,
                "inferd_replica": ours,
                "tokens_per_s_ratio": round(ratio, 4),
                "ttft_p50_delta_ms": ttft_delta,
                "goal_met": ratio >= 0.95 and (ttft_delta is None or ttft_delta <= 5),
            }
        print_table(
            f"replica vs vLLM server: {args.requests} requests x {args.rounds} rounds, "
            f"{args.concurrency} concurrent, {args.max_tokens} output tokens",
            rows,
            ["mode", "label", "errors", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
             "latency_p50_ms", "latency_p99_ms", "tok/s ratio", "ttft p50 delta ms"],
        )  # fmt: skip
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
