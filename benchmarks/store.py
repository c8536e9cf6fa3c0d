"""The store's own cost, before and after a change to it, in one run.

Endpoint create / get / list / patch / delete through the store port, on a
SQLite file and on a PostgreSQL database (a throw-away server), each timed
one call at a time: calls per second and p99 latency. Then the reconciler's
cost per change with N endpoints (`reconcile_queue.run`, on SQLite). "Before"
is the same measurement with another checkout's `inferd` (a worktree of the
commit before the change); each measurement runs in its own process,
before and after alternating, `--rounds` times each; a figure is the median
over its rounds.

    git worktree add --detach /tmp/inferd-before <commit>
    .venv/bin/python benchmarks/store.py --before /tmp/inferd-before [--endpoints 1000] [--rounds 3]

On the project's shared 2-core machine the figures move with the others'
load (stated with each result); compare before and after within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from common import ms, percentile, print_table, write_report
from results_format import goal, table

HERE = Path(__file__).resolve().parent
OPS = ("create", "get", "list", "patch", "delete")
GOAL_RATIO = 0.9  # no operation slower by more than 10 %
RECONCILE_COLUMNS = ["code", "pass", "looked at", "p50 ms", "p99 ms"]


async def timed(samples: list[float], call: Callable[..., Awaitable[Any]], *args: Any) -> None:
    start = time.perf_counter()
    await call(*args)
    samples.append(time.perf_counter() - start)


async def measure(url: str, n: int, calls: int) -> dict[str, Any]:
    """One process's figures on the store at `url` (any checkout's `inferd`)."""
    from inferd.control.model import Endpoint, EndpointChanges
    from inferd.control.stores import open_store

    now = datetime.now(UTC).replace(microsecond=0)
    template = Endpoint(
        id="", name="", model_name="tiny-chat", model_kind="chat", gpu_type="cpu",
        gpu_count=1, location_name="local", min_replicas=0, max_replicas=2,
        retention_seconds=60, hourly_price=0.5, currency="USD", created_at=now, updated_at=now,
    )  # fmt: skip
    store = open_store(url)
    samples: dict[str, list[float]] = {op: [] for op in OPS}
    ids: list[str] = []
    for i in range(n):
        row = replace(template, id=str(uuid.uuid4()), name=f"e{i}")
        await timed(samples["create"], store.insert_endpoint, row, i.to_bytes(32, "big"))
        ids.append(row.id)
    rng = random.Random(7)
    for i in range(calls):
        endpoint_id = rng.choice(ids)
        await timed(samples["get"], store.get_endpoint, endpoint_id)
        changes = EndpointChanges(updated_at=now + timedelta(seconds=i), max_replicas=2 + i % 3)
        await timed(samples["patch"], store.update_endpoint, endpoint_id, changes)
    for _ in range(max(calls // 20, 5)):
        await timed(samples["list"], store.list_endpoints)
    for endpoint_id in ids[:calls]:
        await timed(samples["delete"], store.delete_endpoint, endpoint_id)
    await store.close()
    return {
        op: {"per_s": round(len(s) / sum(s), 1), "p99_ms": ms(percentile(s, 99))}
        for op, s in samples.items()
    }


def worker(args: argparse.Namespace) -> None:
    if args.url == "reconcile":
        sys.path.insert(0, str(HERE))
        import reconcile_queue

        with tempfile.TemporaryDirectory() as tmp:
            report = asyncio.run(reconcile_queue.run(args.endpoints, args.calls, Path(tmp)))
        print(json.dumps({"reconcile": {row["pass"]: row for row in report["rows"]}}))
        return
    print(json.dumps(asyncio.run(measure(args.url, args.endpoints, args.calls))))


def run_in(checkout: Path, url: str, n: int, calls: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(HERE / "store.py"), "--worker", "--url", url,
               "--endpoints", str(n), "--calls", str(calls)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=False, help="a checkout of the code before")
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=500, help="gets, patches and deletes per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from inferd.testing.postgres import start_postgres

    after = HERE.parent
    trees = {"before": args.before, "after": after} if args.before else {"after": after}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    server = start_postgres()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                names = list(trees) if r % 2 == 0 else list(reversed(trees))
                for engine in ("sqlite", "postgres", "reconcile"):
                    for name in names:
                        if engine == "sqlite":
                            url = f"sqlite:///{tmp}/{name}-{r}.db"
                        elif engine == "postgres":
                            url = server.create_database()
                        else:
                            url = "reconcile"
                        calls = 100 if engine == "reconcile" else args.calls
                        runs.setdefault((engine, name), []).append(
                            run_in(trees[name], url, args.endpoints, calls)
                        )
    finally:
        server.destroy()
    report = summarise(runs, trees, args)
    print(write_report("store", report))


def judged(name: str, ratio: float) -> dict[str, Any]:
    met = ratio >= GOAL_RATIO
    why = "" if met else "slower after than before by more than 10 % in the median of the rounds"
    return goal(name, f">= {GOAL_RATIO}", round(ratio, 2), met, why)


def summarise(
    runs: dict[tuple[str, str], list[dict[str, Any]]], trees: dict[str, Any], args: Any
) -> dict[str, Any]:
    def median(engine: str, name: str, op: str, figure: str) -> float:
        return statistics.median(run[op][figure] for run in runs[(engine, name)])

    rows, goals = [], []
    for engine in ("sqlite", "postgres"):
        for op in OPS:
            row: dict[str, Any] = {"engine": engine, "operation": op}
            for name in trees:
                row[f"{name} /s"] = median(engine, name, op, "per_s")
                row[f"{name} p99 ms"] = median(engine, name, op, "p99_ms")
            if "before" in trees:
                ratio = row["after /s"] / row["before /s"]
                row["after / before"] = round(ratio, 2)
                goals.append(judged(f"{engine} {op}: calls per second, after / before", ratio))
            rows.append(row)
    recon_rows = []
    for name in trees:
        for label, figures in runs[("reconcile", name)][0]["reconcile"].items():
            recon_rows.append({
                "code": name, "pass": label, "looked at": figures["looked at"],
                "p50 ms": statistics.median(
                    run["reconcile"][label]["p50 ms"] for run in runs[("reconcile", name)]),
                "p99 ms": statistics.median(
                    run["reconcile"][label]["p99 ms"] for run in runs[("reconcile", name)]),
            })  # fmt: skip
    if "before" in trees:
        queue = {
            r["code"]: r["p50 ms"] for r in recon_rows if r["pass"].startswith("work queue: the")
        }
        ratio = queue["before"] / queue["after"]
        goals.append(judged("reconcile per change (work queue, p50): before / after", ratio))
    columns = ["engine", "operation"] + [f"{n} {f}" for n in trees for f in ("/s", "p99 ms")]
    if "before" in trees:
        columns.append("after / before")
    print_table("store calls, one at a time (median of rounds)", rows, columns)
    print_table(
        "reconcile cost per change", recon_rows, ["code", "pass", "looked at", "p50 ms", "p99 ms"]
    )
    return {
        "title": "Store: endpoint calls and reconcile cost, before and after",
        "workload": f"{args.endpoints} endpoints, {args.calls} gets/patches/deletes, "
        f"{args.rounds} rounds alternating before/after, one process per run; before: "
        f"{_commit(trees.get('before')) or 'none'}; a shared machine under the others' load "
        "(the load average above), so the ratios matter, not the absolute figures",
        "tables": [
            table("Endpoint calls, one at a time (median of rounds)", columns, rows),
            table(
                "Reconcile cost per change (SQLite)",
                ["code", "pass", "looked at", "p50 ms", "p99 ms"],
                recon_rows,
            ),
        ],
        "goals": goals,
        "before": str(trees.get("before") or ""),
        "before_commit": _commit(trees.get("before")),
        "runs": [{"engine": e, "code": n, "figures": f} for (e, n), fs in runs.items() for f in fs],
    }


def _commit(checkout: Path | None) -> str:
    if checkout is None:
        return ""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip()


if __name__ == "__main__":
    main()
