"""Responses and Anthropic Messages: inferd's replica against vLLM's own server.

    python benchmarks/agent_apis_vs_vllm.py [--requests 64 --concurrency 4 --rounds 5]

Both servers run tiny-chat with the same engine arguments (`start_vllm_server`
gives vLLM's server the ones inferd's replica uses) and the same placement of
the engine core (`pin_engine_cores`) and serve `/v1/responses`
and `/v1/messages` with vLLM's own serving classes; inferd's replica adds its
request checks, limits and usage reports in front. Each of the four parts
(Responses and Messages, streamed and not) is measured in alternating rounds
(drift on a shared machine hits both servers alike), closed loop:
`--concurrency` requests in flight, greedy decoding. Time to first token of a
stream is the time to its first text delta event; of a whole answer, its
latency. Goal: inferd's requests/s >= 0.95x vLLM's server and its TTFT p50 no
more than 1/0.95 of vLLM's, in every part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from common import (
    alternating,
    pin_engine_cores,
    print_table,
    start_vllm_server,
    stop_process_group,
    wait_http_ok,
)
from common import percentile as _percentile
from results_format import goal, table

from inferd.engines.base import EngineOptions
from inferd.testing import ReplicaHandle, free_port

GOAL = 0.95
PROMPT = "Write a short story about a fox who learns to fly."


@dataclass
class Run:
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Part:
    """One API, streamed or not: its path on each server, its request body and
    how its answer is read."""

    name: str
    vllm_path: str
    inferd_path: str
    body: Callable[[int, bool], dict[str, Any]]
    stream: bool
    # (event type, data) -> is this the first text? / the output tokens it reports
    is_text: Callable[[dict[str, Any]], bool]
    output_tokens: Callable[[dict[str, Any]], int | None]


def responses_body(max_tokens: int) -> Callable[[int, bool], dict[str, Any]]:
    return lambda i, stream: {
        "model": "tiny-chat",
        "input": f"{i}. {PROMPT}",
        "max_output_tokens": max_tokens,
        "temperature": 0.0,
        "store": False,
        "stream": stream,
    }


def messages_body(max_tokens: int) -> Callable[[int, bool], dict[str, Any]]:
    return lambda i, stream: {
        "model": "tiny-chat",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"{i}. {PROMPT}"}],
        "temperature": 0.0,
        "stream": stream,
    }


def responses_tokens(data: dict[str, Any]) -> int | None:
    usage = (data.get("response") or data).get("usage")
    return usage.get("output_tokens") if usage else None


def messages_tokens(data: dict[str, Any]) -> int | None:
    usage = data.get("usage") or (data.get("message") or {}).get("usage")
    return usage.get("output_tokens") if usage else None


def parts(max_tokens: int) -> list[Part]:
    found = []
    for stream in (False, True):
        suffix = " stream" if stream else ""
        found.append(
            Part(
                "responses" + suffix, "/v1/responses", "/openai/v1/responses",
                responses_body(max_tokens), stream,
                lambda d: d.get("type") == "response.output_text.delta" and bool(d.get("delta")),
                responses_tokens,
            )
        )  # fmt: skip
        found.append(
            Part(
                "messages" + suffix, "/v1/messages", "/v1/messages",
                messages_body(max_tokens), stream,
                lambda d: d.get("type") == "content_block_delta",
                messages_tokens,
            )
        )  # fmt: skip
    return found


async def one_request(client: httpx.AsyncClient, url: str, part: Part, index: int) -> tuple:
    """(time to first token, output tokens) of one request."""
    body = part.body(index, part.stream)
    began = time.perf_counter()
    if not part.stream:
        answer = await client.post(url, json=body)
        answer.raise_for_status()
        return time.perf_counter() - began, part.output_tokens(answer.json()) or 0
    first = None
    tokens = 0
    async with client.stream("POST", url, json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if first is None and part.is_text(data):
                first = time.perf_counter() - began
            tokens = part.output_tokens(data) or tokens
    if first is None:
        raise ValueError("a stream without a text event")
    return first, tokens


async def closed_loop(url: str, part: Part, requests: int, concurrency: int) -> Run:
    run = Run()
    queue = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        for index in queue:
            try:
                ttft, tokens = await one_request(client, url, part, index)
            except (httpx.HTTPError, ValueError, KeyError):
                run.errors += 1
                continue
            run.requests += 1
            run.output_tokens += tokens
            run.ttft_s.append(ttft)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        run.wall_s = time.perf_counter() - began
    return run


def pooled(part: str, label: str, runs: list[Run]) -> dict[str, Any]:
    ttfts = [t for r in runs for t in r.ttft_s]
    return {
        "part": part,
        "server": label,
        "rounds": len(runs),
        "errors": sum(r.errors for r in runs),
        # the rounds' median: robust to one disturbed round on a shared machine
        "requests/s": round(statistics.median(r.requests / r.wall_s for r in runs), 3),
        "output tokens/s": round(statistics.median(r.output_tokens / r.wall_s for r in runs), 1),
        "TTFT p50 ms": round((_percentile(ttfts, 50) or 0) * 1000, 1),
        "TTFT p90 ms": round((_percentile(ttfts, 90) or 0) * 1000, 1),
    }


@contextmanager
def servers(model_path: Path) -> Iterator[tuple[str, str]]:
    """vLLM's server and an inferd replica on tiny-chat: their base URLs."""
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "bench-agent-apis-vllm.log"
    options = EngineOptions(engine="vllm", device="cpu")
    reference = start_vllm_server(model_path, options, port, log)
    replica = ReplicaHandle(
        str(model_path), ["--served-model-name", "tiny-chat", "--engine", "vllm", "--device", "cpu"]
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", reference, timeout=900)
        # The placement inferd's replica gives its own engine core: a
        # floating one spins on its front end's core and halves (or not,
        # by chance) vLLM's server's rate between runs.
        print("reference engine cores pinned:", pin_engine_cores(reference.pid))
        replica.wait_ready(timeout=900)
        yield f"http://127.0.0.1:{port}", replica.url
    finally:
        replica.stop()
        stop_process_group(reference)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from common import write_report

    from inferd.catalog import load_catalog, resolve_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model_path = resolve_model("tiny-chat", load_catalog().models).path
    rows: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    with servers(model_path) as (reference, ours):
        for part in parts(args.max_tokens):
            urls = {"vllm-server": reference + part.vllm_path, "inferd": ours + part.inferd_path}
            for name in urls:  # warm both: first requests compile and fill caches
                asyncio.run(closed_loop(urls[name], part, 4, 2))
            runs: dict[str, list[Run]] = {name: [] for name in urls}
            for name in alternating(list(urls), args.rounds):
                runs[name].append(
                    asyncio.run(closed_loop(urls[name], part, args.requests, args.concurrency))
                )
            base = pooled(part.name, "vllm-server", runs["vllm-server"])
            mine = pooled(part.name, "inferd", runs["inferd"])
            rate = mine["requests/s"] / base["requests/s"]
            ttft = base["TTFT p50 ms"] / mine["TTFT p50 ms"]
            mine["requests/s ratio"] = round(rate, 3)
            mine["TTFT p50 ratio (vLLM/inferd)"] = round(ttft, 3)
            rows += [base, mine]
            errors = base["errors"] + mine["errors"]
            goals.append(
                goal(f"{part.name}: requests/s vs vLLM's server", f">= {GOAL}x", round(rate, 3),
                     rate >= GOAL and errors == 0,
                     "" if rate >= GOAL and errors == 0 else f"{errors} errors" if errors else
                     "slower than vLLM's server in this run")
            )  # fmt: skip
            goals.append(
                goal(f"{part.name}: TTFT p50, vLLM's over inferd's", f">= {GOAL}", round(ttft, 3),
                     ttft >= GOAL, "" if ttft >= GOAL else "a later first token than vLLM's server")
            )  # fmt: skip
    columns = [
        "part", "server", "rounds", "errors", "requests/s", "output tokens/s",
        "TTFT p50 ms", "TTFT p90 ms", "requests/s ratio", "TTFT p50 ratio (vLLM/inferd)",
    ]  # fmt: skip
    print_table("Responses and Messages: inferd's replica vs vLLM's server", rows, columns)
    report = {
        "title": "Responses and Messages APIs against vLLM's own server (tiny-chat, CPU)",
        "workload": (
            f"{args.requests} requests x {args.rounds} alternating rounds per part, "
            f"{args.concurrency} concurrent, up to {args.max_tokens} output tokens, greedy"
        ),
        "config": vars(args) | {"out": str(args.out)},
        "tables": [table("Per part and server", columns, rows)],
        "goals": goals,
    }
    write_report("agent_apis_vs_vllm", report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
