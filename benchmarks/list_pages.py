"""Endpoint list pages against the whole list, at 10,000 endpoints, on SQLite and PostgreSQL.

The reference is inferd as it was before lists had pages (the commit before
`inferd/server/paging.py` appeared, unpacked with `git archive`), which
answers `GET /inference/endpoints` with every record in one body. inferd
now answers pages, read by keyset from the database. Both serve the very
same endpoints (one population, copied: the SQLite file, a PostgreSQL
template database), each in its own uvicorn process on loopback, with the
operator key. One client calls them one request at a time (latency, not
throughput), cases interleaved round by round so that load from elsewhere
on the machine hits them alike:

- reference: whole list (10,000 records)
- first page, limit=100 / default limit (1000)
- a later page: limit=100 after 5,000 endpoints (its cursor from a walk)
- a filtered first page: modelName=tiny-sdxl (half the endpoints), limit=100

Before timing, the first page's records are checked to be the reference's
first records, field by field (but the cost, which moves with the clock).

    .venv/bin/python benchmarks/list_pages.py [--endpoints 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from common import load_average, percentile, print_table, wait_http_ok, write_report
from results_format import table

ADMIN_KEY = "bench-admin-key-0123456789"
PUBLIC_URL = "http://127.0.0.1:8080"
ROOT = Path(__file__).resolve().parent.parent
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
COLUMNS = ["backend", "case", "items", "bytes", "p50_ms", "p95_ms", "requests",
           "p50_vs_whole_list"]  # fmt: skip


# --- child processes ---------------------------------------------------------------------


def settings(state_dir: str, database_url: str | None) -> Any:
    from inferd.settings import load_settings

    overrides = {"state_dir": state_dir, "admin_key": ADMIN_KEY, "public_url": PUBLIC_URL,
                 "database_url": database_url}  # fmt: skip
    return load_settings(env={}, overrides=overrides)


def serve(state_dir: str, database_url: str | None, port: int) -> None:
    import uvicorn

    from inferd.control.fakes import FakeLauncher
    from inferd.server.app import create_app
    from inferd.server.compose import build

    # Management reads only: no replica is ever started.
    plane = asyncio.run(
        build(settings(state_dir, database_url), launcher=FakeLauncher(), run_replicas=False)
    )
    uvicorn.run(
        create_app(plane), host="127.0.0.1", port=port, access_log=False, log_level="warning"
    )


async def populate(state_dir: str, database_url: str | None, count: int) -> None:
    """`count` endpoints, straight into the store (the API's create would
    also work, minutes slower): half tiny-chat, half tiny-sdxl."""
    from datetime import UTC, datetime, timedelta

    from inferd.control.model import Endpoint
    from inferd.control.stores import open_store

    url = database_url or f"sqlite:///{Path(state_dir) / 'inferd.db'}"
    store = open_store(url)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        for i in range(count):
            image = i % 2 == 1
            at = t0 + timedelta(seconds=i)
            row = Endpoint(
                id=f"00000000-0000-4000-8000-{i:012d}", name=f"bench-{i:05d}",
                model_name="tiny-sdxl" if image else "tiny-chat",
                model_kind="image" if image else "chat", gpu_type="cpu", gpu_count=1,
                location_name="local", min_replicas=0, max_replicas=2, retention_seconds=600,
                hourly_price=0.45, currency="USD", created_at=at, updated_at=at,
            )  # fmt: skip
            await store.insert_endpoint(row, i.to_bytes(32, "big"))
    finally:
        await store.close()


# --- the run -------------------------------------------------------------------------------


@dataclass
class Case:
    label: str
    server: str  # which server answers it
    path: str
    per_round: int
    latency_s: list[float] = field(default_factory=list)
    bytes: int = 0
    items: int = 0


def reference_tree(rev: str | None, into: Path) -> str:
    """inferd at the commit before pages, unpacked into `into`; its commit."""
    if rev is None:
        added = subprocess.run(
            ["git", "log", "--format=%H", "--diff-filter=A", "-1", "--",
             "inferd/server/paging.py"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        if not added:
            raise SystemExit("cannot find the commit that added pages; pass --reference-rev")
        rev = f"{added}^"
    commit = subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit, "inferd", "configs", "models"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def child(code_dir: Path, *argv: str) -> list[str]:
    return [sys.executable, __file__, *argv]


def child_env(code_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code_dir)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--page-requests", type=int, default=40, help="per case and round")
    parser.add_argument("--full-requests", type=int, default=4, help="per round (the whole list)")
    parser.add_argument("--reference-rev", help="the reference's commit (default: before pages)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--populate", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.state, args.database_url, args.port)
        return 0
    if args.populate is not None:
        Path(args.state).mkdir(parents=True, exist_ok=True)
        asyncio.run(populate(args.state, args.database_url, args.populate))
        return 0

    from inferd.testing import free_port
    from inferd.testing.postgres import start_postgres

    postgres = start_postgres()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="inferd-pages-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            ref_dir = tmp / "reference"
            ref_commit = reference_tree(args.reference_rev, ref_dir)
            t0 = time.perf_counter()
            # One population, by the reference's code (the older schema; the
            # new server migrates its copies on start).
            ref_pg = postgres.create_database("ref")
            for database_url in (None, ref_pg):
                subprocess.run(
                    child(ref_dir, "--populate", str(args.endpoints), "--state",
                          str(tmp / "ref-sqlite"),
                          *(["--database-url", database_url] if database_url else [])),
                    env=child_env(ref_dir), check=True,
                )  # fmt: skip
            shutil.copytree(tmp / "ref-sqlite", tmp / "new-sqlite")
            import psycopg

            with psycopg.connect(postgres.url(), autocommit=True) as conn:
                conn.execute('CREATE DATABASE "new" TEMPLATE "ref"')
            new_pg = postgres.url("new")
            print(f"stored {args.endpoints} endpoints in {time.perf_counter() - t0:.1f}s")

            servers = {
                "sqlite reference": (ref_dir, tmp / "ref-sqlite", None),
                "sqlite inferd": (ROOT, tmp / "new-sqlite", None),
                "postgres reference": (ref_dir, tmp / "ref-pg-state", ref_pg),
                "postgres inferd": (ROOT, tmp / "new-pg-state", new_pg),
            }
            urls: dict[str, str] = {}
            for name, (code_dir, state, database_url) in servers.items():
                port = free_port()
                argv = ["--serve", "--state", str(state), "--port", str(port)]
                if database_url:
                    argv += ["--database-url", database_url]
                proc = subprocess.Popen(child(code_dir, *argv), env=child_env(code_dir))
                procs.append(proc)
                urls[name] = f"http://127.0.0.1:{port}"
                wait_http_ok(urls[name] + "/healthz", proc, 120)

            rows = measure(args, urls)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)
            postgres.destroy()

    print_table(
        f"GET /inference/endpoints at {args.endpoints} endpoints, one request at a time "
        f"({load_average()})",
        rows,
        COLUMNS,
    )
    write_report("list_pages", build_report(args, ref_commit, rows), args.out)
    return 0


def build_report(
    args: argparse.Namespace, ref_commit: str, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The run as a result file (`results_format`): the printed table, and no
    goal, since neither the docstring nor benchmarks/README.md bounds a figure;
    the raw `endpoints`, `reference_commit` and `rows` are kept."""
    return {
        "title": f"Endpoint list pages against the whole list, {args.endpoints} endpoints, "
        "SQLite and PostgreSQL (list_pages)",
        "workload": f"{args.endpoints} endpoints (half tiny-chat, half tiny-sdxl), one "
        "population copied to every server; reference: inferd before pages (commit "
        f"{ref_commit[:12]}), the whole list in one body; one client, one request at a time, "
        f"{args.rounds} rounds with the cases interleaved: {args.page_requests} requests per "
        f"round of each limit=100 page, {args.full_requests} of the whole list, "
        f"{args.full_requests * 2} of the default page",
        "tables": [table("GET /inference/endpoints, one request at a time", COLUMNS, rows)],
        "goals": [],
        "notes": [
            "This benchmark states no goal: its docstring names none, and benchmarks/README.md's "
            "aim (a page far below the whole list; a later page as fast as the first) sets no "
            "bound to judge a run by. `p50_vs_whole_list` is a case's median over the whole "
            "list's, on the same backend.",
        ],
        "endpoints": args.endpoints,
        "reference_commit": ref_commit,
        "rows": rows,
    }


