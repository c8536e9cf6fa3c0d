"""A local multi-node Ray cluster for tests and benchmarks.

`ray.cluster_utils.Cluster` runs a head and several nodes (each its own
raylet) on this one machine; GPUs are fake (Ray only counts them), so a
replica placed on one runs with `--device cpu`. What this machine taught:

- every node and the driver bind to 127.0.0.2: with 127.0.0.1 Ray rewrites
  the address to the machine's outward IP and the driver hangs;
- object stores are 100 MiB each (the default is 30% of the RAM per node);
- the head takes no work (`num_cpus=0`, no GPUs, no location);
- Ray's files go under a short temporary directory: its Unix socket paths
  must stay under 108 bytes.

Ray is imported when a cluster is started, not with this module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from inferd.control.launchers.ray_resources import CPU, node_resources

NODE_IP = "127.0.0.2"
OBJECT_STORE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class FakeNode:
    location: str
    gpu_type: str | None
    gpus: int
    cpu_slots: int = 0

    def resources(self) -> dict[str, float]:
        resources = node_resources(self.location, self.gpu_type, self.gpus)
        if self.cpu_slots:
            resources.update(node_resources(self.location, CPU, self.cpu_slots))
        return resources


@dataclass
class LocalCluster:
    """A started cluster: `address` for `inferd serve --ray-address`."""

    cluster: Any  # ray.cluster_utils.Cluster
    temp_dir: str
    nodes: dict[str, Any] = field(default_factory=dict)  # name -> Ray node
    specs: dict[str, FakeNode] = field(default_factory=dict)
    # This process is a driver of the cluster (ray.init was called for it).
    connected: bool = False

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def env(self) -> dict[str, str]:
        """Environment for a driver process (`inferd serve`) of this cluster."""
        return {"RAY_TMPDIR": self.temp_dir}

    def add(self, name: str, spec: FakeNode) -> Any:
        node = self.cluster.add_node(
            num_cpus=1,
            num_gpus=spec.gpus,
            resources=spec.resources(),
            node_ip_address=NODE_IP,
            object_store_memory=OBJECT_STORE_BYTES,
            temp_dir=self.temp_dir,
        )
        self.nodes[name] = node
        self.specs[name] = spec
        self.cluster.wait_for_nodes()
        return node

    def remove(self, name: str) -> None:
        node = self.nodes.pop(name)
        self.cluster.remove_node(node)

    def node_id(self, name: str) -> str:
        return str(self.nodes[name].node_id)

    def shutdown(self) -> None:
        if self.connected:
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
        self.cluster.shutdown()
        # Ray's last processes may still write their logs there for a moment.
        for _ in range(5):
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            if not os.path.exists(self.temp_dir):
                break
            time.sleep(0.5)


def start_cluster(nodes: dict[str, FakeNode], connect: bool = True) -> LocalCluster:
    """A head that takes no work plus `nodes`; the calling process is
    connected as a driver when `connect`."""
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # Ray records the current cluster's address under $RAY_TMPDIR/ray.
    os.makedirs(os.path.join(temp_dir, "ray"), exist_ok=True)
    os.environ["RAY_TMPDIR"] = temp_dir
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "num_gpus": 0,
            "node_ip_address": NODE_IP,
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
            "temp_dir": temp_dir,
        },
    )
    local = LocalCluster(cluster, temp_dir, connected=connect)
    try:
        for name, spec in nodes.items():
            local.add(name, spec)
        if connect:
            import ray

            ray.init(
                address=cluster.address,
                _node_ip_address=NODE_IP,
                namespace="inferd-tests",
                logging_level="WARNING",
                log_to_driver=False,
            )
    except BaseException:
        local.shutdown()
        raise
    return local


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> float:
    """Seconds until `predicate()` is true; raises TimeoutError past `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval)
    raise TimeoutError(f"not true within {timeout}s")
