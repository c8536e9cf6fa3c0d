"""Replicas on a Ray cluster: one named, detached actor per replica.

Ray places and watches; it is never in the request path. Each replica is a
`ReplicaHost` actor named `inferd-replica-<id>` in the launcher's namespace,
asking for the replica's GPUs (`num_gpus`, so Ray sets CUDA_VISIBLE_DEVICES)
and for its endpoint's location and GPU type as custom resources (see
`ray_resources`), which only nodes started in that location with GPUs of
that type have. The actor runs the same replica process the local launcher
runs, bound to its node's address; the replica reports that URL to the
registry and the gateway proxies to it directly.

Watching, in three layers: the actor's `wait()` returns when the replica
process ends (its exit code); Ray fails that call with `ActorDiedError`
when the actor or its node dies (measured here 0.1 s after a node left);
the registry's heartbeat is the backstop. `reap()` polls the calls without
blocking, every reconciler tick.

After a control-plane restart, `adopt` finds a replica's actor again by
name; actors of the namespace that the store does not know are removed
(`sweep_orphans`), as Ray Serve's controller rebuilds its state from named
actors.

Ray is imported here, and this module only when `--launcher ray` is chosen.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import ray._private.state
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from inferd.control.launchers.base import (
    Capacity,
    ExitedReplica,
    LaunchedReplica,
    LiveCapacity,
    ReplicaSpec,
    Slots,
)
from inferd.control.launchers.ray_host import NODE_HOST, PYTHON, ReplicaHost
from inferd.control.launchers.ray_resources import (
    CPU,
    NodeCapacity,
    by_location,
    cannot_place,
    node_capacity,
    replica_demand,
)

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "inferd-replica-"
# How long a verb waits for an actor that should answer at once (a kill,
# an adoption's info); a lost node must not stall the reconciler longer.
_ACTOR_CALL_TIMEOUT_S = 3.0


def actor_name(replica_id: str) -> str:
    return ACTOR_PREFIX + replica_id


@dataclass
class _Placed:
    replica_id: str
    actor: Any  # ray.actor.ActorHandle
    waiting: Any  # ObjectRef of wait()
    started: Any | None  # ObjectRef of start(); None once read (or adopted)
    gpu_type: str
    location: str
    node_id: str | None = None
    node_ip: str | None = None
    kill_at: float | None = None


class RayLauncher:
    def __init__(
        self,
        *,
        address: str,
        namespace: str,
        registry_url: str,
        replica_args: Sequence[str] = (),
        model_source: Callable[[str], str] = lambda name: name,
        env: dict[str, str] | None = None,
        node_ip_address: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        linger_s: float = 60.0,
    ) -> None:
        """`model_source`: the catalog's resolved reference for a model name
        (a directory, `builtin:NAME` or a Hugging Face id), which the replica
        loads on its node."""
        if not ray.is_initialized():
            ray.init(
                address=address,
                namespace=namespace,
                _node_ip_address=node_ip_address,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        self._namespace = namespace
        self._registry_url = registry_url
        self._replica_args = list(replica_args)
        self._model_source = model_source
        self._env = dict(env or {})
        self._clock = clock
        self._linger_s = linger_s
        self._remote_host = ray.remote(ReplicaHost)
        self._placed: dict[str, _Placed] = {}

    # -- the cluster's capacity ---------------------------------------------------------

    def nodes(self) -> list[NodeCapacity]:
        """Every alive node, with its location and GPUs by type (free ones
        as of now)."""
        available = ray._private.state.state.available_resources_per_node()
        return [
            node_capacity(
                node["NodeID"],
                node["NodeManagerAddress"],
                node["Resources"],
                available.get(node["NodeID"], {}),
            )
            for node in ray.nodes()
            if node["Alive"]
        ]

    def locations(self) -> LiveCapacity:
        return by_location(self.nodes())

    def capacity(self) -> Capacity:
        free: dict[str, int] = {}
        total: dict[str, int] = {}
        types: Mapping[str, Slots]
        for types in self.locations().values():
            for gpu_type, slots in types.items():
                free[gpu_type] = free.get(gpu_type, 0) + slots.free
                total[gpu_type] = total.get(gpu_type, 0) + slots.total
        return Capacity(free=free, total=total)

    def cannot_place(self, gpu_type: str, gpu_count: int, location: str = "local") -> str | None:
        return cannot_place(self.nodes(), location, gpu_type, gpu_count)

    # -- lifecycle ------------------------------------------------------------------

    def command(self, spec: ReplicaSpec) -> list[str]:
        names = spec.served_names or (spec.model_name,)
        command = [
            PYTHON, "-m", "inferd.replica",
            "--model", self._model_source(spec.model_name),
            "--replica-id", spec.replica_id,
            "--endpoint-id", spec.endpoint_id,
            "--registry-url", self._registry_url,
            "--host", NODE_HOST,
            "--port", "0",
            "--device", "cpu" if spec.gpu_type == CPU else "cuda",
        ]  # fmt: skip
        for name in names:
            command += ["--served-model-name", name]
        if spec.gpu_type != CPU:
            # Indices as the replica sees them under Ray's CUDA_VISIBLE_DEVICES.
            command += ["--gpus", ",".join(str(i) for i in range(spec.gpu_count))]
        return command + self._replica_args

    def launch(self, spec: ReplicaSpec) -> LaunchedReplica:
        demand = replica_demand(spec.location, spec.gpu_type, spec.gpu_count)
        env = {**self._env, "INFERD_REPLICA_SECRET": spec.secret}
        if spec.gpu_type == CPU:
            env["CUDA_VISIBLE_DEVICES"] = ""
        actor = self._remote_host.options(
            name=actor_name(spec.replica_id),
            namespace=self._namespace,
            lifetime="detached",
            max_restarts=0,
            num_cpus=0,
            num_gpus=demand.num_gpus,
            resources=demand.resources,
        ).remote(
            spec.replica_id,
            self.command(spec),
            env,
            self._model_source(spec.model_name),
            self._linger_s,
        )
        self._placed[spec.replica_id] = _Placed(
            spec.replica_id,
            actor,
            waiting=actor.wait.remote(),
            started=actor.start.remote(),
            gpu_type=spec.gpu_type,
            location=spec.location,
        )
        logger.info(
            "placing replica %s on Ray (%s x %s in %s)",
            spec.replica_id,
            spec.gpu_count,
            spec.gpu_type,
            spec.location,
        )
        return LaunchedReplica(spec.replica_id, pid=0, gpu_ids=(), host="ray")

    def adopt(self, replica_id: str, pid: int, gpu_ids: tuple[int, ...]) -> bool:
        try:
            actor = ray.get_actor(actor_name(replica_id), namespace=self._namespace)
            info = ray.get(actor.info.remote(), timeout=_ACTOR_CALL_TIMEOUT_S)
        except (ValueError, RayError) as exc:
            logger.info("replica %s is not on the cluster any more (%s)", replica_id, exc)
            return False
        if not info["running"]:
            self._remove(actor)
            return False
        self._placed[replica_id] = _Placed(
            replica_id,
            actor,
            waiting=actor.wait.remote(),
            started=None,
            gpu_type="",
            location="",
            node_id=info["nodeId"],
            node_ip=info["nodeIp"],
        )
        logger.info("adopted replica %s (actor %s)", replica_id, actor_name(replica_id))
        return True

    def sweep_orphans(self, keep: Iterable[str]) -> list[str]:
        """Remove this namespace's replica actors that are not in `keep`
        (left by a control plane that crashed between placing a replica and
        recording it). Returns the replica ids removed."""
        wanted = {actor_name(r) for r in keep}
        removed = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] != self._namespace or not name.startswith(ACTOR_PREFIX):
                continue
            if name in wanted:
                continue
            with contextlib.suppress(ValueError, RayError):
                self._remove(ray.get_actor(name, namespace=self._namespace))
                removed.append(name[len(ACTOR_PREFIX) :])
        if removed:
            logger.warning("removed %d replica actor(s) the store did not know", len(removed))
        return removed

    def stop(self, replica_id: str, grace_s: float) -> None:
        placed = self._placed.get(replica_id)
        if placed is None or placed.kill_at is not None:
            return
        placed.kill_at = self._clock() + grace_s
        placed.actor.terminate.remote()  # the replica drains, then exits

    def kill(self, replica_id: str) -> None:
        placed = self._placed.get(replica_id)
        if placed is not None:
            self._remove(placed.actor)

    def _remove(self, actor: Any) -> None:
        """The replica's process group first (a `ray.kill` alone leaves a
        child of the actor in a session of its own alive), then the actor,
        which gives its resources back."""
        with contextlib.suppress(RayError, GetTimeoutError):
            ray.get(actor.kill.remote(), timeout=_ACTOR_CALL_TIMEOUT_S)
        with contextlib.suppress(RayError, ValueError):
            ray.kill(actor, no_restart=True)

    def running(self) -> list[str]:
        return list(self._placed)

    def node_of(self, replica_id: str) -> str | None:
        """The address of the node a replica was placed on, once known."""
        placed = self._placed.get(replica_id)
        return placed.node_ip if placed else None

    def reap(self) -> list[ExitedReplica]:
        if not self._placed:
            return []
        self._note_starts()
        now = self._clock()
        for placed in self._placed.values():
            if placed.kill_at is not None and now >= placed.kill_at:
                logger.warning("replica %s did not drain in time; killing it", placed.replica_id)
                placed.kill_at = float("inf")
                self._remove(placed.actor)
        refs = [p.waiting for p in self._placed.values()]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if not done:
            return []
        by_ref = {p.waiting: p for p in self._placed.values()}
        exited = []
        alive_nodes: set[str] | None = None
        for ref in done:
            placed = by_ref[ref]
            try:
                returncode, tail = ray.get(ref, timeout=_ACTOR_CALL_TIMEOUT_S)
            except RayActorError as exc:
                if alive_nodes is None:
                    alive_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
                returncode, tail = None, self._death_reason(placed, exc, alive_nodes)
            except RayError as exc:
                returncode, tail = None, f"the replica's Ray actor failed: {_first_line(exc)}"
            del self._placed[placed.replica_id]
            self._remove(placed.actor)  # its GPUs are free again
            exited.append(ExitedReplica(placed.replica_id, returncode, tail))
        return exited

    def _note_starts(self) -> None:
        """Record where replicas were placed, as their actors start."""
        pending = [p for p in self._placed.values() if p.started is not None]
        if not pending:
            return
        done, _ = ray.wait([p.started for p in pending], num_returns=len(pending), timeout=0)
        started = {p.started: p for p in pending}
        for ref in done:
            placed = started[ref]
            placed.started = None
            with contextlib.suppress(RayError):
                info = ray.get(ref, timeout=_ACTOR_CALL_TIMEOUT_S)
                placed.node_id, placed.node_ip = info["nodeId"], info["nodeIp"]
                logger.info(
                    "replica %s runs on node %s (%s), CUDA_VISIBLE_DEVICES=%r",
                    placed.replica_id,
                    info["nodeIp"],
                    info["nodeId"][:12],
                    info["cudaVisibleDevices"],
                )

    @staticmethod
    def _death_reason(placed: _Placed, exc: Exception, alive_nodes: set[str]) -> str:
        if placed.node_id is not None and placed.node_id not in alive_nodes:
            return f"node {placed.node_ip} ({placed.node_id[:12]}) left the Ray cluster"
        return f"the replica's Ray actor died: {_first_line(exc)}"

    def shutdown(self, grace_s: float) -> None:
        for replica_id in list(self._placed):
            self.stop(replica_id, grace_s)
        deadline = self._clock() + grace_s + 5
        while self._placed and self._clock() < deadline:
            self.reap()
            time.sleep(0.05)
        for placed in list(self._placed.values()):
            self._remove(placed.actor)
        self._placed.clear()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
