"""LoRA adapters in rotation: an inferd endpoint against vLLM's own server
holding the same adapters, and each against its base model alone.

    .venv/bin/python benchmarks/lora.py [--requests 32 --concurrency 4
        --max-tokens 32 --rounds 3 --max-loras 4]

- inferd-endpoint: `inferd serve` with an endpoint of tiny-chat (one vLLM
  replica on the CPU, engineSettings maxLoras/maxLoraRank) and 16 random
  PEFT adapters of tiny-chat registered on it after it is running; the
  replica loads each on demand (vLLM's dynamic loading).
- vllm-server: `python -m vllm.entrypoints.openai.api_server` with the
  engine arguments inferd's replica gets for those settings (`engine_args_for`:
  --enable-lora --max-loras --max-lora-rank) and `--lora-modules` naming the
  same 16 adapters; its engine core pinned as inferd pins its own on a CPU
  (see `keep_engine_core_with_its_workers`), so the comparison is of the
  serving paths, not of that scheduling fix.

Workloads (chat completions, non-streamed, `ignore_eos`, --max-tokens
each): the base model alone, then 1, 4 and 16 adapters in rotation (request
i names adapter i mod k). With 16 adapters and --max-loras 4 both engines
keep evicting the least recently used and loading the next from disk.
Each workload runs on both servers in --rounds alternating rounds; output
tokens/s is the median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import (
    alternating,
    load_average,
    pin_engine_cores,
    print_table,
    stop_process_group,
    vllm_cli_flags,
    wait_http_ok,
    write_report,
)
from results_format import goal, not_measured, table

from inferd.testing import ServeHandle, free_port

MODEL = "tiny-chat"
ADAPTERS = 16
WORKLOADS = (("base", 0), ("1 adapter", 1), ("4 adapters", 4), ("16 adapters", 16))
SIDES = ("vllm-server", "inferd-endpoint")
# The docstring asks for no number, the README for "on par with vLLM's
# server": read as the 0.95 the other parity benchmarks hold.
GOAL = 0.95
COLUMNS = ["workload", "server", "output_tokens_per_s", "rounds_tokens_per_s", "vs_its_base",
           "inferd/vllm", "latency_p50_ms", "errors"]  # fmt: skip


def adapter_dirs(count: int, rank: int) -> dict[str, Path]:
    from inferd.catalog.tiny import ensure_tiny_model
    from inferd.catalog.tiny_lora import ensure_tiny_lora

    base = ensure_tiny_model(MODEL)
    return {f"lora-{i}": ensure_tiny_lora(base, rank=rank, seed=i) for i in range(1, count + 1)}


async def rotation(
    url: str,
    headers: dict[str, str],
    models: list[str],
    *,
    requests: int,
    concurrency: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Closed loop: `concurrency` workers; request i names models[i % len]."""
    latencies: list[float] = []
    tokens = errors = 0
    queue = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens, errors
        for i in queue:
            body = {
                "model": models[i % len(models)],
                "messages": [{"role": "user", "content": f"Tell me a story, number {i}."}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            began = time.perf_counter()
            answer = await client.post(url, json=body, headers=headers)
            latencies.append(time.perf_counter() - began)
            if answer.status_code != 200:
                errors += 1
                continue
            tokens += answer.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - began
    return {
        "tokens_per_s": tokens / wall,
        "latency_p50_ms": statistics.median(latencies) * 1000,
        "errors": errors,
    }


def start_reference(
    engine_args: dict[str, Any], adapters: dict[str, Path], port: int, log: Path
) -> Any:
    import subprocess

    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(engine_args["model"]), "--host", "127.0.0.1", "--port", str(port),
        "--disable-uvicorn-access-log", *vllm_cli_flags(engine_args),
        "--lora-modules", *(f"{name}={path}" for name, path in adapters.items()),
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def start_endpoint(
    serve: ServeHandle, settings: dict[str, Any], adapters: dict[str, Path]
) -> tuple[str, dict[str, str], str, str]:
    created = serve.create_endpoint(
        name="bench", modelName=MODEL, minReplicas=1, maxReplicas=1, engineSettings=settings
    )
    record = serve.wait_record(
        created["id"], lambda r: r["status"] == "running" and r["currentReplicas"] == 1, 900, 0.5
    )
    with serve.api() as api:
        for name, path in adapters.items():
            answer = api.post(
                f"/inference/endpoints/{created['id']}/adapters",
                json={"name": name, "source": str(path)},
            )
            answer.raise_for_status()
    url = f"{created['url']}/openai/v1/chat/completions"
    (replica,) = record["replicas"]
    token = {"Authorization": f"Bearer {created['accessToken']}"}
    return url, token, created["id"], replica["id"]


def ratio(ours: float, theirs: float) -> float | None:
    """None when the denominator side delivered nothing to compare against."""
    return ours / theirs if theirs else None


def workload_entry(
    runs: dict[str, list[dict[str, Any]]], base_rate: dict[str, float], is_base: bool
) -> dict[str, Any]:
    """One workload's figures per side (the rounds' median rate, against the
    side's own base-model rate, which the base workload sets) and inferd's
    rate over vLLM's server's."""
    entry: dict[str, Any] = {}
    for side, side_runs in runs.items():
        rate = statistics.median(r["tokens_per_s"] for r in side_runs)
        if is_base:
            base_rate[side] = rate
        vs_base = ratio(rate, base_rate[side])
        entry[side] = {
            "output_tokens_per_s": round(rate, 1),
            "rounds_tokens_per_s": [round(r["tokens_per_s"], 1) for r in side_runs],
            "latency_p50_ms": round(statistics.median(r["latency_p50_ms"] for r in side_runs), 1),
            "errors": sum(r["errors"] for r in side_runs),
            "vs_its_base": None if vs_base is None else round(vs_base, 3),
        }
    ours, theirs = entry["inferd-endpoint"], entry["vllm-server"]
    vs_vllm = ratio(ours["output_tokens_per_s"], theirs["output_tokens_per_s"])
    entry["inferd_vs_vllm"] = None if vs_vllm is None else round(vs_vllm, 3)
    return entry


def workload_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for workload, _ in WORKLOADS:
        entry = results[workload]
        for side in SIDES:
            rows.append({
                "workload": workload, "server": side, **entry[side],
                "inferd/vllm": entry["inferd_vs_vllm"] if side == "inferd-endpoint" else "",
            })  # fmt: skip
    return rows


def reasons(*why: str) -> str:
    return "; ".join(w for w in why if w)


def workload_goal(workload: str, entry: dict[str, Any]) -> dict[str, Any]:
    """On par with vLLM's server in one workload. A failed request adds no
    tokens, so a workload with any fails its goal however the rates compare."""
    name = f"{workload}: inferd's output tokens/s vs vLLM's server (on par)"
    target = f">= {GOAL}x (assumed: the docstring states none)"
    ours, theirs = entry["inferd-endpoint"]["errors"], entry["vllm-server"]["errors"]
    failed = (
        f"{ours + theirs} errors ({ours} inferd, {theirs} vLLM's server)" if ours + theirs else ""
    )
    figure = entry["inferd_vs_vllm"]
    if figure is None:
        return not_measured(name, target, reasons("vLLM's server delivered no tokens", failed))
    slower = "" if figure >= GOAL else "slower than vLLM's server in this run"
    return goal(name, target, figure, figure >= GOAL and not failed, reasons(failed, slower))


def build_report(
    args: argparse.Namespace, engine_args: dict[str, Any], results: dict[str, Any]
) -> dict[str, Any]:
    """The run as a result file (`results_format`): the printed table, a goal
    per workload, and the raw figures under `results` as before."""
    return {
        "title": "LoRA adapters in rotation: an inferd endpoint against vLLM's own OpenAI "
        "server (tiny-chat, CPU)",
        "workload": (
            f"chat completions, non-streamed, {args.max_tokens} output tokens (ignore_eos): "
            f"the base model alone, then 1, 4 and {ADAPTERS} rank-{args.rank} adapters in "
            f"rotation, max_loras {args.max_loras}; {args.requests} requests x "
            f"{args.rounds} alternating rounds per workload and side, {args.concurrency} "
            "concurrent; vLLM's engine core pinned as inferd pins its own"
        ),
        "config": vars(args) | {"out": str(args.out), "adapters": ADAPTERS},
        "engine_args": {k: v for k, v in engine_args.items() if k != "model"},
        "tables": [table("Per workload and server", COLUMNS, workload_rows(results))],
        "goals": [workload_goal(workload, results[workload]) for workload, _ in WORKLOADS],
        "notes": [
            "The docstring and README state no number for the comparison with vLLM's "
            f'server ("on par"); each workload\'s goal holds it to {GOAL}x, as the other '
            "parity benchmarks do.",
            "The endpoint's replica at the end was "
            + ("the one the run started with" if results["replica_unchanged"] else "a new one")
            + f"; it held {', '.join(results['adapters_held_at_end']) or 'no adapter'}.",
        ],
        "results": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=32, help="per round, workload and side")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from inferd.api.engine_settings import EngineSettings
    from inferd.catalog.tiny import ensure_tiny_model
    from inferd.engines.base import EngineOptions
    from inferd.engines.vllm import engine_args_for

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    adapters = adapter_dirs(ADAPTERS, args.rank)
    settings = {"maxLoras": args.max_loras, "maxLoraRank": args.rank}
    options = EngineOptions(
        engine="vllm", device="cpu", settings=EngineSettings.model_validate(settings)
    )
    engine_args = engine_args_for(ensure_tiny_model(MODEL), MODEL, options)
    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    port = free_port()
    print(load_average())
    reference = start_reference(engine_args, adapters, port, work / "vllm-server.log")
    serve = ServeHandle(work / "serve", settings={"replica_args": "--cpu-kv-cache-gib 1"})
    try:
        serve.start()
        url, headers, endpoint_id, replica_id = start_endpoint(serve, settings, adapters)
        wait_http_ok(f"http://127.0.0.1:{port}/health", reference, timeout=900)
        print("reference engine cores pinned:", pin_engine_cores(reference.pid))
        targets = {
            "vllm-server": (f"http://127.0.0.1:{port}/v1/chat/completions", {}),
            "inferd-endpoint": (url, headers),
        }
        names = list(adapters)

        def measure(models: list[str], rounds: int, requests: int) -> dict[str, list[Any]]:
            runs: dict[str, list[Any]] = {name: [] for name in targets}
            for side in alternating(list(targets), rounds):
                target, side_headers = targets[side]
                runs[side].append(asyncio.run(rotation(
                    target, side_headers, models, requests=requests,
                    concurrency=args.concurrency, max_tokens=args.max_tokens,
                )))  # fmt: skip
            return runs

        measure([MODEL, *names], 1, len(names) + 1)  # warm: every adapter loaded once
        results: dict[str, Any] = {}
        base_rate: dict[str, float] = {}
        for workload, count in WORKLOADS:
            models = names[:count] or [MODEL]
            runs = measure(models, args.rounds, args.requests)
            results[workload] = workload_entry(runs, base_rate, is_base=count == 0)
        print_table(
            f"LoRA rotation: {args.requests} requests x {args.rounds} alternating rounds, "
            f"{args.concurrency} concurrent, {args.max_tokens} output tokens, "
            f"max_loras {args.max_loras}, rank {args.rank}; {load_average()}",
            workload_rows(results),
            COLUMNS,
        )
        (replica,) = serve.record(endpoint_id)["replicas"]
        results["replica_unchanged"] = replica["id"] == replica_id
        results["adapters_held_at_end"] = replica["adapters"]
        report = build_report(args, engine_args, results)
        write_report("lora", report, args.out)
    finally:
        serve.cleanup()
        stop_process_group(reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
