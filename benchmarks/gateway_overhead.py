"""What the gateway adds: the same closed-loop load through the endpoint URL
and straight to the replica, in one run, rounds alternating.

The gateway runs in its own process as in production: this script starts
itself with `--serve-gateway`, which builds `Gateway` over a static directory
(one endpoint, the one replica) and a token verifier holding one token, and
serves it with uvicorn (uvloop, httptools, no access log). The HTTP client
to the replica is measured both ways: the lean pool (default) and httpx.

Parts:
- latency: fake engine with token_delay_s=0, non-streamed, 2 output tokens:
  the added p50/p99 is the gateway's own cost (goal p50 <= 1 ms, p99 <= 5 ms).
- stream: fake engine with token_delay_s=0 (the gateway's per-token cost
  is all there is to see), streamed, 64 tokens: output tokens/s ratio (goal
  >= 0.95) and TTFT p50 delta (goal <= +2 ms).
- routing: what the routing choice costs per request for a 4k-token
  conversation (about 16 KB of messages), in process: least-loaded (the
  policy before prefix routing) against prefix routing (block hashes, the
  prefix table, rendezvous order; budget 50 us). Then the same
  conversation through two gateway processes, one per policy, alternating:
  the gateway's CPU per request before and after.
- serve: the production path. `inferd serve` (management API, registry,
  reconciler and gateway in one process) with one endpoint pinned at one
  fake-engine replica; the load goes to the endpoint's `url` with its token
  and, for the reference, straight to that replica (skipped with
  --skip-serve). "gateway cpu us/req" is then the whole server's CPU.
- vllm: the same two on a real vLLM tiny-chat replica on the CPU (skipped
  where vLLM is missing, or with --skip-vllm).
- `--migration-compare`: the fake and vLLM parts also run a pool gateway
  with stream migration off, so that what migration costs with no fault
  (keeping each stream's events, whole-event relaying) is side by side
  with the default (on); goal: at most +20 us of gateway CPU per request.

"gateway cpu us/req" is the gateway process's CPU time (user + system, from
/proc) per request: unlike latency it barely moves with the load other
processes put on the machine, so it is the number to compare clients by.

    .venv/bin/python benchmarks/gateway_overhead.py [--requests 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import results_format
from common import LoadResult, chat_rounds, pooled, print_table, wait_http_ok, write_report

from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.testing import ReplicaHandle, free_port

ENDPOINT_ID = "bench-endpoint"
MODEL = "tiny-chat"
ADDED_P50_GOAL_MS = 1.0
ADDED_P99_GOAL_MS = 5.0
TOKENS_GOAL = 0.95
TTFT_SLACK_MS = 2.0
ROUTING_BUDGET_US = 50.0
MIGRATION_BUDGET_US = 20.0
# The vLLM part runs these two, whatever --concurrency says.
VLLM_LATENCY = "vllm latency c=1"
VLLM_STREAM = "vllm stream c=4"
ROUTING_PREFIX = "prefix (after)"


# --- the gateway process ---------------------------------------------------------


def serve_gateway(
    replica_url: str,
    port: int,
    token: str,
    upstream: str,
    routing: str = "prefix",
    otlp_endpoint: str | None = None,
    trace_sample_ratio: float = 1.0,
    migration: bool = True,
) -> None:
    import contextlib
    from collections.abc import AsyncIterator

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from inferd.gateway.app import Gateway, gateway_routes
    from inferd.gateway.directory import EndpointRoute, RoutableReplica
    from inferd.gateway.routing import Policy
    from inferd.gateway.settings import GatewaySettings
    from inferd.gateway.static import StaticDirectory
    from inferd.gateway.upstream import HttpxUpstream
    from inferd.http_errors import EXCEPTION_HANDLERS
    from inferd.testing import verifier_for
    from inferd.tracing import TracingSettings, configure

    if otlp_endpoint:
        configure(TracingSettings(otlp_endpoint, sample_ratio=trace_sample_ratio), "inferd-gateway")
    directory = StaticDirectory()
    directory.add_endpoint(
        EndpointRoute(ENDPOINT_ID, "chat", MODEL), [RoutableReplica("r-1", replica_url)]
    )
    settings = GatewaySettings(
        max_in_flight_per_replica=256, routing_policy=Policy(routing), migration=migration
    )
    client = HttpxUpstream() if upstream == "httpx" else None
    gateway = Gateway(directory, verifier_for({ENDPOINT_ID: token}), settings, upstream=client)

    async def health(request: Request) -> Response:
        return Response(b"ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.startup()
        yield
        await gateway.shutdown()

    app = Starlette(
        routes=[*gateway_routes(gateway), Route("/healthz", health)],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        access_log=False,
        log_level="warning",
        loop="uvloop",
        http="httptools",
    )


def start_gateway(
    replica_url: str,
    token: str,
    upstream: str,
    routing: str = "prefix",
    tracing: tuple[str, float] | None = None,
    migration: bool = True,
) -> tuple[Any, str]:
    port = free_port()
    command = [
        sys.executable, __file__, "--serve-gateway", "--replica-url", replica_url,
        "--port", str(port), "--token", token, "--upstream", upstream, "--routing", routing,
        *(() if migration else ("--no-migration",)),
    ]  # fmt: skip
    if tracing is not None:
        command += ["--otlp-endpoint", tracing[0], "--trace-sample-ratio", str(tracing[1])]
    process = subprocess.Popen(command, start_new_session=True)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", process, timeout=60)
    except BaseException:
        process.kill()
        raise
    return process, f"http://127.0.0.1:{port}/endpoints/{ENDPOINT_ID}"


# --- measuring -------------------------------------------------------------------------


def compare(
    part: str, runs: dict[str, list[LoadResult]], stream: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = pooled("direct", runs["direct"])
    rows = [{"part": part, **base}]
    summary: dict[str, Any] = {"direct": base}
    for name in runs:
        if name == "direct":
            continue
        row = pooled(name, runs[name])
        cpu = [c for r in runs[name] if (c := r.cpu_s_per_request) is not None]
        if cpu:
            row["gateway cpu us/req"] = round(statistics.median(cpu) * 1e6)
        row["added p50 ms"] = round(row["latency_p50_ms"] - base["latency_p50_ms"], 3)
        row["added p99 ms"] = round(row["latency_p99_ms"] - base["latency_p99_ms"], 3)
        if base["output_tokens_per_s"]:
            row["tok/s ratio"] = round(row["output_tokens_per_s"] / base["output_tokens_per_s"], 3)
        if stream and base["ttft_p50_ms"] is not None and row["ttft_p50_ms"] is not None:
            row["ttft p50 delta ms"] = round(row["ttft_p50_ms"] - base["ttft_p50_ms"], 3)
        rows.append({"part": part, **row})
        summary[name] = row
    return rows, summary


def warm_then_measure(
    targets: dict[str, tuple[str, dict[str, str]]],
    pids: dict[str, int],
    rounds: int,
    requests: int,
    concurrency: int,
    max_tokens: int,
    stream: bool,
) -> dict[str, list[LoadResult]]:
    """One untimed round on every path (connections, first-call costs), then
    the measured rounds, with each process's CPU seconds in every round."""
    chat_urls = {
        name: (url + "/openai/v1/chat/completions", headers)
        for name, (url, headers) in targets.items()
    }

    def rounds_of(count: int, size: int, cpu_pids: dict[str, int]) -> dict[str, list[LoadResult]]:
        return asyncio.run(
            chat_rounds(chat_urls, model=MODEL, rounds=count, requests=size,
                        concurrency=concurrency, max_tokens=max_tokens, stream=stream,
                        cpu_pids=cpu_pids, timeout_s=300)
        )  # fmt: skip

    rounds_of(1, 32, {})
    return rounds_of(rounds, requests, pids)


