"""Scale from zero: time from a request held at zero replicas to its first
token, against starting the bare replica process and sending the same
request as soon as it is healthy. Real vLLM engine, tiny-chat, on the CPU.

    .venv/bin/python benchmarks/cold_start.py [--rounds 3] [--retention 2]
        [--setting reconcile_period_seconds=1 ...]

- endpoint: `inferd serve` (default settings unless --setting) with a
  tiny-chat endpoint, minReplicas 0, maxReplicas 1, retention --retention s.
  Each round starts at zero (status `scaledToZero` and the last replica's
  process group gone), sends one streamed chat request (8 tokens,
  `ignore_eos`) to the endpoint URL and times its first content token. The
  gateway holds it, the reconciler launches a replica, the replica loads,
  warms up, reports `ready`, and the gateway releases the request.
- bare: `python -m inferd.replica` started here with the arguments the local
  launcher gives a replica (no registry), `/health` polled every 20 ms, the
  same request sent the moment it answers 200; timed from process start.

Rounds alternate (bare first in even rounds, endpoint first in odd ones);
one unmeasured bare start first loads the page cache. Each measured time is
split, from the replica's own log and /proc, into: request -> replica process
started (the control plane's reaction), process start -> "replica ready"
(the replica's load and warm-up, the same code on both sides), and ready ->
first token (the endpoint: report, registry, gateway wake-up, forward; the
bare side: the health poll and the request). Goal: endpoint median <= 1.1 x
bare median.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import chat_body, load_average, one_chat, print_table, write_report
from results_format import goal, not_measured, table

from inferd import procfs
from inferd.testing import ServeHandle

GOAL = 1.1
MODEL = "tiny-chat"
MAX_TOKENS = 8
POLL_S = 0.02
ROUND_KEYS = ["total_s", "to_process_s", "process_to_ready_s", "ready_to_token_s", "tokens"]
ROUND_COLUMNS = ["round", "side", *ROUND_KEYS]
SUMMARY_COLUMNS = ["label", "rounds", "total_s", "totals", "to_process_s", "process_to_ready_s",
                   "ready_to_token_s", "vs bare"]  # fmt: skip


def process_start_wall(pid: int) -> float | None:
    """When `pid` started, in wall-clock seconds (10 ms resolution): its start
    in clock ticks since boot, against the uptime read at the same moment."""
    stat = procfs.process_stat(pid)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    now = time.time()
    return None if stat is None else now - (uptime - stat.started_s)


def ready_wall(log: Path) -> float | None:
    """The time of the replica's "replica ready" log line (local time, ms)."""
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if line.rstrip().endswith("replica ready"):
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
    return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


async def first_token(url: str, headers: dict[str, str]) -> tuple[float, float, int]:
    """One streamed request: (wall time sent, wall time of its first content
    token, tokens it produced)."""
    body = chat_body(MODEL, MAX_TOKENS, True, "Hello! Tell me about foxes.")
    async with httpx.AsyncClient(timeout=600) as client:
        sent = time.time()
        ttft, _, tokens = await one_chat(client, url, body, headers)
    if ttft is None:
        raise RuntimeError("no content token came back")
    return sent, sent + ttft, tokens


def phases(
    start_wall: float, pid_start: float | None, ready: float | None, first_wall: float
) -> dict[str, Any]:
    """The measured time split at the replica's process start and its ready line."""

    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 3)

    return {
        "total_s": round(first_wall - start_wall, 3),
        "to_process_s": span(start_wall, pid_start),
        "process_to_ready_s": span(pid_start, ready),
        "ready_to_token_s": span(ready, first_wall),
    }


# --- the two sides ------------------------------------------------------------------