def measure(args: argparse.Namespace, urls: dict[str, str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with httpx.Client(headers=HEADERS, timeout=120) as client:
        cases: list[Case] = []
        for backend in ("sqlite", "postgres"):
            ref, new = urls[f"{backend} reference"], urls[f"{backend} inferd"]
            whole = client.get(ref + "/inference/endpoints").json()["data"]
            assert len(whole) == args.endpoints, len(whole)
            first = client.get(new + "/inference/endpoints", params={"limit": 100}).json()
            # By id: the reference is an older inferd, whose records lack
            # the fields added since.
            assert [r["id"] for r in first["data"]] == [r["id"] for r in whole[:100]], (
                f"{backend}: the first page is not the whole list's start"
            )
            # A cursor 5,000 endpoints in (the cursor does not depend on the limit).
            cursor, seen = None, 0
            while seen < args.endpoints // 2:
                params = {"limit": 1000, **({"continue": cursor} if cursor else {})}
                page = client.get(new + "/inference/endpoints", params=params).json()
                seen, cursor = seen + len(page["data"]), page["continue"]
            later = client.get(
                new + "/inference/endpoints", params={"limit": 100, "continue": cursor}
            ).json()["data"]
            assert [r["id"] for r in later] == [r["id"] for r in whole[seen : seen + 100]]
            cases += [
                Case(f"{backend}|reference: whole list", ref, "/inference/endpoints",
                     args.full_requests),
                Case(f"{backend}|first page, limit=100", new, "/inference/endpoints?limit=100",
                     args.page_requests),
                Case(f"{backend}|page after {seen}, limit=100", new,
                     f"/inference/endpoints?limit=100&continue={cursor}", args.page_requests),
                Case(f"{backend}|first page, default limit", new, "/inference/endpoints",
                     args.full_requests * 2),
                Case(f"{backend}|first page, modelName=tiny-sdxl, limit=100", new,
                     "/inference/endpoints?modelName=tiny-sdxl&limit=100", args.page_requests),
            ]  # fmt: skip
        for case in cases:  # warm-up: caches, connections
            client.get(case.server + case.path)
        for _ in range(args.rounds):
            for case in cases:
                for _ in range(case.per_round):
                    start = time.perf_counter()
                    resp = client.get(case.server + case.path)
                    body = resp.content
                    case.latency_s.append(time.perf_counter() - start)
                    assert resp.status_code == 200, resp.text[:200]
                case.bytes = len(body)
                case.items = len(resp.json()["data"])
    reference_p50: dict[str, float] = {}
    for case in cases:
        backend, label = case.label.split("|")
        p50 = percentile(case.latency_s, 50) or 0.0
        if label.startswith("reference"):
            reference_p50[backend] = p50
        rows.append({
            "backend": backend, "case": label, "items": case.items, "bytes": case.bytes,
            "p50_ms": round(p50 * 1000, 2),
            "p95_ms": round((percentile(case.latency_s, 95) or 0) * 1000, 2),
            "requests": len(case.latency_s),
            "p50_vs_whole_list": round(p50 / reference_p50[backend], 4),
        })  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
