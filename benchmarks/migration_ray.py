"""The Ray side of benchmarks/migration.py: the `node` fault.

A local Ray cluster (`inferd.testing.cluster`: a head that takes no work and
two us-east nodes with one CPU replica slot each, all on 127.0.0.2), an
`inferd serve` whose launcher is Ray, and one tiny-chat endpoint of two
vLLM replicas, one on each node. Streams go to the endpoint's URL with its
access token: the real gateway and control plane. The fault removes the node
that hosts one of the replicas, each serving half the streams (the cluster
tests' `LocalCluster.remove`): its raylet and the replica's actor go, the replica
goes by its parent-death signal and its engine core by its group's reaper.

Also here: what a run left behind (`left_behind`), read from /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from inferd import procfs
from inferd.testing import ServeHandle
from inferd.testing.cluster import NODE_IP, FakeNode, LocalCluster, start_cluster

NAMESPACE = "inferd-bench-migration"
LOCATION = "us-east"
NODES = {f"node-{c}": FakeNode(LOCATION, None, 0, 1) for c in "ab"}
SETTINGS = {
    "launcher": "ray",
    "ray_namespace": NAMESPACE,
    "ray_node_ip_address": NODE_IP,
    "replica_args": "--device cpu --cpu-kv-cache-gib 1",
    # Two vLLM replicas load at once on a busy 2-core machine: minutes.
    "replica_start_timeout_seconds": "900",
    "gateway_hold_timeout_seconds": "900",
}
# Processes that must not outlive a run once orphaned (parent pid 1).
ORPHAN_NAMES = (b"VLLM::EngineCore", b"inferd.replica", b"ray::", b"raylet", b"gcs_server")


class RayFleet:
    """The cluster, the server and the endpoint, started in that order and
    stopped in the reverse one."""

    def __init__(self, state: Path) -> None:
        self.cluster: LocalCluster = start_cluster(NODES)
        # Ray's driver ends the process on SIGTERM without unwinding it, which
        # would leave `inferd serve` orphaned: unwind, so that `stop` runs.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        self.serve: ServeHandle | None = None
        try:
            serve = ServeHandle(state, settings={**SETTINGS, "ray_address": self.cluster.address})
            serve.env.update(self.cluster.env())
            self.serve = serve.start(timeout=120)
            self.endpoint = self.serve.create_endpoint(
                name="migration", modelName="tiny-chat", locationName=LOCATION,
                gpuType="cpu", minReplicas=2, maxReplicas=2,
            )  # fmt: skip
            record = self.serve.wait_record(
                self.endpoint["id"], lambda r: len(_ready(r)) == 2, timeout=1800, interval=1
            )
            # Where each replica runs and answers, read once before any load.
            self.replicas: dict[str, Placed] = {}
            for rid in _ready(record):
                info = _actor_info(rid)
                node = self._node_name(info["nodeId"])
                self.replicas[rid] = Placed(node, _replica_url(info), int(info["pid"]))
        except BaseException:
            self.stop()
            raise
        self.removed: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"{self.endpoint['url']}/openai/v1/chat/completions"

    @property
    def token(self) -> str:
        return str(self.endpoint["accessToken"])

    @property
    def temp_dir(self) -> str:
        return self.cluster.temp_dir

    def migrations(self) -> float:
        assert self.serve is not None
        text = httpx.get(f"{self.serve.url}/metrics", timeout=10).text
        pattern = r"^inferd_gateway_migrations_total\{[^}]*\} ([0-9.]+)$"
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    def remove_one(self) -> None:
        """Remove the node of one replica (the first by id), chosen without
        asking the replicas: the streams' prompts are short (no prefix to
        route by), so least-loaded routing puts half of them on each, and
        asking a busy replica its in-flight count took long enough for its
        answers to be generated meanwhile (nothing left to continue).
        `removed` says which, and how long the removal and the replica's end
        took (its streams are lost only then)."""
        victim = self.replicas[min(self.replicas)]
        started = time.monotonic()
        self.cluster.remove(victim.node)
        removed = time.monotonic() - started
        while procfs.alive(victim.pid) and time.monotonic() - started < 60:
            time.sleep(0.01)
        self.removed = {
            "node": victim.node,
            "node removal s": round(removed, 3),
            "replica gone after s": round(time.monotonic() - started, 3),
        }

    def stop(self) -> None:
        if self.serve is not None:
            self.serve.stop()  # stops its replicas (their actors) first
        self.cluster.shutdown()

    def _node_name(self, node_id: str) -> str:
        return next(n for n in self.cluster.nodes if self.cluster.node_id(n) == node_id)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@dataclass(frozen=True)
class Placed:
    node: str
    url: str
    pid: int


def _ready(record: dict[str, Any]) -> list[str]:
    return [r["id"] for r in record["replicas"] if r["status"] == "ready"]


def _actor_info(replica_id: str) -> dict[str, Any]:
    import ray

    actor = ray.get_actor(f"inferd-replica-{replica_id}", namespace=NAMESPACE)
    return dict(ray.get(actor.info.remote(), timeout=30))


def _replica_url(info: dict[str, Any]) -> str:
    """The replica's own URL, from the line it logs when it binds."""
    log = Path(info["logPath"]).read_text(errors="replace")
    return re.findall(r"serving .* on (http://\S+)", log)[-1]


def snapshot() -> set[int]:
    return set(procfs.all_pids())


def left_behind(before: set[int], marks: list[bytes], wait_s: float = 60) -> list[str]:
    """Processes born since `before` that outlive the run: those carrying one
    of `marks` in their environment or command line (the run's own; a
    process that set its title has lost its environment, hence the command
    line: Ray's daemons name their temporary directory there), and orphans
    (parent pid 1) with a replica's, engine core's or Ray's name. Waits up
    to `wait_s` for them to go, then kills those that carry a mark (orphans
    without one may be another run's and are only reported)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _left(before, marks)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(1)
    for pid, (_, _, marked) in found.items():
        if marked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return [f"{pid} ppid={ppid} {args}" for pid, (ppid, args, _) in sorted(found.items())]


def _left(before: set[int], marks: list[bytes]) -> dict[int, tuple[int, str, bool]]:
    found = {}
    for pid in procfs.all_pids():
        if pid in before or pid == os.getpid():
            continue
        stat = procfs.process_stat(pid)
        if stat is None or stat.zombie:
            continue
        args = b" ".join(procfs.command_line(pid) or [])
        env = b"\0".join(procfs.environment(pid) or [])
        marked = any(m in args or m in env for m in marks)
        orphan = stat.ppid == 1 and any(name in args for name in ORPHAN_NAMES)
        if marked or orphan:
            found[pid] = (stat.ppid, args.decode(errors="replace")[:160], marked)
    return found
