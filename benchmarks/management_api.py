"""Management API read path against a bare Starlette handler, side by side.

With N endpoints stored (1,000 by default), `GET /inference/endpoints/{id}`
and `GET /inference/endpoints` are served by:

- inferd: the real app (`inferd.server.app.create_app`) on its SQLite file,
  admin-key auth included;
- inferd (user key): the SQLite server again, called with a project
  member's management key instead of the operator key, so that the principal
  resolution and the project and role checks are on the path;
- inferd-pg: the same app on PostgreSQL (a throwaway server started here,
  see `inferd.testing.postgres`), holding the very same endpoints;
- bare: a Starlette app with no auth that returns the very same JSON
  documents from a dict in memory.

Each runs in its own uvicorn process (same loop and HTTP implementation, no
access log) on loopback; one closed-loop async httpx client drives them in
turn, each pass bounded by a request count and a duration, rounds
interleaved. Goals: inferd's rate at least 0.5 of the bare handler's, and
on PostgreSQL at least 0.8 of its rate on SQLite (reads come from the
memory the change feed keeps fresh, not from the database), and with a user
key at least 0.9 of the operator key's on get-by-id.

    .venv/bin/python benchmarks/management_api.py [--endpoints 1000] [--duration 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import LoadResult, percentile, print_table, wait_http_ok, write_report

from inferd.testing import free_port
from inferd.testing.postgres import start_postgres

ADMIN_KEY = "bench-admin-key-0123456789"
# Records embed it (url, exampleCommand); fixed so both servers' JSON agree.
PUBLIC_URL = "http://127.0.0.1:8080"


# --- servers (run in child processes) ------------------------------------------------


def _uvicorn(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, access_log=False, log_level="warning")


def serve_inferd(state_dir: str, port: int, database_url: str | None) -> None:
    from inferd.control.fakes import FakeLauncher
    from inferd.server.app import create_app
    from inferd.server.compose import build

    # Management reads only: no replica is ever started.
    plane = asyncio.run(
        build(inferd_settings(state_dir, database_url), launcher=FakeLauncher(), run_replicas=False)
    )
    _uvicorn(create_app(plane), port)


def bare_app(records: list[dict[str, Any]]) -> Any:
    """The reference: the same documents from memory, no auth, no store."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    by_id = {r["id"]: r for r in records}

    async def get_one(request: Request) -> Response:
        return JSONResponse(by_id[request.path_params["id"]])

    async def get_all(request: Request) -> Response:
        return JSONResponse({"data": records})

    return Starlette(
        routes=[
            Route("/inference/endpoints", get_all),
            Route("/inference/endpoints/{id}", get_one),
        ]
    )


def serve_bare(data_file: str, port: int) -> None:
    _uvicorn(bare_app(json.loads(Path(data_file).read_text())), port)


def inferd_settings(state_dir: str, database_url: str | None = None) -> Any:
    from inferd.settings import load_settings

    return load_settings(
        env={},
        overrides={
            "state_dir": state_dir,
            "admin_key": ADMIN_KEY,
            "public_url": PUBLIC_URL,
            "database_url": database_url,
        },
    )


# --- setup ---------------------------------------------------------------------------


async def _populate(state_dir: str, count: int) -> tuple[list[dict[str, Any]], str]:
    """The stored endpoints' records, and a management key of a developer of
    their project."""
    from inferd.api.management import CreateEndpointRequest
    from inferd.control.accounts.model import DEFAULT_PROJECT
    from inferd.control.accounts.roles import OPERATOR, Role
    from inferd.control.fakes import FakeLauncher
    from inferd.server.compose import build

    plane = await build(inferd_settings(state_dir), launcher=FakeLauncher(), run_replicas=False)
    try:
        _, created = await plane.accounts.service.put_member(
            OPERATOR, DEFAULT_PROJECT, "bench-user", Role.DEVELOPER
        )
        assert created is not None
        models = [m.name for m in plane.catalog.models.all() if m.name.startswith("tiny-")]
        for i in range(count):
            req = CreateEndpointRequest(
                name=f"bench-{i:05d}",
                modelName=models[i % len(models)],
                locationName="local",
                minReplicas=i % 2,
                maxReplicas=2,
            )
            await plane.endpoint_commands.create(OPERATOR, req, None)
        records = [plane.service.record(row.id) for row in plane.service.rows()]
        return records, created.plaintext
    finally:
        await plane.close()


