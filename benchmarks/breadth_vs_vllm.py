"""Completions and embeddings: inferd's replica against vLLM's own OpenAI server.

    python benchmarks/breadth_vs_vllm.py [--requests 64 --concurrency 8 --rounds 3]

Per part, both servers run the same model with the same engine arguments
(`engine_args_for` / `pooling_engine_args`) and are measured in alternating
rounds (drift on a shared machine hits both): completions of tiny-chat
(`--max-tokens` tokens each, ignore_eos) and embeddings of tiny-embed
(`--inputs` texts per request). Closed loop: `--concurrency` requests in
flight. Goal: inferd's throughput >= 1.0x vLLM's server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from common import (
    alternating,
    print_table,
    stop_process_group,
    vllm_cli_flags,
    wait_http_ok,
    write_report,
)
from results_format import goal, not_measured, table

from inferd.engines.base import EngineOptions
from inferd.testing import ReplicaHandle, free_port

GOAL = 1.0
COLUMNS = ["part", "label", "errors", "requests_per_s", "tokens_per_s", "latency_p50_ms", "ratio"]


async def closed_loop(
    url: str, body: Callable[[int], dict[str, Any]], requests: int, concurrency: int
) -> dict[str, Any]:
    """`requests` POSTs, `concurrency` at a time: requests/s, tokens/s (the
    usage the answers report), latency p50 and errors."""
    latencies: list[float] = []
    tokens = 0
    errors = 0
    queue = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens, errors
        for index in queue:
            began = time.perf_counter()
            answer = await client.post(url, json=body(index))
            latencies.append(time.perf_counter() - began)
            if answer.status_code != 200:
                errors += 1
                continue
            usage = answer.json()["usage"]
            tokens += usage.get("completion_tokens") or usage.get("prompt_tokens") or 0

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return {
        "requests_per_s": requests / elapsed,
        "tokens_per_s": tokens / elapsed,
        "latency_p50_ms": statistics.median(latencies) * 1000,
        "errors": errors,
    }


def pooled(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "label": label,
        "rounds": len(runs),
        "requests_per_s": statistics.mean(r["requests_per_s"] for r in runs),
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in runs),
        "latency_p50_ms": statistics.median(r["latency_p50_ms"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "per_round_tokens_per_s": [round(r["tokens_per_s"], 1) for r in runs],
    }


@contextmanager
def servers(
    model_path: Path, name: str, engine_args: dict[str, Any], replica_args: list[str]
) -> Iterator[tuple[str, str]]:
    """vLLM's server and an inferd replica on the same model: their base URLs."""
    import subprocess

    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-breadth-{name}.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path), "--host", "127.0.0.1", "--port", str(port),
        "--disable-uvicorn-access-log", *vllm_cli_flags(engine_args),
    ]  # fmt: skip
    reference = subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    replica = ReplicaHandle(str(model_path), ["--served-model-name", name, *replica_args])
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", reference, timeout=600)
        replica.wait_ready(timeout=600)
        yield f"http://127.0.0.1:{port}", replica.url
    finally:
        replica.stop()
        stop_process_group(reference)


def measure(
    targets: dict[str, str],
    body: Callable[[int], dict[str, Any]],
    rounds: int,
    requests: int,
    concurrency: int,
) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for name in alternating(list(targets), rounds):
        runs[name].append(asyncio.run(closed_loop(targets[name], body, requests, concurrency)))
    return runs


def tokens_ratio(base: dict[str, Any], mine: dict[str, Any]) -> float | None:
    """inferd's tokens/s over vLLM's server's; None when the server delivered
    none, leaving nothing to compare against."""
    theirs = base["tokens_per_s"]
    return mine["tokens_per_s"] / theirs if theirs else None


def reasons(*why: str) -> str:
    return "; ".join(w for w in why if w)