def bare_round(work: Path, index: int, env: dict[str, str]) -> dict[str, Any]:
    port_file = work / f"bare-{index}.port"
    log = work / f"bare-{index}.log"
    command = [
        sys.executable, "-m", "inferd.replica",
        "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
        "--port-file", str(port_file), "--device", "cpu",
        "--served-model-name", MODEL, "--cpu-kv-cache-gib", "1", "--log-level", "info",
    ]  # fmt: skip
    start_wall = time.time()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, "CUDA_VISIBLE_DEVICES": ""},
            start_new_session=True,
        )
    try:
        url = ""
        deadline = time.monotonic() + 900
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"bare replica exited:\n{log.read_text()[-3000:]}")
                if not url and port_file.exists() and port_file.read_text().strip():
                    url = f"http://127.0.0.1:{int(port_file.read_text())}"
                if url:
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{url}/health").status_code == 200:
                            break
                time.sleep(POLL_S)
            else:
                raise TimeoutError("bare replica not ready in 900 s")
        _, first_wall, tokens = asyncio.run(first_token(f"{url}/openai/v1/chat/completions", {}))
        result = phases(start_wall, process_start_wall(process.pid), ready_wall(log), first_wall)
        result["tokens"] = tokens
        return result
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)
        wait_group_gone(process.pid, 30)


class EndpointSide:
    def __init__(self, work: Path, retention: int, settings: dict[str, str]) -> None:
        self.serve = ServeHandle(
            work / "serve", settings={"replica_args": "--cpu-kv-cache-gib 1", **settings}
        )
        self.retention = retention
        self.endpoint: dict[str, Any] = {}

    def start(self) -> None:
        self.serve.start()
        self.endpoint = self.serve.create_endpoint(
            name="cold",
            modelName=MODEL,
            minReplicas=0,
            maxReplicas=1,
            scaleToZeroRetentionPeriodSeconds=self.retention,
        )

    def wait_zero(self, timeout: float = 180) -> None:
        self.serve.wait_record(
            self.endpoint["id"],
            lambda r: r["status"] == "scaledToZero" and r["currentReplicas"] == 0,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        while self.serve.replica_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def round(self) -> dict[str, Any]:
        self.wait_zero()
        url = f"{self.endpoint['url']}/openai/v1/chat/completions"
        headers = {"Authorization": f"Bearer {self.endpoint['accessToken']}"}
        start_wall, first_wall, tokens = asyncio.run(first_token(url, headers))
        record = self.serve.record(self.endpoint["id"])
        (replica,) = record["replicas"]
        (pid,) = self.serve.replica_pids()
        log = self.serve.state_dir / "state" / "logs" / f"replica-{replica['id']}.log"
        result = phases(start_wall, process_start_wall(pid), ready_wall(log), first_wall)
        result["tokens"] = tokens
        self.wait_zero()
        wait_group_gone(pid, 30)
        return result

    def close(self) -> None:
        self.serve.cleanup()


def summarise(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "label": label,
        "rounds": len(runs),
        "total_s": median("total_s"),
        "totals": [r["total_s"] for r in runs],
        "to_process_s": median("to_process_s"),
        "process_to_ready_s": median("process_to_ready_s"),
        "ready_to_token_s": median("ready_to_token_s"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="measured starts per side")
    parser.add_argument("--retention", type=int, default=2, help="endpoint retention, seconds")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an `inferd serve` setting for the endpoint side (repeatable)",
    )
    parser.add_argument("--no-prime", action="store_true", help="skip the unmeasured first start")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.setting)

    from inferd.catalog.tiny import ensure_tiny_model

    ensure_tiny_model(MODEL)
    print(load_average())
    work = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    side = EndpointSide(work, args.retention, settings)
    env = side.serve.env
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "endpoint": []}
    loads = []
    try:
        side.start()
        if not args.no_prime:
            print(f"prime (not measured): {bare_round(work, -1, env)}")
        for index in range(args.rounds):
            for name in sides_in_order(index):
                loads.append(load_average())
                result = bare_round(work, index, env) if name == "bare" else side.round()
                print(f"round {index} {name}: {result}; {loads[-1]}", flush=True)
                runs[name].append(result)
    finally:
        side.close()
    bare = summarise("bare replica", runs["bare"])
    endpoint = summarise("endpoint from zero", runs["endpoint"])
    ratio = ratio_of(bare, endpoint)
    if ratio is not None:
        endpoint["vs bare"] = round(ratio, 3)
    print_table(
        f"cold start to first token, tiny-chat on vLLM (CPU): medians of {args.rounds} "
        f"rounds per side; {load_average()}",
        [bare, endpoint],
        SUMMARY_COLUMNS,
    )
    met = ratio is not None and ratio <= GOAL
    print(
        f"\ngoal: endpoint time to first token from zero <= {GOAL} x bare replica: "
        + ("met" if met else "NOT met")
        + (f" ({ratio:.3f})" if ratio is not None else " (not measured)")
    )
    report = report_of(args, settings, runs, loads, (bare, endpoint), ratio)
    write_report("cold_start", report, args.out)
    return 0


