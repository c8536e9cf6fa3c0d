"""The launcher contract: start, stop and watch replica processes somewhere.

Small on purpose: the reconciler is its only caller, and a cluster-backed
launcher (Ray, Kubernetes) implements the same five verbs without the
gateway or the API noticing. A launcher knows processes and GPUs; it does
not know replica *status* (the registry does, from the replicas' reports).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ReplicaSpec:
    replica_id: str
    endpoint_id: str
    model_name: str
    gpu_type: str
    gpu_count: int
    # The replica authenticates its reports with this, and the gateway
    # authenticates to the replica with it; it travels by environment only.
    secret: str
    served_names: tuple[str, ...] = ()
    # Where the endpoint runs; a cluster launcher places the replica only on
    # a node of this location (the local launcher is its one machine).
    location: str = "local"


@dataclass(frozen=True)
class LaunchedReplica:
    replica_id: str
    pid: int
    gpu_ids: tuple[int, ...]  # physical GPU indices on the host; () on CPU
    host: str = "local"
    log_path: str | None = None


@dataclass(frozen=True)
class ExitedReplica:
    replica_id: str
    returncode: int | None  # None: not our child (adopted), code unknown
    log_tail: str = ""


@dataclass(frozen=True)
class Capacity:
    """Free placement slots per GPU type ("cpu" counts replica slots)."""

    free: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Slots:
    """GPUs of one type in one location (for `cpu`: CPU replica slots)."""

    total: int = 0
    free: int = 0
    nodes: int = 0
    # The most a single node has free: a replica cannot span nodes.
    largest_free: int = 0


# location -> GPU type -> slots, as a launcher sees them now.
LiveCapacity = Mapping[str, Mapping[str, Slots]]


class Launcher(Protocol):
    def capacity(self) -> Capacity: ...

    def locations(self) -> LiveCapacity:
        """Capacity by location and GPU type, live."""
        ...

    def cannot_place(self, gpu_type: str, gpu_count: int, location: str = "local") -> str | None:
        """None when a replica of this shape can start now in `location`,
        else why not."""
        ...

    def launch(self, spec: ReplicaSpec) -> LaunchedReplica: ...

    def stop(self, replica_id: str, grace_s: float) -> None:
        """Ask it to drain and exit; force it after `grace_s` seconds."""
        ...

    def kill(self, replica_id: str) -> None:
        """At once, with everything it started."""
        ...

    def reap(self) -> list[ExitedReplica]:
        """Replicas whose process ended since the last call (their GPUs are
        free again). Also enforces pending stop deadlines."""
        ...

    def adopt(self, replica_id: str, pid: int, gpu_ids: tuple[int, ...]) -> bool:
        """After a control-plane restart: take over a replica that is still
        running (True), or report that it is gone (False)."""
        ...

    def running(self) -> list[str]: ...

    def shutdown(self, grace_s: float) -> None:
        """Stop every replica (drain, then force) and wait for them."""
        ...