def run_part(
    part: str,
    replica_url: str,
    args: argparse.Namespace,
    *,
    stream: bool,
    max_tokens: int,
    concurrency: int,
    requests: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:

    token = new_endpoint_token()
    gateways = {}
    targets: dict[str, tuple[str, dict[str, str]]] = {"direct": (replica_url, {})}
    pids: dict[str, int] = {}
    try:
        for upstream in args.upstreams:
            process, url = start_gateway(replica_url, token, upstream)
            gateways[upstream] = process
            targets[f"gateway-{upstream}"] = (url, {"Authorization": f"Bearer {token}"})
            pids[f"gateway-{upstream}"] = process.pid
        if args.migration_compare:
            # The same gateway with stream migration off: what keeping a
            # stream's events (to continue it elsewhere) costs with no fault.
            process, url = start_gateway(replica_url, token, "pool", migration=False)
            gateways["pool-no-migration"] = process
            targets["gateway-pool-no-migration"] = (url, {"Authorization": f"Bearer {token}"})
            pids["gateway-pool-no-migration"] = process.pid
        runs = warm_then_measure(
            targets, pids, args.rounds, requests, concurrency, max_tokens, stream
        )
    finally:
        for process in gateways.values():
            process.terminate()
            process.wait(30)
    return compare(part, runs, stream)


def conversation(words: int = 3000, turns: int = 6) -> list[dict[str, str]]:
    """A multi-turn chat of about `words` words (~4k tokens, ~16 KB)."""
    per = words // (turns * 2 + 1)
    text = " ".join(f"word{i % 97}" for i in range(per))
    messages = [{"role": "system", "content": f"You are agent 7. {text}"}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: {text}"})
        messages.append({"role": "assistant", "content": f"Answer {turn}: {text}"})
    messages.append({"role": "user", "content": "And finally?"})
    return messages


def routing_decision_cpu(iterations: int = 20_000) -> list[dict[str, Any]]:
    """CPU per routing choice for one 4k-token conversation, 4 replicas:
    the whole per-request routing path of each policy, new conversation
    each time (the prefix table misses, then records)."""
    import json
    import time

    from inferd.gateway.affinity import PrefixTable, request_prefix
    from inferd.gateway.directory import RoutableReplica
    from inferd.gateway.routing import Affinity, Policy, choose_replica
    from inferd.gateway.settings import GatewaySettings

    settings = GatewaySettings()
    replicas = [RoutableReplica(f"replica-{i}", f"http://127.0.0.1:{9000 + i}") for i in range(4)]

    def serving() -> set[str]:
        return {r.replica_id for r in replicas}

    in_flight = {"replica-0": 3, "replica-1": 2, "replica-2": 5}
    messages = conversation()
    bodies = []
    for i in range(64):  # distinct conversations (first block differs)
        messages[0] = {**messages[0], "content": f"agent {i} " + messages[0]["content"]}
        bodies.append(json.dumps({"model": MODEL, "messages": messages, "stream": True}).encode())
    table = PrefixTable(settings.prefix_table_entries)

    def least_loaded(body: bytes, turn: int) -> None:
        choose_replica(replicas, in_flight, max_in_flight=256, turn=turn)

    def prefix(body: bytes, turn: int) -> None:
        p = request_prefix(
            body, ENDPOINT_ID, base_model=MODEL,
            block_bytes=settings.prefix_block_bytes, max_blocks=settings.prefix_max_blocks,
        )  # fmt: skip
        affinity = Affinity(p.home, table.lookup(p.blocks), p.adapter)
        choice = choose_replica(
            replicas, in_flight, max_in_flight=256, turn=turn, affinity=affinity,
            policy=Policy.PREFIX, load_factor=settings.routing_load_factor,
        )  # fmt: skip
        assert choice.replica is not None
        table.record(p.blocks, choice.replica.replica_id, serving)

    rows = []
    for name, decide in (("least_loaded (before)", least_loaded), (ROUTING_PREFIX, prefix)):
        samples = []
        for _ in range(3):
            started = time.process_time()
            for i in range(iterations):
                decide(bodies[i % 64], i)
            samples.append((time.process_time() - started) / iterations)
        rows.append({
            "part": "routing decision, 4k-token chat", "label": name,
            "requests": iterations * 3, "body bytes": len(bodies[0]),
            "cpu us/decision": round(statistics.median(samples) * 1e6, 2),
        })  # fmt: skip
    return rows


def run_routing_part(url: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Any]:
    """The 4k-token conversation through one gateway per policy."""
    token = new_endpoint_token()
    targets: dict[str, tuple[str, dict[str, str]]] = {"direct": (url, {})}
    pids: dict[str, int] = {}
    gateways = []
    try:
        for routing in ("least_loaded", "prefix"):
            process, gateway_url = start_gateway(url, token, "pool", routing)
            gateways.append(process)
            targets[f"gateway-{routing}"] = (gateway_url, {"Authorization": f"Bearer {token}"})
            pids[f"gateway-{routing}"] = process.pid
        chat_urls = {n: (u + "/openai/v1/chat/completions", h) for n, (u, h) in targets.items()}
        extra = {"messages": conversation()}

        def rounds_of(count: int, size: int, cpu: dict[str, int]) -> dict[str, list[LoadResult]]:
            return asyncio.run(
                chat_rounds(chat_urls, model=MODEL, rounds=count, requests=size, concurrency=8,
                            max_tokens=2, stream=False, cpu_pids=cpu, timeout_s=300, extra=extra)
            )  # fmt: skip

        rounds_of(1, 32, {})
        runs = rounds_of(args.rounds, args.requests, pids)
    finally:
        for process in gateways:
            process.terminate()
            process.wait(30)
    return compare("fake 4k-token chat c=8", runs, False)


def run_tracing_part(url: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Any]:
    """The same load through three gateway processes, alternating: tracing
    off, on with 1% of requests sampled, on with all of them (spans sent by
    OTLP/HTTP to a receiver in this process that only counts them)."""
    receiver = _SpanSink()
    token = new_endpoint_token()
    targets: dict[str, tuple[str, dict[str, str]]] = {"direct": (url, {})}
    pids: dict[str, int] = {}
    gateways = []
    try:
        for name, tracing in (
            ("tracing-off", None),
            ("tracing-1%", (receiver.url, 0.01)),
            ("tracing-100%", (receiver.url, 1.0)),
        ):
            process, gateway_url = start_gateway(url, token, "pool", tracing=tracing)
            gateways.append(process)
            targets[f"gateway-{name}"] = (gateway_url, {"Authorization": f"Bearer {token}"})
            pids[f"gateway-{name}"] = process.pid
        runs = warm_then_measure(targets, pids, args.rounds, args.requests, 8, 2, False)
    finally:
        for process in gateways:
            process.terminate()
            process.wait(30)
        receiver.stop()
    rows, summary = compare("fake latency c=8, tracing", runs, False)
    summary["spans received"] = receiver.count  # export batches (POSTs), not spans
    return rows, summary


def tracing_result(
    rows: list[dict[str, Any]], report: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """The tracing part as a results file (`benchmarks/results_format.py`)."""
    from results_format import goal, not_measured, table

    cpu = {row["label"]: row.get("gateway cpu us/req") for row in rows}
    off, one, every = (cpu.get(f"gateway-tracing-{n}") for n in ("off", "1%", "100%"))
    columns = ["label", "requests", "errors", "latency_p50_ms", "latency_p99_ms",
               "added p50 ms", "gateway cpu us/req"]  # fmt: skip
    goals = [
        not_measured(
            "tracing off costs nothing measurable",
            "no CPU per request over a gateway without tracing",
            "a gateway without the tracing code is not in this run; off, the request path "
            "does one None check (Tracer.start) and makes no span, context or header",
        ),
        goal(
            "1% sampling: gateway CPU per request over tracing off",
            "<= +5%",
            None if off is None or one is None else round(100 * (one / off - 1), 1),
            None if off is None or one is None else one <= off * 1.05,
            "an unsampled request costs one random number; a difference this size is the "
            "CPU clock's granularity and the machine's noise (rerun with more --requests)",
        ),
        goal(
            "100% sampling: gateway CPU per request over tracing off (stated)",
            "stated",
            None if off is None or every is None else round(100 * (every / off - 1), 1),
            None if off is None or every is None else True,
        ),
    ]
    return {
        "title": "Tracing cost in the gateway (fake engine, non-streamed, c=8)",
        "workload": f"{args.requests} requests x {args.rounds} alternating rounds per target, "
        "2 output tokens; spans sent by OTLP/HTTP to a receiver in the benchmark process",
        "tables": [table("gateway CPU per request by tracing setting", columns, rows)],
        "goals": goals,
        "notes": [
            "Figures in percent; 'gateway cpu us/req' is the gateway process's own CPU time "
            "(user + system) per request, which moves little with other processes' load.",
            "OTLP export batches the receiver got: "
            f"{report['parts']['fake latency c=8, tracing']['spans received']}.",
        ],
        "parts": report["parts"],
    }


class _SpanSink:
    """An OTLP/HTTP endpoint that accepts span batches and counts them."""

    def __init__(self) -> None:
        import threading

        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        self.count = 0

        async def traces(request: Request) -> Response:
            self.count += 1
            await request.body()
            return Response(status_code=200)

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])]),
                host="127.0.0.1",
                port=port,
                log_level="warning",
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def run_serve_parts(args: argparse.Namespace, add: Any) -> None:
    """The parts measured through a real `inferd serve` endpoint URL."""
    import tempfile

    from inferd.testing import ServeHandle

    with tempfile.TemporaryDirectory(prefix="bench-gateway-serve-") as workdir:
        serve = ServeHandle(
            Path(workdir),
            # The direct baseline calls the replica without the gateway's
            # key: the chat path is opened to it for this measurement (the
            # key check itself is one constant-time comparison).
            settings={
                "replica_args": "--engine fake --engine-arg token_delay_s=0 "
                "--open-paths /health,/metrics,/openai/v1/chat/completions"
            },
        ).start()
        try:
            created = serve.create_endpoint(
                name="bench", modelName=MODEL, minReplicas=1, maxReplicas=1
            )
            record = serve.wait_record(created["id"], lambda r: r["status"] == "running", 120)
            (replica,) = record["replicas"]
            targets = {
                "direct": (serve.replica_url(replica["id"]), {}),
                "endpoint": (
                    created["url"],
                    {"Authorization": f"Bearer {created['accessToken']}"},
                ),
            }
            assert serve.process is not None
            pids = {"endpoint": serve.process.pid}
            for stream in (False, True):
                for concurrency in args.concurrency:
                    part = f"serve {'stream' if stream else 'latency'} c={concurrency}"
                    max_tokens = args.stream_tokens if stream else 2
                    requests = max(16, args.requests // 4) if stream else args.requests
                    runs = warm_then_measure(
                        targets, pids, args.rounds, requests, concurrency, max_tokens, stream
                    )
                    add(part, compare(part, runs, stream))
        finally:
            serve.cleanup()


COLUMNS = [
    "part", "label", "requests", "errors", "latency_p50_ms", "latency_p99_ms", "added p50 ms",
    "added p99 ms", "output_tokens_per_s", "tok/s ratio", "ttft_p50_ms", "ttft p50 delta ms",
    "gateway cpu us/req", "body bytes", "cpu us/decision",
]  # fmt: skip
ROUTING_COLUMNS = ["part", "label", "requests", "body bytes", "cpu us/decision"]
PATH_COLUMNS = [c for c in COLUMNS if c not in ROUTING_COLUMNS[3:]]


# --- the result file ---------------------------------------------------------------------

# Goals are judged on the gateway as shipped: the pool client is its default
# upstream (httpx is the reference it was measured against), migration on.
JUDGED = "gateway-pool"
UNMIGRATED = "gateway-pool-no-migration"


@dataclass(frozen=True)
class Bound:
    """A docstring goal on one figure of the judged gateway's row: `key` in
    that row, `missing` why a row can lack it, `over` why a figure past
    `limit` misses."""

    key: str
    name: str
    target: str
    limit: float
    at_least: bool
    missing: str
    over: str


LATENCY_BOUNDS = (
    Bound("added p50 ms", "added latency p50, gateway (pool) - direct",
          f"<= +{ADDED_P50_GOAL_MS:g} ms", ADDED_P50_GOAL_MS, False,
          "no latency on a side", "the gateway added more than the goal in this run"),
    Bound("added p99 ms", "added latency p99, gateway (pool) - direct",
          f"<= +{ADDED_P99_GOAL_MS:g} ms", ADDED_P99_GOAL_MS, False,
          "no latency on a side", "the gateway added more than the goal in this run"),
)  # fmt: skip
STREAM_BOUNDS = (
    Bound("tok/s ratio", "output tokens/s, gateway (pool) / direct", f">= {TOKENS_GOAL}x",
          TOKENS_GOAL, True, "the replica called directly delivered no output tokens",
          "fewer tokens/s through the gateway than the goal allows in this run"),
    Bound("ttft p50 delta ms", "TTFT p50, gateway (pool) - direct", f"<= +{TTFT_SLACK_MS:g} ms",
          TTFT_SLACK_MS, False, "a side streamed no first token",
          "a later first token through the gateway in this run"),
)  # fmt: skip
# Keeping each stream's events costs CPU even when no fault comes: the pool
# gateway's CPU per request with migration on, over the same gateway's off.
MIGRATION_BOUND = Bound(
    "gateway cpu us/req", "gateway CPU per request, stream migration on - off",
    f"<= +{MIGRATION_BUDGET_US:g} us", MIGRATION_BUDGET_US, False,
    "no CPU reading of a gateway process", "migration cost more CPU than its budget in this run",
)  # fmt: skip
ROUTING_BOUND = Bound(
    "cpu us/decision", "routing choice CPU per request, prefix routing, 4k-token chat",
    f"<= {ROUTING_BUDGET_US:g} us", ROUTING_BUDGET_US, False,
    "no routing choice timed", "the choice cost more CPU than its budget in this run",
)  # fmt: skip


def judged_parts(args: argparse.Namespace) -> list[tuple[str, tuple[Bound, ...]]]:
    """The parts the docstring's goals bound: the fake engine's latency and
    stream parts, and "the same two" on vLLM."""
    parts = [(f"fake latency c={c}", LATENCY_BOUNDS) for c in args.concurrency]
    parts += [(f"fake stream c={c}", STREAM_BOUNDS) for c in args.concurrency]
    return [*parts, (VLLM_LATENCY, LATENCY_BOUNDS), (VLLM_STREAM, STREAM_BOUNDS)]


def reasons(*why: str) -> str:
    return "; ".join(w for w in why if w)


def errors_why(*sides: dict[str, Any]) -> str:
    """A failed request is missing from its side's figures, so a part with
    any fails its goals however the figures compare."""
    counts = {side["label"]: side["errors"] for side in sides if side["errors"]}
    if not counts:
        return ""
    each = ", ".join(f"{count} {label}" for label, count in counts.items())
    return f"{sum(counts.values())} errors ({each})"


def absent_why(args: argparse.Namespace, part: str, parts: dict[str, Any], label: str) -> str:
    """Why the run has no `label` row in `part` ("" when it has one)."""
    if part.startswith("vllm") and part not in parts:
        if args.skip_vllm:
            return "the vLLM part was skipped (--skip-vllm)"
        return "vLLM is not installed where the run was made: the vLLM part was skipped"
    if part not in parts:
        return "the fake-engine parts were skipped (--skip-fake)"
    if label not in parts[part]:
        return f"no pool gateway in this run (--upstreams {' '.join(args.upstreams)})"
    return ""


def judge(name: str, bound: Bound, figure: float | None, failed: str) -> dict[str, Any]:
    if figure is None:
        return results_format.not_measured(name, bound.target, reasons(bound.missing, failed))
    within = figure >= bound.limit if bound.at_least else figure <= bound.limit
    why = reasons(failed, "" if within else bound.over)
    return results_format.goal(name, bound.target, figure, within and not failed, why)


def part_goals(
    args: argparse.Namespace, part: str, bounds: tuple[Bound, ...], parts: dict[str, Any]
) -> list[dict[str, Any]]:
    absent = absent_why(args, part, parts, JUDGED)
    if absent:
        return [results_format.not_measured(f"{part}: {b.name}", b.target, absent) for b in bounds]
    base, ours = parts[part]["direct"], parts[part][JUDGED]
    failed = errors_why(base, ours)
    return [judge(f"{part}: {b.name}", b, ours.get(b.key), failed) for b in bounds]


def migration_goal(args: argparse.Namespace, part: str, parts: dict[str, Any]) -> dict[str, Any]:
    bound = MIGRATION_BOUND
    name = f"{part}: {bound.name}"
    absent = absent_why(args, part, parts, JUDGED)
    if not absent and not args.migration_compare:
        absent = "no gateway with stream migration off in this run (--migration-compare)"
    if absent:
        return results_format.not_measured(name, bound.target, absent)
    on, off = parts[part][JUDGED], parts[part][UNMIGRATED]
    cost = [side.get(bound.key) for side in (on, off)]
    added = None if None in cost else cost[0] - cost[1]
    return judge(name, bound, added, errors_why(on, off))


def routing_goal(parts: dict[str, Any]) -> dict[str, Any]:
    """Prefix routing's whole per-request choice (hashes, prefix table,
    rendezvous order), in process: its CPU is what the budget bounds."""
    bound = ROUTING_BOUND
    if "routing decision" not in parts:
        why = "the routing part was skipped (--skip-routing)"
        return results_format.not_measured(bound.name, bound.target, why)
    row = next(r for r in parts["routing decision"] if r["label"] == ROUTING_PREFIX)
    return judge(bound.name, bound, row.get(bound.key), "")


def goals_of(args: argparse.Namespace, parts: dict[str, Any]) -> list[dict[str, Any]]:
    goals = [routing_goal(parts)]
    for part, bounds in judged_parts(args):
        goals += [*part_goals(args, part, bounds, parts), migration_goal(args, part, parts)]
    return goals


def skipped(args: argparse.Namespace, parts: dict[str, Any]) -> list[str]:
    options = [
        ("routing", "--skip-routing", args.skip_routing),
        ("fake engine", "--skip-fake", args.skip_fake),
        ("serve", "--skip-serve", args.skip_serve),
        ("vLLM", "--skip-vllm", args.skip_vllm),
    ]
    gone = [f"{part} ({option})" for part, option, skip in options if skip]
    if not args.skip_vllm and VLLM_LATENCY not in parts:
        gone.append("vLLM (not installed)")
    return gone


def workload(args: argparse.Namespace, parts: dict[str, Any]) -> str:
    clients = ", ".join(args.upstreams)
    if args.migration_compare:
        clients += ", and pool with stream migration off"
    gone = skipped(args, parts)
    return (
        f"{args.rounds} alternating rounds per part after one untimed round, the gateway in "
        f"its own process over a static directory (upstream clients: {clients}); fake engine "
        f"(token_delay_s=0): latency parts non-streamed, 2 output tokens, {args.requests} "
        f"requests a round, stream parts streamed, {args.stream_tokens} tokens, "
        f"{max(16, args.requests // 4)} requests a round, each at concurrency "
        f"{', '.join(map(str, args.concurrency))}; serve: the same through an `inferd serve` "
        f"endpoint URL; vLLM tiny-chat on {args.device}: c=1 non-streamed, 4 tokens, "
        f"{max(20, args.requests // 4)} requests a round, c=4 streamed, {args.stream_tokens} "
        f"tokens, {max(16, args.requests // 10)} requests a round; routing: a ~4k-token chat, "
        f"2 tokens, c=8, one gateway per policy; tracing: c=8, 2 tokens, off / 1% / 100% "
        f"sampled" + (f"; skipped: {', '.join(gone)}" if gone else "")
    )


def keyed(rows: list[dict[str, Any]], columns: list[str]) -> list[dict[str, Any]]:
    return [{column: row.get(column) for column in columns} for row in rows]


def build_report(
    args: argparse.Namespace, rows: list[dict[str, Any]], measured: dict[str, Any]
) -> dict[str, Any]:
    """The run as a result file (`results_format`): the printed table (the
    in-process routing choice apart), every goal the docstring names, and
    the raw `config` and `parts`."""
    parts = measured["parts"]
    routing = [row for row in rows if "cpu us/decision" in row]
    paths = [row for row in rows if "cpu us/decision" not in row]
    tables = [
        results_format.table(
            "Through the gateway against the replica called directly",
            PATH_COLUMNS,
            keyed(paths, PATH_COLUMNS),
        )
    ]
    if routing:
        tables.append(
            results_format.table(
                "The routing choice alone, in process (4 replicas)",
                ROUTING_COLUMNS,
                keyed(routing, ROUTING_COLUMNS),
            )
        )
    return {
        **measured,
        "title": "Gateway overhead: the same load through the gateway and straight to the "
        "replica (gateway_overhead)",
        "workload": workload(args, parts),
        "tables": tables,
        "goals": goals_of(args, parts),
        "notes": [
            "Goals are judged on the gateway as shipped: `gateway-pool` (its default upstream "
            "client, stream migration on). `gateway-httpx` is the client the pool was "
            "measured against; `gateway-pool-no-migration` the same gateway with migration "
            "off. `gateway cpu us/req`: the gateway process's CPU time (user + system, from "
            "/proc) per request; in the serve parts, the whole `inferd serve` process's.",
            "The docstring states no goal for the serve parts (the production path), for the "
            "gateway's CPU per request under each routing policy (the 4k-token chat rows), "
            "nor for the tracing part (its goals are judged by `--only-tracing`, written to "
            "gateway_tracing.json): their figures are tables only.",
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="per round and target")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--upstreams", nargs="+", default=["pool", "httpx"])
    parser.add_argument("--skip-fake", action="store_true")
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    # Internal: the gateway process.
    parser.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replica-url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="pool", help=argparse.SUPPRESS)
    parser.add_argument("--routing", default="prefix", help=argparse.SUPPRESS)
    parser.add_argument("--no-migration", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--otlp-endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--trace-sample-ratio", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--only-tracing",
        action="store_true",
        help="only the tracing part: the gateway's CPU per request with tracing off, 1%%, 100%%",
    )
    parser.add_argument("--skip-routing", action="store_true")
    parser.add_argument(
        "--migration-compare",
        action="store_true",
        help="add a pool gateway with stream migration off to the fake and vLLM parts",
    )
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(
            args.replica_url,
            args.port,
            args.token,
            args.upstream,
            args.routing,
            args.otlp_endpoint,
            args.trace_sample_ratio,
            migration=not args.no_migration,
        )
        return 0

    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}, "parts": {}}

    def add(part: str, result: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        rows.extend(result[0])
        report["parts"][part] = result[1]

    if args.only_tracing:
        args.skip_routing = args.skip_fake = args.skip_serve = args.skip_vllm = True
    fake = ReplicaHandle(MODEL, ["--engine", "fake", "--engine-arg", "token_delay_s=0"])
    try:
        add("fake latency c=8, tracing", run_tracing_part(fake.wait_ready(60).url, args))
    finally:
        fake.stop()
    if args.only_tracing:
        print_table("gateway CPU per request, tracing off / 1% / 100%", rows, COLUMNS)
        write_report("gateway_tracing", tracing_result(rows, report, args), args.out)
        return 0

    if not args.skip_routing:
        rows.extend(routing_decision_cpu())
        report["parts"]["routing decision"] = rows[-2:]
        long = ReplicaHandle(
            MODEL,
            ["--engine", "fake", "--engine-arg", "token_delay_s=0",
             "--engine-arg", "context_length=32768"],
        )  # fmt: skip
        try:
            add("fake 4k-token chat c=8", run_routing_part(long.wait_ready(60).url, args))
        finally:
            long.stop()

    if not args.skip_fake:
        fake = ReplicaHandle(MODEL, ["--engine", "fake", "--engine-arg", "token_delay_s=0"])
        try:
            url = fake.wait_ready(60).url
            for concurrency in args.concurrency:
                part = f"fake latency c={concurrency}"
                add(part, run_part(part, url, args, stream=False, max_tokens=2,
                                   concurrency=concurrency, requests=args.requests))  # fmt: skip
            for concurrency in args.concurrency:
                part = f"fake stream c={concurrency}"
                add(part, run_part(part, url, args, stream=True, max_tokens=args.stream_tokens,
                                   concurrency=concurrency,
                                   requests=max(16, args.requests // 4)))  # fmt: skip
        finally:
            fake.stop()

    if not args.skip_serve:
        run_serve_parts(args, add)

    if not args.skip_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not installed: skipping the vLLM part")
        else:
            from inferd.catalog.tiny import ensure_tiny_model

            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            model_path = ensure_tiny_model("tiny-chat")
            real = ReplicaHandle(
                str(model_path),
                ["--engine", "vllm", "--device", args.device, "--served-model-name", MODEL],
            )
            try:
                url = real.wait_ready(900).url
                add(
                    VLLM_LATENCY,
                    run_part(VLLM_LATENCY, url, args, stream=False, max_tokens=4,
                             concurrency=1, requests=max(20, args.requests // 4)),
                )  # fmt: skip
                add(
                    VLLM_STREAM,
                    run_part(VLLM_STREAM, url, args, stream=True,
                             max_tokens=args.stream_tokens, concurrency=4,
                             requests=max(16, args.requests // 10)),
                )  # fmt: skip
            finally:
                real.stop()

    print_table(
        f"gateway overhead: {args.rounds} alternating rounds per part, "
        f"upstream clients {', '.join(args.upstreams)}",
        rows,
        COLUMNS,
    )
    write_report("gateway_overhead", build_report(args, rows, report), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
