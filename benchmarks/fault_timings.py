"""How fast the control plane reacts to faults, against the goals it states.

The fault tests (`tests/reliability`, `tests/e2e/test_cluster_*`) check what
must hold on any machine (a killed replica's stream goes on on another replica,
a hung replica is ejected, a revoked key is refused) and wait with bounds that
only catch a hang. They record how long each reaction took
(`tests/timings.py`). This benchmark runs them on a quiet machine with
`INFERD_TIMINGS_OUT` set, `--rounds` times, and judges each figure against
its goal here, where speed goals belong.

    .venv/bin/python benchmarks/fault_timings.py [--rounds 3] [--quick]

`--quick` runs only the tests with fake engines and no PostgreSQL (about a
minute); the default adds vLLM's disconnect test and the three-instance
PostgreSQL cluster tests. Each goal is met when the worst of its rounds is
within it (the figures are reaction times, so the worst is what a client
sees).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import results_format
from common import print_table, write_report

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Goal:
    """`name` as the test records it; `limit` in the test's unit; `at_least`
    for figures where more is better (a served fraction); `test` the file
    whose test records it."""

    name: str
    limit: float
    why: str
    test: str
    at_least: bool = False


FAULT_REPLICAS = "tests/reliability/test_fault_replicas.py"
FAULT_ENGINES = "tests/reliability/test_fault_engines.py"
CLUSTER_SERVING = "tests/e2e/test_cluster_serving.py"
COORDINATION = "tests/contract/test_coordination.py"
REPLICA_PROCESS = "tests/e2e/test_replica_process.py"
GATEWAY = "tests/integration/test_gateway.py"
ABORTS = "disconnect aborts the request at the engine"

# The reliability servers report every 0.5 s (health period) and reconcile
# every 0.1 s; the SIGSTOP test runs a 1.0 s health period and takes a
# replica silent for 4 s for dead.
GOALS = [
    Goal(
        "sigkill: stream resumed after the kill",
        2.0,
        "a dead replica's stream goes on on another at once (migration: a re-prefill)",
        FAULT_REPLICAS,
    ),
    Goal(
        "sigstop: routed around after the stop",
        2 * 1.0 + 0.1 + 0.25,
        "two health periods + one reconcile tick + a report in transit",
        FAULT_REPLICAS,
    ),
    Goal(
        "sigstop: ended after the stop",
        4.0 + 0.1 + 0.25,
        "the dead grace (counted from the last report, before the stop) + a tick + transit",
        FAULT_REPLICAS,
    ),
    Goal(
        "sigstop: stream resumed after the stop",
        4.0 + 0.1 + 0.75,
        "ended, then the stream is aborted and continued on the survivor",
        FAULT_REPLICAS,
    ),
    Goal(
        "burst of 1000: all answered",
        30.0,
        "1,000 requests, 50 at a time, fake engine",
        FAULT_REPLICAS,
    ),
    Goal(
        "overload: served / capacity",
        0.5,
        "overload does not cost throughput",
        "tests/reliability/test_overload.py",
        at_least=True,
    ),
    Goal(
        "re-issue: old token first refused",
        1.0,
        "a re-issued token stops working at once",
        "tests/reliability/test_security.py",
    ),
    Goal("disconnect via replica (stream=True): fake engine freed", 2.0, ABORTS, REPLICA_PROCESS),
    Goal("disconnect via replica (stream=False): fake engine freed", 2.0, ABORTS, REPLICA_PROCESS),
    Goal("disconnect via gateway (stream=True): fake engine freed", 2.0, ABORTS, GATEWAY),
    Goal("disconnect via gateway (stream=False): fake engine freed", 2.0, ABORTS, GATEWAY),
    Goal("disconnect via replica (stream=True): vLLM freed", 2.0, ABORTS, FAULT_ENGINES),
    Goal("disconnect via replica (stream=False): vLLM freed", 2.0, ABORTS, FAULT_ENGINES),
    Goal("disconnect via gateway (stream=True): vLLM freed", 2.0, ABORTS, FAULT_ENGINES),
    Goal("disconnect via gateway (stream=False): vLLM freed", 2.0, ABORTS, FAULT_ENGINES),
    Goal("cluster: endpoint created on A visible on B", 1.0, "the change feed", CLUSTER_SERVING),
    Goal("cluster: token re-issued on B refused on A", 1.0, "the change feed", CLUSTER_SERVING),
    Goal("cluster: revoked admin key refused", 1.0, "the change feed", CLUSTER_SERVING),
    Goal(
        "cluster: new leader after SIGKILL under load",
        5.0,
        "the failover goal, with 20 requests/s through the followers",
        CLUSTER_SERVING,
    ),
    Goal(
        "cluster: new leader after SIGKILL",
        5.0,
        "the failover goal (benchmarks/failover.py)",
        "tests/e2e/test_cluster_leader.py",
    ),
    Goal(
        "coordination: wake reached the leader",
        1.0,
        "a held request wakes the leader at once",
        COORDINATION,
    ),
    Goal(
        "coordination: the lead moved after a stop",
        2.0,
        "a clean stop hands over at once",
        COORDINATION,
    ),
    Goal(
        "leader: hand-over after a stop",
        1.0,
        "a clean stop hands over at once",
        "tests/integration/test_leader_postgres.py",
    ),
    Goal(
        "coordination: a follower's wake reached the leader",
        0.2,
        "sooner than a publishing round (0.2 s in the test's other cases)",
        COORDINATION,
    ),
]

QUICK_TESTS = [
    "tests/reliability/test_fault_replicas.py",
    "tests/reliability/test_overload.py::"
    "test_twice_the_capacity_gets_429_with_retry_after_bounded_memory_and_recovers",
    "tests/reliability/test_security.py::test_an_old_token_fails_once_it_is_reissued",
    f"{REPLICA_PROCESS}::test_client_disconnect_aborts_engine_work",
    f"{GATEWAY}::test_client_disconnect_aborts_the_replica_work",
]
FULL_TESTS = [
    *QUICK_TESTS,
    "tests/reliability/test_fault_engines.py::test_client_disconnect_frees_vllm",
    "tests/e2e/test_cluster_serving.py",
    "tests/e2e/test_cluster_leader.py",
    "tests/contract/test_coordination.py",
    "tests/integration/test_leader_postgres.py",
]


def run_round(tests: list[str], out: Path) -> int:
    env = {**os.environ, "INFERD_TIMINGS_OUT": str(out), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def judge(
    figures: dict[str, list[float]], tests: list[str], failed_rounds: int
) -> list[dict[str, object]]:
    """Every goal, each met, not met or not measured (with why): a goal whose
    test did not run this time, or ran and recorded nothing, is stated, not
    dropped."""
    goals: list[dict[str, object]] = []
    for goal in GOALS:
        target = f"{'>=' if goal.at_least else '<='} {goal.limit:g}"
        values = figures.get(goal.name)
        if not values:
            ran = any(target.split("::")[0] == goal.test for target in tests)
            why = (
                f"its test recorded no figure in any round ({goal.test} failed before the fault)"
                if ran
                else f"{goal.test} is not in this run's tests (--quick)"
            )
            goals.append(results_format.not_measured(goal.name, target, why))
            continue
        worst = min(values) if goal.at_least else max(values)
        met = worst >= goal.limit if goal.at_least else worst <= goal.limit
        goals.append(results_format.goal(goal.name, target, round(worst, 3), met, goal.why))
    if failed_rounds:
        goals.append(
            results_format.goal(
                "every round's tests passed",
                "0 failed rounds",
                failed_rounds,
                False,
                "a figure from a failing test is kept, but the run is not clean",
            )
        )
    return goals


def figure_rows(figures: dict[str, list[float]]) -> list[dict[str, object]]:
    limits = {goal.name: goal for goal in GOALS}
    rows: list[dict[str, object]] = []
    for name in sorted(figures):
        values = figures[name]
        goal = limits.get(name)
        rows.append({
            "figure": name,
            "rounds": len(values),
            "best": round(max(values) if goal and goal.at_least else min(values), 3),
            "worst": round(min(values) if goal and goal.at_least else max(values), 3),
            "goal": f"{'>=' if goal.at_least else '<='} {goal.limit:g}" if goal else "-",
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fake engines only, no PostgreSQL")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    args = parser.parse_args()

    tests = QUICK_TESTS if args.quick else FULL_TESTS
    figures: dict[str, list[float]] = defaultdict(list)
    failed_rounds = 0
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "timings.jsonl"
        for index in range(args.rounds):
            print(f"round {index + 1} of {args.rounds}: {len(tests)} test targets", flush=True)
            if run_round(tests, out) != 0:
                failed_rounds += 1  # a figure from a failed test is still a figure
        for line in out.read_text().splitlines() if out.exists() else []:
            entry = json.loads(line)
            figures[entry["name"]].append(float(entry["value"]))

    goals = judge(figures, tests, failed_rounds)
    rows = figure_rows(figures)
    print_table("fault reaction times (seconds; worst of the rounds against the goal)", rows,
                ["figure", "rounds", "best", "worst", "goal"])  # fmt: skip
    print_table("goals", goals, ["goal", "target", "figure", "status", "why"])
    report = {
        "title": "Fault reaction times (fault_timings)",
        "workload": f"{args.rounds} rounds of {len(tests)} test targets"
        f" ({'fake engines only' if args.quick else 'fake engines, vLLM tiny-chat, PostgreSQL'});"
        " figures in seconds (a fraction for overload), the worst round is judged",
        "tables": [
            results_format.table(
                "Reaction times over the rounds",
                ["figure", "rounds", "best", "worst", "goal"],
                rows,
            )
        ],
        "goals": goals,
        "rounds": args.rounds,
        "tests": tests,
        "failed_test_rounds": failed_rounds,
        "figures": dict(figures),
        "goal_met": results_format.all_met(goals),
    }
    path = write_report("fault_timings", report, args.out)
    verdict = "all goals met" if report["goal_met"] else "NOT all goals met (or not all measured)"
    print(f"\n{verdict}; report: {path}")


if __name__ == "__main__":
    main()
