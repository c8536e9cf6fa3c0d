"""Stream migration with real vLLM: greedy streams through the gateway over
two tiny-chat replicas, one replica killed mid-way, against the same
requests without the fault, in one run.

For each fault (`process`: the serving replica SIGKILLed; `engine`: only its
vLLM engine core SIGKILLed, so the replica ends its streams with an error
event; `node`: on the Ray launcher, the node of the serving replica removed
from the cluster, see migration_ray.py), the same `--streams` greedy
requests (temperature 0, `ignore_eos`, `--tokens` each, distinct prompts)
run first without a fault (after a short warm-up pass), then with it, the
fault struck `--fault-at` of the fault-free run's time after the streams
start (a third by default). A time, not a count of chunks read: vLLM puts
several tokens in a chunk when it is busy, so a count of chunks can come
too late or never, and the tiny model writes faster than the clients read.
The replica with the most requests in flight is the one hit (locally, as the
gateway counts them: asking a busy replica's /metrics took long enough for
its answers to be written meanwhile); the fault must land while its streams
run (a goal: at least one stream continued). The tiny model generates far
faster than the clients read: a replica has generated its answers long
before they are read, a killed replica process loses what it had not sent
yet (continued elsewhere), but a killed engine core leaves its replica with
every answer generated and nothing to continue. `--fault-at 0` strikes as
soon as a client has read text, while the engines still generate. `process` and
`engine` run on a bare gateway over two local replicas (the killed one
started again between them); `node` on a Ray cluster of its own with
`inferd serve` in front (the real gateway and control plane), after the
local replicas are stopped.

Figures: client errors (an HTTP error, an error event, a missing [DONE]),
streams whose text differs from the fault-free text (compared character by
character; for each difference, where it starts), the migrated streams'
extra latency against their own fault-free latency (the re-prefill and the
wait for a slot), and the usage totals (prompt and completion tokens, from
each stream's usage chunk) of both runs. Goals: 0 errors, 0 differing
texts, usage equal; after the run, no process of it left (an orphaned
replica, engine core or Ray process).

    .venv/bin/python benchmarks/migration.py [--streams 16] [--tokens 400]
        [--faults process engine node] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from common import print_table, write_report
from migration_ray import RayFleet, left_behind, snapshot
from results_format import goal, not_measured, table

from inferd import procfs
from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.testing import ReplicaHandle, free_port, verifier_for

FAULTS = {
    "process": "process",
    "engine": "engine",
    "node": "node removed (Ray launcher)",
}
# A first short pass of the same streams, so that neither measured run pays
# the engine's first batches.
WARM_UP_TOKENS = 8
ENDPOINT = "bench-migration"
TOKEN = new_endpoint_token()
CHAT = "/openai/v1/chat/completions"


@dataclass
class Stream:
    text: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    latency_s: float = 0.0
    chunks: int = 0


class Gateway:
    """A gateway over a static directory, served on a thread."""

    def __init__(self, urls: dict[str, str]) -> None:
        import uvicorn
        from starlette.applications import Starlette

        from inferd.gateway.app import Gateway as InferdGateway
        from inferd.gateway.app import gateway_routes
        from inferd.gateway.directory import EndpointRoute, RoutableReplica
        from inferd.gateway.settings import GatewaySettings
        from inferd.gateway.static import StaticDirectory
        from inferd.http_errors import EXCEPTION_HANDLERS

        self.directory = StaticDirectory()
        self.directory.add_endpoint(
            EndpointRoute(ENDPOINT, "chat", "tiny-chat"),
            [RoutableReplica(rid, url) for rid, url in urls.items()],
        )
        self.gateway = InferdGateway(
            self.directory, verifier_for({ENDPOINT: TOKEN}), GatewaySettings()
        )

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            await self.gateway.startup()
            yield
            await self.gateway.shutdown()

        app = Starlette(
            routes=gateway_routes(self.gateway),
            exception_handlers=EXCEPTION_HANDLERS,
            lifespan=lifespan,
        )
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/endpoints/{ENDPOINT}{CHAT}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def body(index: int, tokens: int) -> dict[str, Any]:
    return {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": f"Story number {index}: tell it at length."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one(
    client: httpx.AsyncClient,
    url: str,
    token: str,
    payload: dict[str, Any],
    out: Stream,
    first_text: asyncio.Event,
) -> None:
    started = time.monotonic()
    parts: list[str] = []
    done = 0
    try:
        headers = {"Authorization": f"Bearer {token}"}
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done += 1
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = f"error event: {chunk['error'].get('message')}"
                    continue
                for choice in chunk.get("choices") or ():
                    parts.append(choice["delta"].get("content") or "")
                    out.chunks += 1
                    first_text.set()
                out.usage = chunk.get("usage") or out.usage
        if done != 1 and out.error is None:
            out.error = f"{done} [DONE] events"
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.text = "".join(parts)
        out.latency_s = time.monotonic() - started


async def run(
    url: str,
    streams: int,
    tokens: int,
    kill: Callable[[], None] | None = None,
    kill_after_s: float = 0.0,
    token: str = TOKEN,
) -> list[Stream]:
    """All streams at once; `kill()` runs `kill_after_s` after they start, or
    with 0, as soon as a client has read text (on a thread: removing a Ray
    node takes seconds, and the streams must be read meanwhile)."""
    out = [Stream() for _ in range(streams)]
    first_text = asyncio.Event()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        tasks = [
            asyncio.create_task(one(client, url, token, body(i, tokens), out[i], first_text))
            for i in range(streams)
        ]
        if kill is not None:
            if kill_after_s > 0:
                await asyncio.sleep(kill_after_s)
            else:
                await first_text.wait()
            await asyncio.to_thread(kill)
        await asyncio.gather(*tasks)
    return out


def wall_s(run: list[Stream]) -> float:
    """How long a run of streams started together took: its longest stream."""
    return max(s.latency_s for s in run)


def start_replica(model: str) -> ReplicaHandle:
    handle = ReplicaHandle(
        model,
        ["--engine", "vllm", "--device", "cpu", "--served-model-name", "tiny-chat", "--no-warmup"],
    )
    try:
        return handle.wait_ready(1800)
    except BaseException:
        handle.stop()
        raise


def engine_core_pid(replica_pid: int) -> int:
    for child in procfs.children(replica_pid):
        if procfs.children(child):
            return child
    raise RuntimeError(f"no engine core under {replica_pid}")


def compare(
    fault: str, clean: list[Stream], faulty: list[Stream], migrated: float
) -> dict[str, Any]:
    differing = []
    for i, (a, b) in enumerate(zip(clean, faulty, strict=True)):
        if a.text != b.text:
            pairs = zip(a.text, b.text, strict=False)
            at = next((k for k, (x, y) in enumerate(pairs) if x != y), None)
            differing.append(
                {"stream": i, "first_difference_at": at, "lengths": [len(a.text), len(b.text)]}
            )
    extra = [b.latency_s - a.latency_s for a, b in zip(clean, faulty, strict=True)]

    def total(run: list[Stream], key: str) -> int:
        return sum(s.usage.get(key, 0) for s in run)

    return {
        "fault": fault,
        "streams": len(faulty),
        "client errors": sum(1 for s in faulty if s.error),
        "errors": [s.error for s in faulty if s.error][:5],
        "fault-free errors": sum(1 for s in clean if s.error),
        "texts differing": len(differing),
        "differences": differing[:5],
        "migrations": migrated,
        "extra latency p50 s": round(statistics.median(extra), 3),
        "extra latency max s": round(max(extra), 3),
        "fault-free latency p50 s": round(statistics.median(s.latency_s for s in clean), 3),
        "prompt tokens (fault-free, faulty)": [
            total(clean, "prompt_tokens"),
            total(faulty, "prompt_tokens"),
        ],
        "completion tokens (fault-free, faulty)": [
            total(clean, "completion_tokens"),
            total(faulty, "completion_tokens"),
        ],
    }


def kill_busiest(
    gateway: Gateway, replicas: dict[str, ReplicaHandle], fault: str, killed: list[str]
) -> None:
    """SIGKILL the replica with the most requests in flight by the gateway's
    count (`process`) or its engine core (`engine`)."""
    in_flight = gateway.gateway.traffic(ENDPOINT).in_flight_by_replica
    victim = max(replicas, key=lambda rid: in_flight.get(rid, 0))
    pid = replicas[victim].pid
    os.kill(pid if fault == "process" else engine_core_pid(pid), signal.SIGKILL)
    killed.append(victim)


def migrations(gateway: Gateway) -> float:
    import re

    text = gateway.gateway.metrics.render().decode()
    return sum(
        float(v)
        for v in re.findall(r"^inferd_gateway_migrations_total\{[^}]*\} ([0-9.]+)$", text, re.M)
    )


def local_faults(args: argparse.Namespace, faults: list[str]) -> list[dict[str, Any]]:
    """`process` and `engine`: a bare gateway over two local replicas."""
    from inferd.catalog.tiny import ensure_tiny_model

    model = str(ensure_tiny_model("tiny-chat"))
    replicas: dict[str, ReplicaHandle] = {}
    results = []
    try:
        for rid in ("r1", "r2"):
            replicas[rid] = start_replica(model)
        for fault in faults:
            gateway = Gateway({rid: r.url for rid, r in replicas.items()})
            try:
                asyncio.run(run(gateway.url, args.streams, WARM_UP_TOKENS))
                clean = asyncio.run(run(gateway.url, args.streams, args.tokens))
                before = migrations(gateway)

                killed: list[str] = []
                kill = partial(kill_busiest, gateway, replicas, fault, killed)
                at = wall_s(clean) * args.fault_at
                faulty = asyncio.run(run(gateway.url, args.streams, args.tokens, kill, at))
                result = compare(fault, clean, faulty, migrations(gateway) - before)
                results.append(result)
                print(json.dumps(result, indent=2), flush=True)
                (victim,) = killed
            finally:
                gateway.stop()
            replicas[victim].stop()
            if fault != faults[-1]:
                # A fresh replica in the killed one's place for the next fault.
                replicas[victim] = start_replica(model)
    finally:
        for replica in replicas.values():
            replica.stop()
    return results


def node_fault(args: argparse.Namespace, marks: list[bytes]) -> dict[str, Any]:
    """`node`: the Ray launcher, the serving replica's node removed."""
    with tempfile.TemporaryDirectory(prefix="migration-ray-") as state:
        started = time.monotonic()
        fleet = RayFleet(Path(state))
        marks.append(fleet.temp_dir.encode())
        try:
            print(f"ray: 2 replicas ready in {time.monotonic() - started:.0f} s", flush=True)
            asyncio.run(run(fleet.url, args.streams, WARM_UP_TOKENS, token=fleet.token))
            clean = asyncio.run(run(fleet.url, args.streams, args.tokens, token=fleet.token))
            before = fleet.migrations()
            at = wall_s(clean) * args.fault_at
            faulty = asyncio.run(
                run(fleet.url, args.streams, args.tokens, fleet.remove_one, at, fleet.token)
            )
            result = compare("node", clean, faulty, fleet.migrations() - before)
            result["node removed"] = fleet.removed
        finally:
            fleet.stop()
    print(json.dumps(result, indent=2), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument(
        "--fault-at",
        type=float,
        default=1 / 3,
        help="when the fault strikes, as a share of the fault-free run's time "
        "(0: as soon as a client has read text)",
    )
    parser.add_argument(
        "--faults", nargs="+", choices=FAULTS, default=list(FAULTS), help=" ".join(FAULTS)
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Every process this run starts inherits the mark (unless it sets its
    # title over its environment), so that what it leaves behind is found.
    run_id = uuid.uuid4().hex
    os.environ["MIGRATION_BENCH_RUN"] = run_id
    marks = [f"MIGRATION_BENCH_RUN={run_id}".encode()]
    before = snapshot()
    results = []
    local = [f for f in args.faults if f != "node"]
    if local:
        results += local_faults(args, local)
    if "node" in args.faults:
        results.append(node_fault(args, marks))
    leftovers = left_behind(before, marks)
    if leftovers:
        print("left behind:\n  " + "\n  ".join(leftovers), flush=True)

    rows = [{k: v for k, v in r.items() if not isinstance(v, list | dict)} for r in results]
    for row, result in zip(rows, results, strict=True):
        row["prompt tokens"] = "/".join(map(str, result["prompt tokens (fault-free, faulty)"]))
        row["completion tokens"] = "/".join(
            map(str, result["completion tokens (fault-free, faulty)"])
        )
    columns = [
        "fault", "streams", "client errors", "texts differing", "migrations",
        "extra latency p50 s", "extra latency max s", "fault-free latency p50 s",
        "prompt tokens", "completion tokens",
    ]  # fmt: skip
    title = f"{args.streams} greedy streams of {args.tokens} tokens, 2 replicas, one lost"
    print_table(title, rows, columns)
    goals = []
    for r in results:
        prompt, completion = (
            r["prompt tokens (fault-free, faulty)"],
            r["completion tokens (fault-free, faulty)"],
        )
        fault = FAULTS[r["fault"]]
        goals += [
            goal(
                f"{fault}: streams continued (the fault hit streams in flight)",
                ">= 1",
                r["migrations"],
                r["migrations"] >= 1,
                "" if r["migrations"] else "no stream was cut mid-answer by the fault",
            ),
            goal(f"{fault}: client errors", "0", r["client errors"], r["client errors"] == 0),
            goal(
                f"{fault}: texts not equal to the fault-free run",
                "0",
                r["texts differing"],
                r["texts differing"] == 0,
                "" if r["texts differing"] == 0 else "see results[].differences",
            ),
            goal(
                f"{fault}: usage totals equal to the fault-free run",
                "prompt and completion tokens equal",
                f"{prompt[1]}/{completion[1]} vs {prompt[0]}/{completion[0]}",
                prompt[0] == prompt[1] and completion[0] == completion[1],
            ),
        ]
    if "node" not in args.faults:
        goals.append(
            not_measured(
                "the same on the Ray launcher with a node removed",
                "0 errors, equal text",
                "not run this time (--faults without node)",
            )
        )
    goals.append(
        goal(
            "processes left behind by the run (orphaned replicas, engine cores, Ray)",
            "0",
            len(leftovers),
            not leftovers,
            "; ".join(leftovers[:5]),
        )
    )
    write_report(
        "migration",
        {
            "title": "Stream migration (real vLLM tiny-chat on the CPU)",
            "workload": f"{args.streams} streams x {args.tokens} tokens, temperature 0, "
            f"ignore_eos, all in flight; the busiest replica lost "
            + (
                f"{args.fault_at:.0%} of the fault-free run's time after the streams started"
                if args.fault_at
                else "as soon as a client had read text"
            ),
            "tables": [table(title, columns, rows)],
            "goals": goals,
            "notes": [
                "Texts are compared character by character with the same requests' text "
                "in a fault-free run on the same two replicas just before. Extra latency: "
                "each stream's latency minus its own fault-free latency.",
                "process, engine: a bare gateway over two local replicas. node: `inferd "
                "serve` (launcher ray, its gateway and control plane) over a local Ray "
                "cluster of two nodes with one CPU replica slot each, one replica on each; "
                "one replica's node removed (`LocalCluster.remove`), so the "
                "endpoint is left with one replica and no room for a replacement.",
                "Scaled to the shared 2-core machine (other engineers' tests ran at the "
                "same time; see the load figures).",
            ],
            "config": {**vars(args), "out": args.out and str(args.out)},
            "results": results,
            "left behind": leftovers,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