def part_goal(part: str, base: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """The docstring's goal for one part. A failed request adds no tokens, so a
    part with any fails its goal however the rates compare."""
    name = f"{part}: inferd's tokens/s vs vLLM's server"
    target = f">= {GOAL}x"
    errors = base["errors"] + mine["errors"]
    failed = (
        f"{errors} errors ({mine['errors']} inferd, {base['errors']} vLLM's server)"
        if errors
        else ""
    )
    ratio = tokens_ratio(base, mine)
    if ratio is None:
        return not_measured(name, target, reasons("vLLM's server delivered no tokens", failed))
    slower = "" if ratio >= GOAL else "slower than vLLM's server in this run"
    met = ratio >= GOAL and not failed
    return goal(name, target, round(ratio, 3), met, reasons(failed, slower))


def build_report(
    args: argparse.Namespace, measured: dict[str, tuple[dict[str, Any], dict[str, Any]]]
) -> dict[str, Any]:
    """The run as a result file (`results_format`) from each part's pooled
    rows (vLLM's server's, inferd's): the printed table, every part's goal,
    and the raw figures per part under `results`."""
    rows: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    for part, (base, mine) in measured.items():
        ratio = tokens_ratio(base, mine)
        rounded = None if ratio is None else round(ratio, 3)
        rows += [{"part": part, **base}, {"part": part, **mine, "ratio": rounded}]
        goals.append(part_goal(part, base, mine))
        results[part] = {
            "vllm_server": base,
            "inferd_replica": mine,
            "tokens_per_s_ratio": None if ratio is None else round(ratio, 4),
            "goal_met": goals[-1]["status"] == "met",
        }
    return {
        "title": "Completions and embeddings: inferd's replica against vLLM's own OpenAI "
        "server (CPU)",
        "workload": (
            f"{args.requests} requests x {args.rounds} alternating rounds per part, "
            f"{args.concurrency} concurrent: completions of tiny-chat ({args.max_tokens} "
            f"tokens each, ignore_eos), embeddings of tiny-embed ({args.inputs} texts per "
            "request); tokens/s is the usage the answers report (completion tokens, or "
            "prompt tokens for embeddings), the mean of the rounds"
        ),
        "config": vars(args) | {"out": str(args.out)},
        "tables": [table("Per part and server", COLUMNS, rows)],
        "goals": goals,
        "results": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--inputs", type=int, default=8, help="texts per embeddings request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from inferd.catalog import load_catalog, resolve_model
    from inferd.engines.vllm import engine_args_for
    from inferd.engines.vllm_pooling import pooling_engine_args

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    catalog = load_catalog().models
    options = EngineOptions(engine="vllm", device="cpu")
    measured: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    texts = ["The quick brown fox jumps over the lazy dog, again and again."] * args.inputs
    parts: list[tuple[str, str, Callable[..., dict[str, Any]], str, str, Any]] = [
        (
            "completions",
            "tiny-chat",
            engine_args_for,
            "/v1/completions",
            "/openai/v1/completions",
            lambda i: {"model": "tiny-chat", "prompt": f"Story {i}:", "ignore_eos": True,
                       "max_tokens": args.max_tokens},
        ),
        (
            "embeddings",
            "tiny-embed",
            pooling_engine_args,
            "/v1/embeddings",
            "/openai/v1/embeddings",
            lambda i: {"model": "tiny-embed", "input": [f"{i} {t}" for t in texts]},
        ),
    ]  # fmt: skip
    for part, name, engine_args, ref_path, our_path, body in parts:
        path = resolve_model(name, catalog).path
        with servers(
            path, name, engine_args(path, name, options), ["--engine", "vllm", "--device", "cpu"]
        ) as (reference, ours):
            targets = {"vllm-server": reference + ref_path, "inferd-replica": ours + our_path}
            measure(targets, body, 1, 16, args.concurrency)  # warm both
            runs = measure(targets, body, args.rounds, args.requests, args.concurrency)
        measured[part] = (
            pooled("vllm-server", runs["vllm-server"]),
            pooled("inferd-replica", runs["inferd-replica"]),
        )
    report = build_report(args, measured)
    print_table(
        f"completions ({args.max_tokens} tokens) and embeddings ({args.inputs} inputs) per "
        f"request: {args.requests} requests x {args.rounds} alternating rounds, "
        f"{args.concurrency} concurrent",
        report["tables"][0]["rows"],
        COLUMNS,
    )
    write_report("breadth_vs_vllm", report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
