"""Replicas on a Ray cluster against replicas as local processes, and faults
on the cluster. One run, one machine: a local Ray cluster
(`ray.cluster_utils`: a head that takes no work and three us-east nodes,
each with one fake H100 and one CPU replica slot, all on 127.0.0.2).

    .venv/bin/python benchmarks/ray_placement.py [--rounds 2] [--engine vllm]
        [--load-seconds 4] [--concurrency 4]

1. create -> first token: `inferd serve` with the local launcher and with
   `--launcher ray`, each with a CPU endpoint (minReplicas 1) created, a
   streamed chat request sent at once (the gateway holds it until the
   replica is ready) and timed to its first content token from the create
   call; then the endpoint is deleted. Rounds alternate the launchers.
   `--engine vllm` (default): tiny-chat on vLLM, what users wait for;
   `fake`: the launch path alone. Goal: ray median <= 1.15 x local median.
2. faults under load (fake engine, `--launcher ray`): an endpoint with two
   1-GPU replicas on two nodes and `--concurrency` clients in a closed loop
   (non-streamed chats). Then, one at a time: the replica process SIGKILLed,
   the replica's actor SIGKILLed, the replica's node removed from the
   cluster. Each is timed to "noticed" (the replica leaves the record) and
   to "replacement ready" (the endpoint is back to two ready replicas), and
   the requests that failed are counted, against those that were in flight
   when the fault hit. Goal: no failed request beyond those in flight on the
   lost replica.
3. node loss with two slots per node (`--node-loss`, fake engine, its own
   cluster: two us-east nodes with two CPU replica slots each, so Ray is
   free to pack): an endpoint with two replicas under open-loop load
   (`--rate` requests/s for `--node-loss-seconds`), the node holding the
   first replica removed after a quarter of the time. Rounds alternate
   `ray_placement: spread` (the default) and `pack` (Ray's own default, the
   reference). Reported: replicas on the lost node, failed requests, time
   back to full strength (two ready replicas), the slowest answer. Goal:
   spread fails nothing and never loses every replica at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from common import chat_body, load_average, one_chat, print_table, write_report
from results_format import goal, not_measured, table

from inferd import procfs
from inferd.testing import ServeHandle
from inferd.testing.cluster import NODE_IP, FakeNode, LocalCluster, start_cluster

GOAL_RATIO = 1.15
NAMESPACE = "inferd-bench"
NODES = {f"east-{c}": FakeNode("us-east", "H100-80GB", 1, 1) for c in "abc"}
FAST = {
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "replica_drain_timeout_seconds": "10",
    "autoscale_upscale_delay_seconds": "0.5",
    # A vLLM replica loads for minutes on a busy 2-core machine: the request
    # sent at create time must be held that long, not answered 503.
    "gateway_hold_timeout_seconds": "900",
    "replica_start_timeout_seconds": "900",
}
FAULTS = ("replica process SIGKILL", "actor SIGKILL", "node removed")
CREATE_COLUMNS = ["launcher", "engine", "rounds", "median_s", "min_s", "max_s"]
FAULT_COLUMNS = [
    "fault", "noticed_s", "replacement_ready_s", "requests", "failed", "in_flight_at_fault",
]  # fmt: skip
NODE_LOSS_COLUMNS = [
    "placement", "replicas_on_lost_node", "requests", "failed", "back_to_full_s", "slowest_s",
]  # fmt: skip


def serve_for(
    launcher: str, cluster: LocalCluster, state: Path, engine_args: str, **more: str
) -> ServeHandle:
    settings = {**FAST, "replica_args": engine_args, **more}
    if launcher == "ray":
        settings.update(
            launcher="ray",
            ray_address=cluster.address,
            ray_namespace=NAMESPACE,
            ray_node_ip_address=NODE_IP,
        )
    handle = ServeHandle(state / launcher, settings=settings)
    handle.env.update(cluster.env())
    return handle.start(timeout=120)


# -- 1. create -> first token ---------------------------------------------------------


async def create_to_first_token(serve: ServeHandle, location: str, name: str) -> float:
    headers = {"Authorization": f"Bearer {serve.admin_key}"}
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        response = await client.post(
            f"{serve.url}/inference/endpoints",
            headers=headers,
            json={
                "name": name,
                "modelName": "tiny-chat",
                "locationName": location,
                "gpuType": "cpu",
                "minReplicas": 1,
                "maxReplicas": 1,
            },
        )
        response.raise_for_status()
        created = response.json()
        body = chat_body("tiny-chat", 8, True, "Say something.")
        token = {"Authorization": f"Bearer {created['accessToken']}"}
        ttft, _, _ = await one_chat(
            client, f"{created['url']}/openai/v1/chat/completions", body, token
        )
        elapsed = time.perf_counter() - start
        assert ttft is not None, "no content token"
        deleted = await client.delete(
            f"{serve.url}/inference/endpoints/{created['id']}", headers=headers
        )
        deleted.raise_for_status()
    return elapsed


def part_create(cluster: LocalCluster, state: Path, rounds: int, engine: str) -> dict[str, Any]:
    engine_args = "--engine fake" if engine == "fake" else "--cpu-kv-cache-gib 1"
    serves = {name: serve_for(name, cluster, state, engine_args) for name in ("local", "ray")}
    location = {"local": "local", "ray": "us-east"}
    times: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for i in range(rounds):
            order = ("local", "ray") if i % 2 == 0 else ("ray", "local")
            for name in order:
                elapsed = asyncio.run(
                    create_to_first_token(serves[name], location[name], f"b-{name}-{i}")
                )
                times[name].append(elapsed)
                print(f"  round {i} {name}: create -> first token {elapsed:.2f} s", flush=True)
    finally:
        for serve in serves.values():
            serve.stop()
    local, ray_ = statistics.median(times["local"]), statistics.median(times["ray"])
    return {"engine": engine, "seconds": times, "ratio": ray_ / local, "goal": GOAL_RATIO}


# -- 2. faults under load ---------------------------------------------------------------


class Load:
    """`concurrency` clients in a closed loop, on a thread of their own; every
    request's (start, end, ok)."""

    def __init__(self, url: str, token: str, concurrency: int) -> None:
        self.url = f"{url}/openai/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.concurrency = concurrency
        self.records: list[tuple[float, float, bool, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        body = chat_body("tiny-chat", 16, False, "Hello.")
        async with httpx.AsyncClient(timeout=60) as client:

            async def worker() -> None:
                while not self._stop:
                    start = time.monotonic()
                    try:
                        response = await client.post(self.url, json=body, headers=self.headers)
                        ok, why = response.status_code == 200, str(response.status_code)
                    except httpx.HTTPError as exc:
                        ok, why = False, type(exc).__name__
                    self.records.append((start, time.monotonic(), ok, why))

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._thread.join(60)

    def between(self, t0: float, t1: float) -> list[tuple[float, float, bool, str]]:
        return [r for r in self.records if r[0] >= t0 and r[0] < t1]


def ready(serve: ServeHandle, endpoint_id: str) -> list[str]:
    return [r["id"] for r in serve.record(endpoint_id)["replicas"] if r["status"] == "ready"]


def poll_until(predicate: Any, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError("fault not handled in time")


def actor_info(replica_id: str) -> dict[str, Any]:
    import ray

    actor = ray.get_actor(f"inferd-replica-{replica_id}", namespace=NAMESPACE)
    return dict(ray.get(actor.info.remote(), timeout=10))


def part_faults(
    cluster: LocalCluster, state: Path, load_s: float, concurrency: int
) -> list[dict[str, Any]]:
    serve = serve_for(
        "ray", cluster, state, "--engine fake --engine-arg token_delay_s=0.02 --no-warmup"
    )
    rows = []
    try:
        created = serve.create_endpoint(
            name="faults",
            modelName="tiny-chat",
            locationName="us-east",
            gpuType="H100-80GB",
            gpuCount=1,
            minReplicas=2,
            maxReplicas=2,
        )
        endpoint_id = created["id"]
        serve.wait_record(endpoint_id, lambda r: len(ready_ids(r)) == 2, timeout=120)
        load = Load(created["url"], created["accessToken"], concurrency)
        load.start()
        time.sleep(load_s)
        for fault in FAULTS:
            victim = ready(serve, endpoint_id)[0]
            where = actor_info(victim)
            hit = time.monotonic()
            if fault == "replica process SIGKILL":
                os.kill(where["pid"], signal.SIGKILL)
            elif fault == "actor SIGKILL":
                stat = procfs.process_stat(where["pid"])
                assert stat is not None
                os.kill(stat.ppid, signal.SIGKILL)
            else:
                name = next(n for n in cluster.nodes if cluster.node_id(n) == where["nodeId"])
                cluster.remove(name)
            in_flight_now = _in_flight(load, hit)
            noticed = poll_until(lambda v=victim: v not in _current(serve, endpoint_id), 60)
            back = poll_until(lambda: len(ready(serve, endpoint_id)) == 2, 120)
            time.sleep(load_s)
            window = load.between(hit - 1, time.monotonic())
            failed = [r for r in window if not r[2]]
            rows.append(
                {
                    "fault": fault,
                    "noticed_s": noticed - hit,
                    "replacement_ready_s": back - hit,
                    "requests": len(window),
                    "failed": len(failed),
                    "in_flight_at_fault": in_flight_now,
                    "failures": sorted({r[3] for r in failed}),
                }
            )
            print(f"  {rows[-1]}", flush=True)
        load.stop()
        total = len(load.records)
        print(f"  load: {total} requests, {sum(1 for r in load.records if not r[2])} failed")
    finally:
        serve.stop()
    return rows


# -- 3. node loss with two slots per node -------------------------------------------------

SLOTTED = {f"two-slot-{c}": FakeNode("us-east", None, 0, 2) for c in "ab"}


def node_loss_round(
    cluster: LocalCluster, state: Path, placement: str, seconds: float, rate: float
) -> dict[str, Any]:
    from inferd.testing import open_loop

    serve = serve_for(
        "ray",
        cluster,
        state / placement,
        "--engine fake --engine-arg token_delay_s=0.02",
        ray_placement=placement,
    )
    removed: str | None = None
    try:
        created = serve.create_endpoint(
            name=f"loss-{placement}", modelName="tiny-chat", locationName="us-east",
            gpuType="cpu", minReplicas=2, maxReplicas=2,
        )  # fmt: skip
        endpoint_id = created["id"]
        record = serve.wait_record(endpoint_id, lambda r: len(ready_ids(r)) == 2, timeout=120)
        nodes = {rid: actor_info(rid)["nodeId"] for rid in ready_ids(record)}
        lost_node = next(iter(nodes.values()))
        on_lost = sum(1 for n in nodes.values() if n == lost_node)
        url = f"{created['url']}/openai/v1/chat/completions"
        body = chat_body("tiny-chat", 16, False, "Hello.")
        results: list[tuple[float, int, float]] = []
        loading = threading.Thread(
            target=lambda: results.extend(
                asyncio.run(open_loop([url], created["accessToken"], body, rate, seconds))
            )
        )
        loading.start()
        time.sleep(seconds / 4)
        removed = next(n for n in cluster.nodes if cluster.node_id(n) == lost_node)
        hit = time.monotonic()
        cluster.remove(removed)
        back = poll_until(
            lambda: (
                len(ready(serve, endpoint_id)) == 2
                and not set(ready(serve, endpoint_id))
                & {r for r, n in nodes.items() if n == lost_node}
            ),
            180,
        )
        loading.join()
        failed = [r for r in results if r[1] != 200]
        return {
            "placement": placement,
            "replicas_on_lost_node": on_lost,
            "requests": len(results),
            "failed": len(failed),
            "failures": sorted({str(r[1]) for r in failed}),
            "back_to_full_s": back - hit,
            "slowest_s": max(r[2] for r in results),
        }
    finally:
        serve.stop()
        if removed is not None:
            cluster.add(removed, SLOTTED[removed])


def part_node_loss(state: Path, rounds: int, seconds: float, rate: float) -> list[dict[str, Any]]:
    cluster = start_cluster(SLOTTED)
    rows = []
    try:
        for i in range(rounds):
            order = ("spread", "pack") if i % 2 == 0 else ("pack", "spread")
            for placement in order:
                row = node_loss_round(cluster, state / f"loss-{i}", placement, seconds, rate)
                rows.append(row)
                print(f"  round {i}: {row}", flush=True)
    finally:
        cluster.shutdown()
    return rows


def _in_flight(load: Load, at: float) -> int:
    """Requests started before `at` that had not ended then (read once they
    end; an approximation from the client's side)."""
    time.sleep(0.5)
    started = [r for r in load.records if r[0] < at and r[1] > at]
    return len(started)


def _current(serve: ServeHandle, endpoint_id: str) -> list[str]:
    return [r["id"] for r in serve.record(endpoint_id)["replicas"]]


def ready_ids(record: dict[str, Any]) -> list[str]:
    return [r["id"] for r in record["replicas"] if r["status"] == "ready"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine", choices=("vllm", "fake"), default="vllm")
    parser.add_argument("--load-seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--skip-create", action="store_true")
    parser.add_argument("--skip-faults", action="store_true")
    parser.add_argument("--node-loss", action="store_true", help="part 3 (its own cluster)")
    parser.add_argument("--node-loss-rounds", type=int, default=1)
    parser.add_argument("--node-loss-seconds", type=float, default=40.0)
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(load_average(), flush=True)
    report: dict[str, Any] = {"nodes": {n: vars(s) for n, s in NODES.items()}}
    if args.node_loss:
        with tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp:
            report["node_loss"] = part_node_loss(
                Path(tmp), args.node_loss_rounds, args.node_loss_seconds, args.rate
            )
        report["node_loss_nodes"] = {n: vars(s) for n, s in SLOTTED.items()}
    if args.skip_create and args.skip_faults:
        return _print_report(report, args)
    started = time.monotonic()
    cluster = start_cluster(NODES)
    print(f"cluster of {len(NODES)} nodes up in {time.monotonic() - started:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp:
        try:
            if not args.skip_create:
                report["create"] = part_create(cluster, Path(tmp), args.rounds, args.engine)
            if not args.skip_faults:
                report["faults"] = part_faults(
                    cluster, Path(tmp), args.load_seconds, args.concurrency
                )
        finally:
            cluster.shutdown()
    return _print_report(report, args)


def _print_report(report: dict[str, Any], args: argparse.Namespace) -> int:
    if "create" in report:
        c = report["create"]
        print_table("create -> first token", create_rows(c), CREATE_COLUMNS)
        verdict = "met" if c["ratio"] <= GOAL_RATIO else "NOT met"
        print(f"ray / local = {c['ratio']:.3f} (goal <= {GOAL_RATIO}: {verdict})")
    if "faults" in report:
        print_table("faults under load (2 replicas, closed loop)", report["faults"], FAULT_COLUMNS)
    if "node_loss" in report:
        print_table(
            "node loss, two CPU slots per node (2 replicas, open loop)",
            report["node_loss"],
            NODE_LOSS_COLUMNS,
        )
    print(load_average())
    write_report("ray_placement", result_of(report, args), args.out)
    return 0


def create_rows(create: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "launcher": name,
            "engine": create["engine"],
            "rounds": len(create["seconds"][name]),
            "median_s": statistics.median(create["seconds"][name]),
            "min_s": min(create["seconds"][name]),
            "max_s": max(create["seconds"][name]),
        }
        for name in ("local", "ray")
    ]


def create_goal(create: dict[str, Any] | None, engine: str) -> dict[str, Any]:
    name = f"create -> first token ({engine} engine): ray median / local median"
    target = f"<= {GOAL_RATIO}x"
    if create is None:
        return not_measured(name, target, "part 1 not run (--skip-create)")
    met = create["ratio"] <= GOAL_RATIO
    why = "" if met else "a replica through Ray took longer to its first token than a local one"
    return goal(name, target, round(create["ratio"], 3), met, why)


def fault_goals(faults: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """One goal per fault. The client cannot tell which replica a request was
    on, so every request in flight at the fault is allowed to fail: the
    bound is those on either replica, not only the lost one's."""

    def name(fault: str) -> str:
        return f"{fault}: requests failed under load"

    if faults is None:
        why = "part 2 not run (--skip-faults)"
        return [not_measured(name(f), "<= those in flight at the fault", why) for f in FAULTS]
    goals = []
    for row in faults:
        failed, in_flight = row["failed"], row["in_flight_at_fault"]
        target = f"<= {in_flight} (in flight at the fault)"
        why = ""
        if failed > in_flight:
            why = f"{failed} of {row['requests']} failed: {', '.join(row['failures'])}"
        goals.append(goal(name(row["fault"]), target, failed, failed <= in_flight, why))
    return goals


def node_loss_goals(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Spread's two, over its rounds; pack is the reference, not judged."""
    failed_name = "node loss, spread placement: failed requests"
    lost_name = "node loss, spread placement: replicas on the lost node"
    lost_target = "<= 1 of 2 (never every replica)"
    spread = [r for r in rows or [] if r["placement"] == "spread"]
    if not spread:
        why = "part 3 not run (run with --node-loss)"
        if rows is not None:
            why = "no spread round (--node-loss-rounds 0)"
        return [not_measured(failed_name, "0", why), not_measured(lost_name, lost_target, why)]
    failed = sum(r["failed"] for r in spread)
    sent = sum(r["requests"] for r in spread)
    failures = sorted({f for r in spread for f in r["failures"]})
    most = max(r["replicas_on_lost_node"] for r in spread)
    failed_why = f"{failed} of {sent} failed ({', '.join(failures)})" if failed else ""
    lost_why = "" if most < 2 else "Ray put both replicas on the lost node"
    return [
        goal(failed_name, "0", failed, failed == 0, failed_why),
        goal(lost_name, lost_target, most, most < 2, lost_why),
    ]


def workload(report: dict[str, Any], args: argparse.Namespace) -> str:
    parts = [f"local Ray clusters on {NODE_IP}"]
    if "create" in report:
        parts.append(
            f"create -> first token: tiny-chat on {args.engine}, a CPU endpoint created "
            f"with one streamed 8-token chat sent at once, {args.rounds} rounds alternating "
            "the local and the ray launcher; a head without work and three us-east nodes "
            "(one fake H100 and one CPU slot each)"
        )
    if "faults" in report:
        parts.append(
            "faults: fake engine, two 1-GPU replicas on two of those nodes, a closed loop of "
            f"{args.concurrency} clients, {args.load_seconds:g} s of load before the first "
            "fault and after each replacement"
        )
    if "node_loss" in report:
        parts.append(
            "node loss: two us-east nodes with two CPU slots each, two fake-engine replicas, "
            f"an open loop of {args.rate:g} requests/s for {args.node_loss_seconds:g} s, the "
            "first replica's node removed a quarter of the way in; "
            f"{args.node_loss_rounds} rounds alternating spread and pack (the reference)"
        )
    return "; ".join(parts)


def result_of(report: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The result file: the parts that ran as tables, every part's goals
    (those of a part not run as not measured), the raw figures kept."""
    tables = []
    if "create" in report:
        rows = create_rows(report["create"])
        tables.append(table("Create -> first token (seconds)", CREATE_COLUMNS, rows))
    if "faults" in report:
        columns = [*FAULT_COLUMNS, "failures"]
        tables.append(
            table("Faults under load (seconds from the fault)", columns, report["faults"])
        )
    if "node_loss" in report:
        columns = [*NODE_LOSS_COLUMNS, "failures"]
        tables.append(table("Node loss, two CPU slots per node", columns, report["node_loss"]))
    return {
        "title": "Ray launcher: create -> first token against local processes, faults under "
        "load, node loss",
        "workload": workload(report, args),
        "config": vars(args) | {"out": str(args.out)},
        "tables": tables,
        "goals": [
            create_goal(report.get("create"), args.engine),
            *fault_goals(report.get("faults")),
            *node_loss_goals(report.get("node_loss")),
        ],
        "notes": [
            "Faults: `noticed_s` is the fault to the replica leaving the record, "
            "`replacement_ready_s` to two ready replicas again; `requests` and `failed` count "
            "the requests started from 1 s before the fault to the end of the load after the "
            "replacement; `in_flight_at_fault` every request in flight then, on either "
            "replica, as the client saw it.",
            "Node loss: `back_to_full_s` is the removal to two ready replicas, none on the "
            "lost node; `slowest_s` the slowest answer of the run.",
        ],
        **report,
    }


if __name__ == "__main__":
    sys.exit(main())
