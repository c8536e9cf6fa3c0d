"""`inferd serve` for the routing benchmark: a cluster of instances on one
PostgreSQL sharing one endpoint's replicas, each instance with its own
gateway settings (routing policy, prefix placement on or off), and the
replicas' own figures.

The first instance launches the replicas (the engine arguments ride on
`replica_args`); every instance routes to them. Requests sent to one
instance measure one gateway; alternated over two, two gateways sharing the
load, as behind a load balancer.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx

from inferd import procfs
from inferd.testing import ServeHandle, free_port
from inferd.testing.postgres import PostgresServer, start_postgres

ADMIN_KEY = "infd_admin_bench_routing_0123456789abcdef"


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


class ServeFleet:
    def __init__(
        self,
        root: Path,
        model: Path,
        engine_args: dict[str, Any],
        replicas: int,
        instances: dict[str, dict[str, str]],
    ) -> None:
        """`instances`: name -> extra settings (gateway_*), the first one
        launches the replicas."""
        self.root = root
        self.model = model
        self.replicas = replicas
        self.postgres: PostgresServer | None = None
        replica_args = ["--engine vllm --device cpu"]
        for key, value in engine_args.items():
            replica_args.append(f"--engine-arg {key}={json.dumps(value)}")
        self._replica_args = " ".join(replica_args)
        self._settings = instances
        self.instances: dict[str, ServeHandle] = {}
        self.endpoint: dict[str, Any] = {}
        self._original_affinity: dict[int, set[int]] = {}

    def start(self, timeout: float = 900) -> None:
        self.postgres = start_postgres()
        database = self.postgres.create_database()
        ports = {name: free_port() for name in self._settings}
        for name, extra in self._settings.items():
            others = ",".join(f"http://127.0.0.1:{p}" for n, p in ports.items() if n != name)
            self.instances[name] = ServeHandle(
                self.root / name,
                port=ports[name],
                admin_key=ADMIN_KEY,
                settings={
                    "database_url": database,
                    "instance_id": name,
                    "replica_args": self._replica_args,
                    "replica_report_fallback_urls": others,
                    "cpu_replica_slots": str(self.replicas),
                    # (the default level: replicas log the URL they bind, read
                    # back by `replica_urls`)
                    # Engines loading side by side on a shared machine starve
                    # the replicas' reporting threads for tens of seconds:
                    # late reports must not fail them here.
                    "health_failure_periods": "30",
                    "replica_start_timeout_seconds": "1200",
                    **extra,
                },
            )
        first, *rest = self.instances.values()
        first.start(timeout=600)  # a loaded machine: minutes, not seconds
        for instance in rest:
            instance.start(timeout=600)
        # Registering inspects the model: minutes on a loaded machine.
        with httpx.Client(base_url=first.url, headers=self.admin(), timeout=900) as api:
            registered = api.post(
                "/inference/models", json={"source": str(self.model), "name": self.model.name}
            )
            if registered.status_code != 201:
                raise RuntimeError(f"registering {self.model}: {registered.text}")
            created = api.post(
                "/inference/endpoints",
                json={"name": "routing", "modelName": self.model.name,
                      "minReplicas": self.replicas, "maxReplicas": self.replicas},
            )  # fmt: skip
            if created.status_code != 201:
                raise RuntimeError(f"creating the endpoint: {created.text}")
            self.endpoint = created.json()
        first.wait_record(
            self.endpoint["id"],
            lambda r: r["status"] == "running" and r["currentReplicas"] == self.replicas,
            timeout,
            1.0,
        )

    @staticmethod
    def admin() -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}

    @property
    def model_name(self) -> str:
        return str(self.endpoint.get("modelName", self.model))

    def chat_url(self, name: str) -> str:
        return (
            f"{self.instances[name].url}/endpoints/{self.endpoint['id']}/openai/v1/chat/completions"
        )

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.endpoint['accessToken']}"}

    def metrics_url(self, name: str) -> str:
        return f"{self.instances[name].url}/metrics"

    def replica_urls(self, timeout: float = 300) -> list[str]:
        """The replicas' own base URLs (their /metrics carry the engines'
        prefix-cache figures), from the lines they log when they bind: all
        of them, or an error (figures from some replicas only would read as
        the whole endpoint's)."""
        deadline = time.monotonic() + timeout
        while True:
            urls = []
            for instance in self.instances.values():
                for log in sorted((instance.state_dir / "state" / "logs").glob("replica-*.log")):
                    text = log.read_text(errors="replace")
                    match = re.search(r"serving .*? on (http://\S+)", text)
                    if match and _answers(match.group(1) + "/health"):
                        urls.append(match.group(1))  # not one that failed and was replaced
            if len(urls) == self.replicas:
                return urls
            if time.monotonic() > deadline:
                raise RuntimeError(f"found {len(urls)} of {self.replicas} replicas: {urls}")
            time.sleep(2)

    def _replica_tasks(self) -> list[list[int]]:
        """Per replica (in a stable order): every thread of its processes
        (the replica, vLLM's engine core and workers share its group)."""
        groups: dict[int, list[int]] = {}
        leaders = sorted(p for i in self.instances.values() for p in i.replica_pids())
        for pid in procfs.all_pids():
            try:
                group = os.getpgid(pid)
            except OSError:
                continue
            if group in leaders:
                try:
                    tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                except OSError:
                    continue
                groups.setdefault(group, []).extend(tasks)
        return [groups.get(leader, []) for leader in leaders]

    def pin(self) -> None:
        """Replica i's every thread on core i (as the bare targets' replicas
        are), remembering where they were."""
        cores = os.cpu_count() or 1
        for i, tasks in enumerate(self._replica_tasks()):
            for tid in tasks:
                try:
                    self._original_affinity.setdefault(tid, os.sched_getaffinity(tid))
                    os.sched_setaffinity(tid, {i % cores})
                except OSError:
                    continue

    def unpin(self) -> None:
        for tid, cpus in self._original_affinity.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                continue
        self._original_affinity.clear()

    def stop(self) -> None:
        for instance in reversed(list(self.instances.values())):
            try:
                instance.cleanup()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {instance.url}: {exc}", flush=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            i.launched_pids() for i in self.instances.values() if i.process is not None
        ):
            time.sleep(0.5)
        if self.postgres is not None:
            self.postgres.destroy()