async def _copy(state_dir: str, database_url: str) -> None:
    """The same endpoints (ids, times, token digests) into another store."""
    from inferd.control.stores import open_store

    source, target = open_store(inferd_settings(state_dir).database_url), open_store(database_url)
    try:
        tokens = await source.active_token_hashes()
        for endpoint in await source.list_endpoints():
            await target.insert_endpoint(endpoint, tokens[endpoint.id])
    finally:
        await source.close()
        await target.close()


# --- load ----------------------------------------------------------------------------


async def closed_loop_get(
    label: str,
    base_url: str,
    paths: list[str],
    *,
    concurrency: int,
    max_requests: int,
    duration_s: float,
    headers: dict[str, str],
) -> LoadResult:
    result = LoadResult(label, 0, 0, 0.0, 0)
    remaining = max_requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=30
    ) as client:
        # Warm up every connection first so handshakes are not measured.
        await asyncio.gather(*(client.get(paths[0]) for _ in range(concurrency)))
        deadline = time.monotonic() + duration_s

        async def worker(seed: int) -> None:
            nonlocal remaining
            rng = random.Random(seed)
            while remaining > 0 and time.monotonic() < deadline:
                remaining -= 1
                path = paths[rng.randrange(len(paths))]
                start = time.perf_counter()
                try:
                    resp = await client.get(path)
                    await resp.aread()
                    ok = resp.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    result.errors += 1
                    continue
                result.requests += 1
                result.latency_s.append(time.perf_counter() - start)

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        result.wall_s = time.perf_counter() - started
    return result


async def asgi_cost(app: Any, paths: list[str], headers: dict[str, str], count: int) -> list[float]:
    """Seconds per request through the ASGI app alone: no sockets, no client.

    Isolates the server-side work (routing, auth, record, JSON) from the
    HTTP client, which on a small machine is the bottleneck of the loop test.
    """
    raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    rng = random.Random(0)
    timings: list[float] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message

    for _ in range(count):
        path = paths[rng.randrange(len(paths))]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
            "root_path": "", "query_string": b"", "headers": raw_headers,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        start = time.perf_counter()
        await app(scope, receive, send)
        timings.append(time.perf_counter() - start)
    return timings


def _row(res: LoadResult, route: str, server: str) -> dict[str, Any]:
    return {
        "route": route,
        "server": server,
        "requests": res.requests,
        "errors": res.errors,
        "rps": round(res.requests_per_s, 1),
        "p50_ms": round((percentile(res.latency_s, 50) or 0) * 1000, 3),
        "p99_ms": round((percentile(res.latency_s, 99) or 0) * 1000, 3),
    }


