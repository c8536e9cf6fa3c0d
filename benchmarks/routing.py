"""Cache-aware routing, side by side in one run: vLLM's own router in front
of N of vLLM's own servers, against inferd's gateway in front of N inferd
replicas of the same model and engine configuration.

Targets (rounds alternate between them, fresh prompts for every run):
- `vllm-router cache_aware` and `vllm-router round_robin`: the `vllm-router`
  binary (PyPI wheel, installed into its own environment, `--router`) in
  front of N `python -m vllm.entrypoints.openai.api_server` processes.
- `inferd prefix` and `inferd least_loaded`: one inferd gateway process
  (`Gateway` over a static directory of the N replicas, as
  benchmarks/gateway_overhead.py runs it) per policy, in front of N
  `inferd replica` processes (vLLM engine).
- `inferd prefix x2`: two gateway processes (prefix policy, each with its
  own prefix table) sharing the load: requests alternate between them, as
  behind a load balancer.
- `serve ...`: a real endpoint, as users run it: `inferd serve` instances on
  one PostgreSQL (benchmarks/serve_fleet.py), one endpoint with N replicas
  launched by the first instance (replicas not pinned: where inferd puts
  them), the endpoint's URL and token. `serve prefix` sends every request
  to one instance, `serve prefix x2` alternates over two; `serve prefix
  pinned` is `serve prefix` with replica i moved onto core i for the run;
  `serve prefix hash-only` is an instance with prefix placement off
  (rendezvous hashing alone, the policy before placement);
  `serve least_loaded` an instance with that policy. Only the engines the
  chosen targets need are started (`--only`).

For every run the benchmark also computes the hit rate of the best static
partition of the run's prompts over the replicas: each system prompt (with
its conversations) on one replica, every replica an LRU cache of
`--kv-tokens` (vLLM's block hashing: full blocks of the prompt's tokens, the
last token never from the cache), the run's requests replayed in the order
they were sent; all partitions tried for 2 replicas (up to 16 prompts),
the most even split of the working sets otherwise.

Replica i of the vLLM and bare kinds is pinned to core i
(VLLM_CPU_OMP_THREADS_BIND); `inferd serve`'s launcher gives each CPU slot
its own cores itself. The KV cache is sized (`--kv-tokens` per replica) so
that the workload's working set of prefixes exceeds one replica's cache but
fits the fleet's.

Workload: G system prompts (`--prompt-words` each, about 1.1 tokens a word
with the bench model's tokenizer: the report states the count), C
conversations per system prompt, T turns each;
a conversation's next turn repeats the whole conversation so far. Turns go
in waves with `--concurrency` requests at once. Streamed, so TTFT is
measured; throughput is requests per second over the run. The cache hit
rate is the engines' own: prompt tokens found in the prefix cache over
those looked up (vLLM's `vllm:prefix_cache_*` counters; inferd replicas
report the same figures as `inferd_prefix_cache_*`).

The defaults are the workload of the prefix-routing issue: 12 conversations
of 8 turns, each on its own ~1.5k-token system prompt (a working set of
~18.6k tokens: more than one replica's 12,288-token cache, less than two),
2 alternating rounds, every target:

    python benchmarks/routing.py --router <venv>/bin/vllm-router

The earlier workload (8 prompts of ~1.1k tokens, 4 conversations of 4 turns
each, 5,120 KV tokens per replica):

    python benchmarks/routing.py --router <venv>/bin/vllm-router --groups 8 \\
        --conversations 4 --turns 4 --prompt-words 1000 --kv-tokens 5120 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import results_format
from common import percentile, print_table, stop_process_group, wait_http_ok, write_report
from serve_fleet import ServeFleet

from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.testing import ReplicaHandle, free_port

MODEL = "bench-llama-25m"
ENDPOINT_ID = "bench-routing"
BLOCK_SIZE = 128
WORDS = [
    "model",
    "serving",
    "runtime",
    "loads",
    "onto",
    "accelerators",
    "answers",
    "requests",
    "from",
    "many",
    "clients",
    "conversation",
    "system",
    "message",
    "sets",
    "tone",
    "user",
    "asks",
    "question",
    "assistant",
    "short",
    "reply",
    "inference",
    "endpoints",
    "scale",
    "between",
    "minimum",
    "maximum",
    "number",
    "replicas",
    "down",
    "zero",
    "nobody",
    "called",
    "while",
    "next",
    "request",
    "wakes",
    "again",
    "without",
    "lost",
    "images",
    "generated",
    "text",
    "prompt",
    "diffusion",
    "pipeline",
    "encoder",
    "denoising",
    "network",
    "decoder",
    "latents",
    "pixels",
    "tokens",
    "produced",
    "time",
    "first",
    "token",
    "per",
    "second",
    "users",
    "feel",
    "weather",
    "Paris",
    "Berlin",
    "Tokyo",
    "London",
    "sunny",
    "warm",
]


# --- processes ----------------------------------------------------------------------


def engine_args(model: Path, kv_tokens: int) -> dict[str, Any]:
    return {
        "dtype": "float32",
        # One request needs a little less than the whole cache (vLLM checks).
        "max_model_len": min(4096, kv_tokens - 2 * BLOCK_SIZE),
        "block_size": BLOCK_SIZE,
        "num_gpu_blocks_override": kv_tokens // BLOCK_SIZE,
        "enable_prefix_caching": True,
        "enforce_eager": True,
    }


def pinned(core: int) -> dict[str, str]:
    return {"VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_CPU_KVCACHE_SPACE": "1"}


def start_vllm(model: Path, core: int, kv_tokens: int, log: Path) -> tuple[Any, str]:
    port = free_port()
    flags = []
    for key, value in engine_args(model, kv_tokens).items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--disable-uvicorn-access-log", *flags,
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **pinned(core)},
    )
    return process, f"http://127.0.0.1:{port}"


def start_router(router: str, urls: list[str], policy: str, log: Path) -> tuple[Any, str]:
    port = free_port()
    command = [
        router, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
        "--policy", policy, "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    return process, f"http://127.0.0.1:{port}"


def start_inferd_replica(model: Path, core: int, kv_tokens: int) -> ReplicaHandle:
    args = ["--engine", "vllm", "--device", "cpu", "--served-model-name", MODEL]
    for key, value in engine_args(model, kv_tokens).items():
        args += ["--engine-arg", f"{key}={json.dumps(value)}"]
    return ReplicaHandle(str(model), args, env=pinned(core))


def serve_gateway(
    replica_urls: list[str], port: int, token: str, routing: str, load_factor: float | None
) -> None:
    """The gateway process (`--serve-gateway`)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from inferd.gateway.app import Gateway, gateway_routes
    from inferd.gateway.directory import EndpointRoute, RoutableReplica
    from inferd.gateway.routing import DEFAULT_LOAD_FACTOR, Policy
    from inferd.gateway.settings import GatewaySettings
    from inferd.gateway.static import StaticDirectory
    from inferd.http_errors import EXCEPTION_HANDLERS
    from inferd.testing import verifier_for

    directory = StaticDirectory()
    replicas = [RoutableReplica(f"replica-{i}", url) for i, url in enumerate(replica_urls)]
    directory.add_endpoint(EndpointRoute(ENDPOINT_ID, "chat", MODEL), replicas)
    settings = GatewaySettings(
        routing_policy=Policy(routing),
        routing_load_factor=load_factor if load_factor is not None else DEFAULT_LOAD_FACTOR,
    )
    gateway = Gateway(directory, verifier_for({ENDPOINT_ID: token}), settings)

    async def health(request: Request) -> Response:
        return Response(b"ok")

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.render(), media_type="text/plain")

    app = Starlette(
        routes=[
            *gateway_routes(gateway),
            Route("/healthz", health),
            Route("/gateway-metrics", metrics),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    uvicorn.run(app, host="127.0.0.1", port=port, access_log=False, log_level="warning")


def start_gateway(
    replica_urls: list[str], token: str, routing: str, load_factor: float | None = None
) -> tuple[Any, str]:
    port = free_port()
    command = [
        sys.executable, __file__, "--serve-gateway", "--port", str(port), "--token", token,
        "--routing", routing, "--replica-urls", *replica_urls,
    ]  # fmt: skip
    if load_factor is not None:
        command += ["--load-factor", str(load_factor)]
    process = subprocess.Popen(command, start_new_session=True)
    wait_http_ok(f"http://127.0.0.1:{port}/healthz", process, timeout=60)
    return process, f"http://127.0.0.1:{port}/endpoints/{ENDPOINT_ID}/openai"


# --- the workload ---------------------------------------------------------------------


@dataclass
class Target:
    name: str
    urls: list[str]  # chat completions URLs; requests alternate between them
    headers: dict[str, str]
    engines: list[str]  # metrics URLs of the engines behind it
    hits_metric: str
    queries_metric: str
    gateways: list[str] = field(default_factory=list)  # inferd gateways' metrics URLs
    model: str = MODEL  # the `model` requests name
    # Called before and after each of its runs (pinning replicas).
    before: Any = None
    after: Any = None


@dataclass
class Run:
    target: str
    round: int
    requests: int = 0
    errors: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    hit_rate: float | None = None
    # inferd only: requests by why the gateway chose the replica.
    routed: dict[str, int] = field(default_factory=dict)
    # Per engine: requests (prompt-cache lookups), prompt tokens looked up,
    # and found: the split of load and of cache over the replicas.
    per_engine: list[dict[str, float]] = field(default_factory=list)
    # The hit rate of the best static partition of this run's prompts.
    static_hit_rate: float | None = None
    # Each request's (system prompt index, messages) in the order sent.
    sent: list[tuple[int, list[dict[str, str]]]] = field(default_factory=list, repr=False)


def routed_by_reason(urls: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for url in urls:
        text = httpx.get(url, timeout=30).text
        for m in re.finditer(
            r'^inferd_gateway_routed_requests_total\{[^}]*reason="(\w+)"[^}]*\} (\S+)$', text, re.M
        ):
            counts[m.group(1)] = counts.get(m.group(1), 0) + int(float(m.group(2)))
    return counts


def metric_total(url: str, name: str) -> float:
    text = httpx.get(url, timeout=10).text
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{name}(?:_total)?(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )


def engine_figures(url: str, target: Target) -> dict[str, float]:
    requests = (
        "vllm:request_success" if target.hits_metric.startswith("vllm") else "inferd_requests"
    )
    return {
        "requests": metric_total(url, requests),
        "queried": metric_total(url, target.queries_metric),
        "hits": metric_total(url, target.hits_metric),
    }


def conversations(seed: int, args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """Fresh system prompts (a new seed per run and target: nothing of an
    earlier run can be in any cache) and the conversations' opening turns."""
    rng = random.Random(seed)
    convs = []
    for g in range(args.groups):
        words = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
        system = f"[{seed}-{g}] {words}"
        convs += [[{"role": "system", "content": system}] for _ in range(args.conversations)]
    rng.shuffle(convs)
    return convs


def system_prompt_tokens(model: Path, args: argparse.Namespace) -> int:
    """Tokens of one system prompt as the engines count them (the words are
    not one token each: size the KV cache against this)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    (first, *_) = conversations(0, args)
    return len(tokenizer(first[0]["content"])["input_ids"])


async def one_turn(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], messages: list[dict[str, str]],
    args: argparse.Namespace, model: str = MODEL,
) -> tuple[float | None, str]:  # fmt: skip
    body = {
        "model": model, "messages": messages, "max_tokens": args.max_tokens, "temperature": 0.0,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip
    start = time.perf_counter()
    ttft = None
    text = []
    async with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(piece)
    return ttft, "".join(text)


async def run_target(target: Target, seed: int, round_: int, args: argparse.Namespace) -> Run:
    run = Run(target.name, round_)
    convs = conversations(seed, args)
    group_of = {id(c): int(c[0]["content"].split("-", 1)[1].split("]", 1)[0]) for c in convs}
    rng = random.Random(seed + 1)
    if target.before is not None:
        target.before()
    engines0 = [engine_figures(u, target) for u in target.engines]
    routed0 = routed_by_reason(target.gateways)
    sent = 0
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        gate = asyncio.Semaphore(args.concurrency)

        async def turn(messages: list[dict[str, str]]) -> None:
            nonlocal sent
            async with gate:
                url = target.urls[sent % len(target.urls)]
                sent += 1
                user = " ".join(rng.choice(WORDS) for _ in range(args.user_words))
                messages.append({"role": "user", "content": user})
                run.sent.append((group_of[id(messages)], list(messages)))
                try:
                    ttft, answer = await one_turn(
                        client, url, target.headers, messages, args, target.model
                    )
                except (httpx.HTTPError, ValueError, KeyError):
                    run.errors += 1
                    messages.append({"role": "assistant", "content": "(failed)"})
                    return
                run.requests += 1
                if ttft is not None:
                    run.ttft_s.append(ttft)
                messages.append({"role": "assistant", "content": answer})

        started = time.perf_counter()
        for _ in range(args.turns):  # a conversation's next turn after its previous one
            await asyncio.gather(*(turn(m) for m in convs))
        run.wall_s = time.perf_counter() - started
    if target.after is not None:
        target.after()
    engines = [engine_figures(u, target) for u in target.engines]
    run.per_engine = [
        {k: round(now[k] - was[k]) for k in now} for now, was in zip(engines, engines0, strict=True)
    ]
    hits = sum(e["hits"] for e in run.per_engine)
    queries = sum(e["queried"] for e in run.per_engine)
    run.hit_rate = hits / queries if queries else None
    routed = routed_by_reason(target.gateways)
    run.routed = {k: v - routed0.get(k, 0) for k, v in routed.items() if v - routed0.get(k, 0)}
    return run


def summarize(name: str, runs: list[Run]) -> dict[str, Any]:
    ttfts = [t for r in runs for t in r.ttft_s]
    rates = [r.requests / r.wall_s for r in runs if r.wall_s]
    hits = [r.hit_rate for r in runs if r.hit_rate is not None]
    static = [r.static_hit_rate for r in runs if r.static_hit_rate is not None]
    gaps = [
        r.static_hit_rate - r.hit_rate
        for r in runs
        if r.static_hit_rate is not None and r.hit_rate is not None
    ]
    return {
        "target": name,
        "requests": sum(r.requests for r in runs),
        "errors": sum(r.errors for r in runs),
        "req/s": round(statistics.median(rates), 3) if rates else None,
        "req/s per round": [round(x, 3) for x in rates],
        "ttft p50 ms": round(1000 * (percentile(ttfts, 50) or 0)),
        "ttft p90 ms": round(1000 * (percentile(ttfts, 90) or 0)),
        "cache hit rate": round(statistics.median(hits), 3) if hits else None,
        "hit rate per round": [round(h, 3) for h in hits],
        "best static hit rate": round(statistics.median(static), 3) if static else None,
        "gap to best static": round(statistics.median(gaps), 3) if gaps else None,
        "routed by reason": {
            reason: sum(r.routed.get(reason, 0) for r in runs)
            for reason in sorted({k for r in runs for k in r.routed})
        },
        # Per round, per engine: requests, prompt tokens looked up, found.
        "per engine per round": [r.per_engine for r in runs],
    }


@functools.cache
def _tokenizer(model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def static_reference(run: Run, model: Path, args: argparse.Namespace) -> float:
    """The hit rate of the best static partition of this run's prompts
    (benchmarks/static_partition.py), tokenized as the engines do."""
    from static_partition import best_static_hit_rate

    tokenizer = _tokenizer(model)
    requests = [
        (group, tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
        for group, messages in run.sent
    ]
    rate, _ = best_static_hit_rate(
        requests, args.replicas, args.kv_tokens // BLOCK_SIZE, BLOCK_SIZE
    )
    return rate


# --- targets ------------------------------------------------------------------------------

VLLM_TARGETS = ("vllm-router cache_aware", "vllm-router round_robin")
BARE_TARGETS = ("inferd prefix", "inferd least_loaded", "inferd prefix x2")
# name -> (instances it sends to, pinned)
SERVE_TARGETS = {
    "serve prefix": (["placed"], False),
    # Its own two instances: prefixes live in "placed" from the run before
    # would be in the way of this run's.
    "serve prefix x2": (["placed-2", "placed-3"], False),
    "serve prefix pinned": (["placed"], True),
    "serve prefix hash-only": (["hash-only"], False),
    "serve least_loaded": (["least-loaded"], False),
}
SERVE_INSTANCES = {
    "placed": {},
    "placed-2": {},
    "placed-3": {},
    "hash-only": {"gateway_routing_place_prefixes": "false"},
    "least-loaded": {"gateway_routing_policy": "least_loaded"},
}
DEFAULT_TARGETS = (*VLLM_TARGETS, *BARE_TARGETS, *SERVE_TARGETS)


def goals_of(by: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    goal, not_measured = results_format.goal, results_format.not_measured
    out = []
    ref = by.get("vllm-router cache_aware")
    for ours in ("serve prefix", "inferd prefix"):
        row = by.get(ours)
        name = f"{ours}: req/s vs vllm-router cache_aware"
        if row and ref and ref["req/s"] and row["req/s"]:
            ratio = round(row["req/s"] / ref["req/s"], 3)
            why = "" if ratio >= 1.1 else "below 1.1x in this run"
            out.append(goal(name, ">= 1.1x", ratio, ratio >= 1.1, why))
            p90 = f"{row['ttft p90 ms']} vs {ref['ttft p90 ms']} ms"
            ok = row["ttft p90 ms"] <= ref["ttft p90 ms"]
            why = "" if ok else "above the reference's p90 in this run"
            out.append(goal(f"{ours}: TTFT p90 vs vllm-router cache_aware", "<=", p90, ok, why))
        else:
            out.append(not_measured(name, ">= 1.1x", "target or reference not run"))
    for ours in ("serve prefix", "serve prefix x2", "inferd prefix"):
        row = by.get(ours)
        name = f"{ours}: hit rate within 0.05 of the best static partition"
        if row and row["gap to best static"] is not None:
            gap = row["gap to best static"]
            why = "" if gap <= 0.05 else "the engines found less than the reference"
            out.append(goal(name, "gap <= 0.05", gap, gap <= 0.05, why))
        else:
            out.append(not_measured(name, "gap <= 0.05", "target not run"))
    one, two = by.get("serve prefix"), by.get("serve prefix x2")
    for what in ("req/s", "cache hit rate"):
        name = f"serve prefix x2 / serve prefix, {what}"
        if one and two and one[what] and two[what]:
            ratio = round(two[what] / one[what], 3)
            why = "" if ratio >= 0.95 else "two instances below one in this run"
            out.append(goal(name, ">= 0.95", ratio, ratio >= 0.95, why))
        else:
            out.append(not_measured(name, ">= 0.95", "a target not run"))
    return out


# --- main -------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", default="vllm-router", help="the vllm-router binary")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    # Defaults: 12 prompts of ~1.5k tokens (~145 KV blocks of 128 tokens with
    # their conversations) against 96 blocks per replica and 192 for the fleet.
    parser.add_argument("--groups", type=int, default=12, help="system prompts per run")
    parser.add_argument("--conversations", type=int, default=1, help="per system prompt")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=1400)
    parser.add_argument("--user-words", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kv-tokens", type=int, default=12288, help="KV cache per replica")
    parser.add_argument(
        "--only", nargs="*", default=None, help=f"target names to run: {list(DEFAULT_TARGETS)}"
    )
    parser.add_argument(
        "--prefix-load-factors",
        type=float,
        nargs="*",
        default=[],
        help="also run inferd prefix with these routing load factors (one target each)",
    )
    parser.add_argument("--out", type=Path, default=None)
    # Internal: a gateway process.
    parser.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--routing", help=argparse.SUPPRESS)
    parser.add_argument("--load-factor", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--replica-urls", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(args.replica_urls, args.port, args.token, args.routing, args.load_factor)
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
    from build_bench_llama import build

    factors = [f"inferd prefix lf={f:g}" for f in args.prefix_load_factors]
    wanted = list(args.only) if args.only is not None else [*DEFAULT_TARGETS, *factors]
    unknown = [n for n in wanted if n not in (*DEFAULT_TARGETS, *factors)]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {list(DEFAULT_TARGETS)}")
    model = build(Path(__file__).resolve().parent.parent / ".inferd" / "bench-models")
    prompt_tokens = system_prompt_tokens(model, args)
    print(f"a system prompt of {args.prompt_words} words is {prompt_tokens} tokens", flush=True)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-routing-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    processes: list[Any] = []
    replicas: list[ReplicaHandle] = []
    fleet: ServeFleet | None = None
    token = new_endpoint_token()
    auth = {"Authorization": f"Bearer {token}"}
    cores = os.cpu_count() or 1
    started_at = time.monotonic()
    runs: dict[str, list[Run]] = {n: [] for n in wanted}
    try:
        # All engines start at once (each waits for its core anyway).
        vllm_urls: list[str] = []
        if any(n in VLLM_TARGETS for n in wanted):
            for i in range(args.replicas):
                process, url = start_vllm(model, i % cores, args.kv_tokens, logs / f"vllm-{i}.log")
                processes.append(process)
                vllm_urls.append(url)
        if any(n in BARE_TARGETS or n in factors for n in wanted):
            for i in range(args.replicas):
                replicas.append(start_inferd_replica(model, i % cores, args.kv_tokens))
        serve_names = [n for n in wanted if n in SERVE_TARGETS]
        if serve_names:
            used = {i for n in serve_names for i in SERVE_TARGETS[n][0]}
            fleet = ServeFleet(
                logs / "serve", model, engine_args(model, args.kv_tokens), args.replicas,
                {name: extra for name, extra in SERVE_INSTANCES.items() if name in used},
            )  # fmt: skip
            fleet.start()
        for process, url in zip(processes, vllm_urls, strict=True):
            wait_http_ok(url + "/health", process, timeout=900)
        for replica in replicas:
            replica.wait_ready(900)
        print(f"engines up after {time.monotonic() - started_at:.0f} s", flush=True)
        targets: dict[str, Target] = {}
        vllm_metrics = [u + "/metrics" for u in vllm_urls]
        for policy in ("cache_aware", "round_robin"):
            name = f"vllm-router {policy}"
            if name not in wanted:
                continue
            process, url = start_router(args.router, vllm_urls, policy, logs / f"r-{policy}.log")
            processes.append(process)
            wait_http_ok(url + "/health", process, timeout=60)
            targets[name] = Target(
                name, [url + "/v1/chat/completions"], {}, vllm_metrics,
                "vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
            )  # fmt: skip
        inferd_urls = [r.url for r in replicas]
        inferd_metrics = [u + "/metrics" for u in inferd_urls]
        for name, routing, count, factor in (
            ("inferd prefix", "prefix", 1, None),
            ("inferd least_loaded", "least_loaded", 1, None),
            ("inferd prefix x2", "prefix", 2, None),
            *((f"inferd prefix lf={f:g}", "prefix", 1, f) for f in args.prefix_load_factors),
        ):
            if name not in wanted:
                continue
            urls, gateway_metrics = [], []
            for _ in range(count):
                process, url = start_gateway(inferd_urls, token, routing, factor)
                processes.append(process)
                urls.append(url + "/v1/chat/completions")
                gateway_metrics.append(url.split("/endpoints/")[0] + "/gateway-metrics")
            targets[name] = Target(
                name, urls, auth, inferd_metrics,
                "inferd_prefix_cache_hit_tokens", "inferd_prefix_cache_queried_tokens",
                gateway_metrics,
            )  # fmt: skip
        if fleet is not None:
            serve_metrics = [u + "/metrics" for u in fleet.replica_urls()]
            for name in serve_names:
                instances, pinned = SERVE_TARGETS[name]
                targets[name] = Target(
                    name, [fleet.chat_url(i) for i in instances], fleet.headers(), serve_metrics,
                    "inferd_prefix_cache_hit_tokens", "inferd_prefix_cache_queried_tokens",
                    [fleet.metrics_url(i) for i in instances], model=fleet.model_name,
                    before=fleet.pin if pinned else None, after=fleet.unpin if pinned else None,
                )  # fmt: skip
        names = [n for n in wanted if n in targets]
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else list(reversed(names))
            for n, name in enumerate(order):
                seed = 1000 * (round_ + 1) + 17 * n + random.randrange(10**6)
                run = asyncio.run(run_target(targets[name], seed, round_, args))
                runs[name].append(run)
                print(
                    f"round {round_} {name}: {run.requests} ok {run.errors} failed "
                    f"{run.wall_s:.1f}s hit rate {run.hit_rate} {run.routed or ''} "
                    f"{run.per_engine} load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        for process in reversed(processes):
            stop_process_group(process)
        for replica in replicas:
            replica.stop()
        if fleet is not None:
            fleet.stop()
    # After the engines stopped: replaying every partition takes a while.
    for run in (r for rs in runs.values() for r in rs):
        run.static_hit_rate = static_reference(run, model, args)
        print(f"{run.target} round {run.round}: best static {run.static_hit_rate:.3f}", flush=True)
    rows = [summarize(n, rs) for n, rs in runs.items() if rs]
    by = {r["target"]: r for r in rows}
    goals = goals_of(by)
    columns = [
        "target", "requests", "errors", "req/s", "ttft p50 ms", "ttft p90 ms",
        "cache hit rate", "best static hit rate", "gap to best static", "routed by reason",
    ]  # fmt: skip
    title = (
        f"routing: {args.replicas} replicas, {args.rounds} alternating rounds, "
        f"{args.groups}x{args.conversations} conversations x {args.turns} turns"
    )
    print_table(title, rows, columns[:-1])
    for row in rows:
        if row["routed by reason"]:
            print(f"{row['target']} routed by reason: {row['routed by reason']}")
    for g in goals:
        print(f"{g['goal']}: {g['figure']} ({g['status']})")
    report = {
        "title": "Prefix routing (issue 37): through `inferd serve` and bare gateways, "
        "against vllm-router",
        "workload": (
            f"{args.groups} system prompts of {prompt_tokens} tokens x {args.conversations} "
            f"conversations x {args.turns} turns, {args.concurrency} at once, "
            f"{args.max_tokens} output tokens, KV cache {args.kv_tokens} tokens per replica, "
            f"{args.replicas} replicas; bench-llama-25m on vLLM CPU"
        ),
        "config": {k: str(v) for k, v in vars(args).items()},
        "system prompt tokens": prompt_tokens,
        "wall s": round(time.monotonic() - started_at),
        "tables": [
            results_format.table(
                title,
                columns,
                [{**r, "routed by reason": str(r["routed by reason"])} for r in rows],
            )
        ],
        "goals": goals,
        "results": rows,
        "runs": [
            {k: v for k, v in r.__dict__.items() if k != "sent"} for rs in runs.values() for r in rs
        ],
    }
    write_report("routing", report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