def ratio_of(bare: dict[str, Any], endpoint: dict[str, Any]) -> float | None:
    """The endpoint's median over the bare replica's; None without a round."""
    if not bare["total_s"] or endpoint["total_s"] is None:
        return None
    return float(endpoint["total_s"] / bare["total_s"])


def judge(ratio: float | None) -> dict[str, Any]:
    name = "endpoint from zero: median time to first token / the bare replica's"
    target = f"<= {GOAL}x"
    if ratio is None:
        return not_measured(name, target, "no measured round on a side (--rounds 0)")
    met = ratio <= GOAL
    why = "" if met else "the held request's path from zero took longer than the bare start"
    return goal(name, target, round(ratio, 3), met, why)


def round_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every measured start in the order it ran."""
    rows = []
    for index in range(max((len(r) for r in runs.values()), default=0)):
        for side in sides_in_order(index):
            if index < len(runs[side]):
                run = runs[side][index]
                rows.append({"round": index, "side": side, **{k: run[k] for k in ROUND_KEYS}})
    return rows


def report_of(
    args: argparse.Namespace,
    settings: dict[str, str],
    runs: dict[str, list[dict[str, Any]]],
    loads: list[str],
    summaries: tuple[dict[str, Any], dict[str, Any]],
    ratio: float | None,
) -> dict[str, Any]:
    """The result file: the figures measured, the goal judged."""
    bare, endpoint = summaries
    judged = judge(ratio)
    return {
        "title": "Cold start: a request held at zero replicas to its first token, against "
        "the bare replica (tiny-chat, vLLM, CPU)",
        "workload": workload(args, settings),
        "config": {**vars(args), "out": str(args.out)},
        "tables": [
            table("Medians over the rounds (seconds)", SUMMARY_COLUMNS, [bare, endpoint]),
            table("Start by start (seconds)", ROUND_COLUMNS, round_rows(runs)),
        ],
        "goals": [judged],
        "notes": [
            "Each time is split from the replica's own log and /proc: `to_process_s` is the "
            "request (endpoint) or the launch (bare) to the replica process's start, the "
            "control plane's reaction; `process_to_ready_s` the replica's load and warm-up, "
            "the same code on both sides; `ready_to_token_s` the rest (endpoint: report, "
            "registry, gateway wake-up, forward; bare: the health poll and the request).",
        ],
        "serve_settings": settings,
        "goal": f"endpoint from zero <= {GOAL} x bare replica (time to first token)",
        "goal_met": judged["status"] == "met",
        "ratio": None if ratio is None else round(ratio, 4),
        "bare": bare,
        "endpoint": endpoint,
        "rounds": runs,
        "loads": loads,
    }


def workload(args: argparse.Namespace, settings: dict[str, str]) -> str:
    prime = "" if args.no_prime else ", after one unmeasured bare start"
    serve = ", ".join(f"{k}={v}" for k, v in settings.items()) or "the defaults"
    return (
        f"{args.rounds} measured starts per side, alternating{prime}; one streamed chat of "
        f"{MAX_TOKENS} tokens (ignore_eos) per start; endpoint minReplicas 0, maxReplicas 1, "
        f"retention {args.retention} s; serve settings: {serve}"
    )


def sides_in_order(index: int) -> list[str]:
    # Alternating: drift on a shared machine hits both sides alike.
    return ["bare", "endpoint"] if index % 2 == 0 else ["endpoint", "bare"]


if __name__ == "__main__":
    raise SystemExit(main())