def _in_process(
    state_dir: str,
    database_url: str,
    records: list[dict[str, Any]],
    routes: dict[str, list[str]],
    headers: dict[str, str],
    user_headers: dict[str, str],
    count: int,
) -> list[dict[str, Any]]:
    from inferd.control.fakes import FakeLauncher
    from inferd.server.app import create_app
    from inferd.server.compose import build

    plane = asyncio.run(
        build(inferd_settings(state_dir), launcher=FakeLauncher(), run_replicas=False)
    )
    pg_plane = asyncio.run(
        build(inferd_settings(state_dir, database_url), launcher=FakeLauncher(), run_replicas=False)
    )
    inferd_app = create_app(plane)
    apps = {
        "inferd": (inferd_app, headers),
        "inferd (user key)": (inferd_app, user_headers),
        "inferd-pg": (create_app(pg_plane), headers),
        "bare": (bare_app(records), headers),
    }
    rows: list[dict[str, Any]] = []
    try:
        for route, paths in routes.items():
            n = count if len(paths) > 1 else max(50, count // 20)  # the list is ~1 MB
            timings: dict[str, list[float]] = {server: [] for server in apps}
            for app, caller in apps.values():
                asyncio.run(asgi_cost(app, paths, caller, 20))  # warm-up
            # Interleaved chunks, so a burst of load from elsewhere on the
            # machine hits both servers alike.
            for _ in range(10):
                for server, (app, caller) in apps.items():
                    timings[server] += asyncio.run(asgi_cost(app, paths, caller, n // 10))
            means = {server: sum(t) / len(t) for server, t in timings.items()}
            for server, t in timings.items():
                rows.append({
                    "route": route, "server": server,
                    "mean_us": round(means[server] * 1e6, 1),
                    "p50_us": round((percentile(t, 50) or 0) * 1e6, 1),
                    "p99_us": round((percentile(t, 99) or 0) * 1e6, 1),
                    # Rate ratio: the inverse of the cost ratio.
                    "vs_bare": round(means["bare"] / means[server], 3),
                    "vs_sqlite": round(means["inferd"] / means[server], 3),
                    "vs_operator": round(means["inferd"] / means[server], 3),
                })  # fmt: skip
    finally:
        asyncio.run(plane.close())
        asyncio.run(pg_plane.close())
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per pass")
    parser.add_argument("--max-requests", type=int, default=50_000, help="per pass")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved passes per server")
    parser.add_argument("--asgi-requests", type=int, default=2000, help="in-process calls")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", choices=["inferd", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve == "inferd":
        serve_inferd(args.state, args.port, args.database_url)
        return 0
    if args.serve == "bare":
        serve_bare(args.state, args.port)
        return 0

    postgres = start_postgres()
    with tempfile.TemporaryDirectory(prefix="inferd-bench-") as tmp:
        state_dir = os.path.join(tmp, "state")
        t0 = time.perf_counter()
        records, user_key = asyncio.run(_populate(state_dir, args.endpoints))
        database_url = postgres.create_database("bench")
        asyncio.run(_copy(state_dir, database_url))
        print(f"stored {len(records)} endpoints in {time.perf_counter() - t0:.1f}s")
        data_file = os.path.join(tmp, "records.json")
        Path(data_file).write_text(json.dumps(records))

        procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        try:
            servers = (
                ("inferd", "inferd", state_dir, []),
                ("inferd-pg", "inferd", state_dir, ["--database-url", database_url]),
                ("bare", "bare", data_file, []),
            )
            for server, kind, state, extra in servers:
                port = free_port()
                cmd = [sys.executable, __file__, "--serve", kind, "--state", state, *extra]
                proc = subprocess.Popen([*cmd, "--port", str(port)])
                url = f"http://127.0.0.1:{port}"
                procs[server] = (proc, url)
            for server, (proc, url) in procs.items():
                ready = "/inference/endpoints" if server == "bare" else "/healthz"
                wait_http_ok(url + ready, proc, 60)
            ids = [r["id"] for r in records]
            routes = {
                "GET /inference/endpoints/{id}": [f"/inference/endpoints/{i}" for i in ids],
                "GET /inference/endpoints": ["/inference/endpoints"],
            }
            headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
            user_headers = {"Authorization": f"Bearer {user_key}"}
            callers = {
                "inferd": (procs["inferd"][1], headers),
                "inferd (user key)": (procs["inferd"][1], user_headers),
                "inferd-pg": (procs["inferd-pg"][1], headers),
                "bare": (procs["bare"][1], headers),
            }
            # Same document from every server and key (what the bare handler
            # returns is exactly what inferd returns).
            for path in (routes["GET /inference/endpoints/{id}"][0], "/inference/endpoints"):
                got = [httpx.get(u + path, headers=h).json() for u, h in callers.values()]
                assert all(g == got[0] for g in got), f"responses differ on {path}"

            results: dict[tuple[str, str], list[LoadResult]] = {}
            for _ in range(args.rounds):
                for route, paths in routes.items():
                    for server, (url, caller) in callers.items():
                        res = asyncio.run(
                            closed_loop_get(
                                f"{server} {route}",
                                url,
                                paths,
                                concurrency=args.concurrency,
                                max_requests=args.max_requests,
                                duration_s=args.duration,
                                headers=caller,
                            )
                        )
                        results.setdefault((route, server), []).append(res)
        finally:
            for proc, _ in procs.values():
                proc.terminate()
            for proc, _ in procs.values():
                proc.wait(timeout=30)

        try:
            in_process = _in_process(
                state_dir,
                database_url,
                records,
                routes,
                headers,
                user_headers,
                args.asgi_requests,
            )
        finally:
            postgres.destroy()

    rows: list[dict[str, Any]] = []
    for (route, server), passes in results.items():
        merged = LoadResult(f"{server} {route}", 0, 0, 0.0, 0)
        for res in passes:
            merged.requests += res.requests
            merged.errors += res.errors
            merged.wall_s += res.wall_s
            merged.latency_s += res.latency_s
        rows.append(_row(merged, route, server))
    by_key = {(r["route"], r["server"]): r for r in rows}
    for row in rows:
        bare = by_key[(row["route"], "bare")]
        row["vs_bare"] = round(row["rps"] / bare["rps"], 3) if bare["rps"] else None
        sqlite = by_key[(row["route"], "inferd")]
        row["vs_sqlite"] = round(row["rps"] / sqlite["rps"], 3) if sqlite["rps"] else None
        # The same ratio, named for what it measures on the user-key row.
        row["vs_operator"] = row["vs_sqlite"]
    order = ["inferd", "inferd (user key)", "inferd-pg", "bare"]
    rows.sort(key=lambda r: (r["route"], order.index(r["server"])))
    columns = [
        "route", "server", "requests", "errors", "rps", "p50_ms", "p99_ms", "vs_bare", "vs_sqlite",
        "vs_operator",
    ]  # fmt: skip
    print_table(
        f"management API, {args.endpoints} endpoints, concurrency {args.concurrency}, "
        f"{args.rounds} x {args.duration:g}s passes (goals: inferd rps >= 0.5 x bare; "
        "inferd-pg rps >= 0.8 x inferd on SQLite; user key >= 0.9 x operator key on get-by-id)",
        rows,
        columns,
    )
    goal_met = all(
        r["vs_bare"] is not None and r["vs_bare"] >= 0.5 for r in rows if r["server"] == "inferd"
    )
    postgres_goal_met = all(
        r["vs_sqlite"] is not None and r["vs_sqlite"] >= 0.8
        for r in rows
        if r["server"] == "inferd-pg"
    )
    by_id = "GET /inference/endpoints/{id}"
    user_ratio = by_key[(by_id, "inferd (user key)")]["vs_operator"]
    user_goal_met = user_ratio is not None and user_ratio >= 0.9
    in_process_user = next(
        r["vs_operator"] for r in in_process
        if r["route"] == by_id and r["server"] == "inferd (user key)"
    )  # fmt: skip
    print_table(
        f"server-side cost per request, in-process ASGI calls (no sockets, no client), "
        f"{args.asgi_requests} requests per route",
        in_process,
        ["route", "server", "mean_us", "p50_us", "p99_us", "vs_bare", "vs_sqlite", "vs_operator"],
    )
    print(
        f"\nuser key vs operator key, get-by-id: {user_ratio}x over HTTP, "
        f"{in_process_user}x in-process (goal >= 0.9)"
    )
    print(
        f"goal met: {goal_met}; PostgreSQL goal met: {postgres_goal_met}; "
        f"user-key goal met: {user_goal_met}"
    )
    write_report(
        "management_api",
        {
            "settings": {
                "endpoints": args.endpoints,
                "concurrency": args.concurrency,
                "duration_s": args.duration,
                "max_requests": args.max_requests,
                "rounds": args.rounds,
            },
            "results": rows,
            "in_process": in_process,
            "goal": "inferd requests/s >= 0.5 x bare handler, per route",
            "goal_met": goal_met,
            "postgres_goal": "inferd on PostgreSQL requests/s >= 0.8 x on SQLite, per route",
            "postgres_goal_met": postgres_goal_met,
            "user_key_goal": "get-by-id with a user key requests/s >= 0.9 x with the operator key",
            "user_key_vs_operator": user_ratio,
            "user_key_vs_operator_in_process": in_process_user,
            "user_key_goal_met": user_goal_met,
        },
        args.out,
    )
    return 0 if goal_met and postgres_goal_met and user_goal_met else 1


if __name__ == "__main__":
    raise SystemExit(main())
