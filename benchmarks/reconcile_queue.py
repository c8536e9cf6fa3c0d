"""What one change costs the reconciler with many endpoints.

N endpoints (1,000 by default) in a real SQLite store; a tenth of them keep
one replica (a fake launcher: no processes, so the figure is the control
plane's own work). One change is one endpoint rung (a request held, an
endpoint updated). Side by side in the same run, alternating:

- reference (before): the pass every wake used to make, every endpoint,
  read from the store's table (`tick()` with `store.list_endpoints`);
- work queue (after): the pass a wake makes now, the endpoint that changed,
  read from the change-fed copy (`tick({id})` with `FollowedEndpoints`);
- periodic sweep (after): what the reconciler still does every period
  without any change, the endpoints whose decisions move with the clock
  (here the ones with a replica).

Each pass is timed from its start to its end; "looked at" counts the
endpoints reconciled in it.

    .venv/bin/python benchmarks/reconcile_queue.py [--endpoints 1000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import ms, percentile, print_table, write_report
from results_format import table

from inferd.control.endpoints.endpoint_rows import FollowedEndpoints
from inferd.control.fakes import FakeLauncher, FakeLoad
from inferd.control.model import Endpoint
from inferd.control.replicas.reconciler import Reconciler, ReconcilerSettings
from inferd.control.replicas.registry import Registry
from inferd.control.stores import open_store
from inferd.replica.config import ModelSource
from inferd.vocab import ModelKind

NOW = datetime.now(UTC)
T0 = Endpoint(
    id="", name="", model_name="tiny-chat", model_kind="chat", gpu_type="cpu", gpu_count=1,
    location_name="local", min_replicas=0, max_replicas=2, retention_seconds=60,
    hourly_price=0.0, currency="USD", created_at=NOW, updated_at=NOW,
)  # fmt: skip
COLUMNS = ["pass", "looked at", "p50 ms", "p99 ms", "mean ms", "vs reference"]


class Looks:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, row: Any, desired: int, rows: Any) -> tuple[int, str | None]:
        self.count += 1
        return desired, None


def reconciler(endpoints: Any, launcher: FakeLauncher, looks: Looks) -> Reconciler:
    load = FakeLoad()
    return Reconciler(
        registry=Registry(),
        launcher=launcher,
        load=load,
        aborter=load,
        endpoints=endpoints,
        models=lambda name: ModelSource(name, ModelKind.CHAT, f"builtin:{name}"),
        settings=ReconcilerSettings(),
        replica_cap=looks,
    )


async def timed(plane: Reconciler, looks: Looks, only: set[str] | None) -> dict[str, float]:
    """Seconds of one pass, and how many endpoints it looked at."""
    looks.count = 0
    start = time.perf_counter()
    await plane.tick(only)
    return {"s": time.perf_counter() - start, "looked": looks.count}


async def run(n: int, rounds: int, state_dir: Path) -> dict[str, Any]:
    # Through `open_store`: the same code runs against an older checkout (benchmarks/store.py).
    store = open_store(f"sqlite:///{state_dir / 'state.db'}")
    ids = []
    for i in range(n):
        row = replace(T0, id=str(uuid.uuid4()), name=f"e{i}", min_replicas=1 if i % 10 == 0 else 0)
        await store.insert_endpoint(row, i.to_bytes(32, "big"))
        ids.append(row.id)
    copy = FollowedEndpoints(store, lambda endpoint_id: None)
    await copy.load()
    ref_looks, our_looks = Looks(), Looks()
    reference = reconciler(store.list_endpoints, FakeLauncher(slots=n), ref_looks)
    ours = reconciler(copy, FakeLauncher(slots=n), our_looks)
    # Both start from the same state: the replicas the endpoints keep.
    await reference.tick()
    await ours.tick()
    samples: dict[str, list[dict[str, float]]] = {"reference": [], "queue": [], "sweep": []}
    for r in range(rounds):
        changed = ids[(r * 37) % n]
        order = ["reference", "queue"] if r % 2 == 0 else ["queue", "reference"]
        for name in order:
            if name == "reference":
                samples[name].append(await timed(reference, ref_looks, None))
            else:
                samples[name].append(await timed(ours, our_looks, {changed}))
        clocked = {replica.endpoint_id for replica in ours.registry.all()}
        samples["sweep"].append(await timed(ours, our_looks, clocked))
    await store.close()
    labels = {
        "reference": "reference: full pass per change (store read)",
        "queue": "work queue: the changed endpoint (change-fed copy)",
        "sweep": "work queue: periodic sweep, no change (clock-moved endpoints)",
    }
    rows = []
    for name, runs in samples.items():
        seconds = [s["s"] for s in runs]
        rows.append(
            {
                "pass": labels[name],
                "looked at": int(statistics.mean(s["looked"] for s in runs)),
                "p50 ms": ms(percentile(seconds, 50)),
                "p99 ms": ms(percentile(seconds, 99)),
                "mean ms": ms(statistics.mean(seconds)),
            }
        )
    ref_p50 = rows[0]["p50 ms"]
    rows[1]["vs reference"] = round(ref_p50 / rows[1]["p50 ms"], 1) if rows[1]["p50 ms"] else None
    return {"endpoints": n, "rounds": rounds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run(args.endpoints, args.rounds, Path(tmp)))
    print_table(
        f"reconcile cost per change, {args.endpoints} endpoints, {args.rounds} changes",
        report["rows"],
        COLUMNS,
    )
    print(write_report("reconcile_queue", build_report(args, report)))


def build_report(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    """The run as a result file (`results_format`): the printed table, and no
    goal, since neither the docstring nor benchmarks/README.md bounds a figure;
    the raw `endpoints`, `rounds` and `rows` are kept."""
    # Only the work queue's row has a `vs reference`; the others state theirs as empty.
    rows = [{column: row.get(column) for column in COLUMNS} for row in measured["rows"]]
    return {
        **measured,
        "title": "Reconciler: what one change costs with many endpoints (reconcile_queue)",
        "workload": f"{args.endpoints} endpoints in a SQLite store, a tenth keeping one replica "
        f"of a fake launcher (no processes); {args.rounds} changes, one endpoint each, the "
        "reference's and the work queue's passes alternating, each followed by a periodic "
        "sweep; every pass timed from its start to its end",
        "tables": [table("One pass of the reconciler", COLUMNS, rows)],
        "goals": [],
        "notes": [
            "This benchmark states no goal: neither its docstring nor benchmarks/README.md "
            "bounds a figure. `vs reference`: the reference's p50 over the work queue's (how "
            "many times faster); `looked at`: the endpoints reconciled in one pass.",
        ],
    }


if __name__ == "__main__":
    main()
