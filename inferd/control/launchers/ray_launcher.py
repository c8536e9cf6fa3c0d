"""Replicas on a Ray cluster: one named, detached actor per replica.

Ray places and watches; it is never in the request path. Each replica is a
`ReplicaHost` actor named `inferd-replica-<id>` in the launcher's namespace,
asking for the replica's GPUs (`num_gpus`, so Ray sets CUDA_VISIBLE_DEVICES)
and for its endpoint's location and GPU type as custom resources (see
`ray_resources`), which only nodes started in that location with GPUs of
that type have. The actor runs the same replica process the local launcher
runs (`config_for` + `to_argv`), bound to its node's address; the replica
reports that URL to the registry and the gateway proxies to it directly.

Watching, in three layers: the actor's `wait()` returns when the replica
process ends (its exit code); Ray fails that call with `ActorDiedError` when
the actor or its node dies (measured here well under 0.1 s after a node
left); the registry's heartbeat is the backstop.

After a control-plane restart, `adopt` finds a replica's actor again by the
name its handle carries; actors of the namespace that the store does not
know are removed (`sweep_orphans`), as Ray Serve's controller rebuilds its
state from named actors.

Ray is imported here, and this module only when `--launcher ray` is chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ray
import ray._private.state
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from inferd.control.launchers.ray_host import NODE_HOST, PYTHON, ReplicaHost
from inferd.control.launchers.ray_resources import (
    CPU,
    NodeCapacity,
    Slots,
    by_location,
    cannot_place,
    node_capacity,
    replica_demand,
    spread_choice,
)
from inferd.control.ports import (
    Capacity,
    ExitReason,
    PlacementKey,
    ReplicaExit,
    ReplicaHandle,
)
from inferd.replica.config import SECRET_ENV, ReplicaSettings, ReplicaSpec, config_for, to_argv
from inferd.replica.groups import sweep

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "inferd-replica-"
# How long a call waits for an actor that should answer at once (a kill, an
# adoption's info): a lost node must not stall the reconciler longer.
ACTOR_CALL_TIMEOUT_S = 5.0
# How long a replica may wait to be placed and started before its launch is
# refused (Ray keeps an unplaceable actor pending forever).
START_TIMEOUT_S = 120.0


def actor_name(replica_id: str) -> str:
    return ACTOR_PREFIX + replica_id


@dataclass
class _Placed:
    replica_id: str
    endpoint_id: str
    actor: Any  # ray.actor.ActorHandle
    node_ip: str
    node_id: str
    ending: ExitReason | None = None  # set by stop (STOPPED) and kill (KILLED)
    watcher: asyncio.Task[None] | None = None
    killer: asyncio.Task[None] | None = None


class RayLauncher:
    def __init__(
        self,
        *,
        address: str,
        namespace: str,
        settings: ReplicaSettings,
        node_ip_address: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        linger_s: float = 60.0,
        spread: bool = True,
    ) -> None:
        """`spread`: an endpoint's replicas on different nodes where there
        is room (else Ray's default, which fills one node first)."""
        if not ray.is_initialized():
            _check_reachable(address)
            ray.init(
                address=address,
                namespace=namespace,
                _node_ip_address=node_ip_address,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        self._namespace = namespace
        self._settings = settings
        self._start_timeout_s = start_timeout_s
        self._linger_s = linger_s
        self._spread = spread
        # This machine's leftovers of ended replicas (the nodes sweep their
        # own as replicas are placed there).
        sweep()
        self._remote_host = ray.remote(ReplicaHost)
        self._placed: dict[str, _Placed] = {}
        # Replicas whose node is chosen and whose actor is not placed yet:
        # replica id -> (endpoint id, node id), so that replicas launched
        # together spread too.
        self._choosing: dict[str, tuple[str, str]] = {}
        self._exits: asyncio.Queue[ReplicaExit | None] = asyncio.Queue()
        self._closed = False

    # -- the cluster's capacity ------------------------------------------------------

    def nodes(self) -> list[NodeCapacity]:
        """Every alive node, with its location and GPUs by type (free ones as
        of now). Per-node free amounts come from the GCS directly: Ray's
        State API would need the dashboard running on the head."""
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

    def locations(self) -> dict[str, dict[str, Slots]]:
        return by_location(self.nodes())

    async def capacity(self) -> Capacity:
        live = await asyncio.to_thread(self.locations)
        free: dict[PlacementKey, int] = {}
        total: dict[PlacementKey, int] = {}
        for location, types in live.items():
            for gpu_type, slots in types.items():
                free[PlacementKey(location, gpu_type)] = slots.free
                total[PlacementKey(location, gpu_type)] = slots.total
        return Capacity(free=free, total=total)

    async def cannot_place(self, location: str, gpu_type: str, gpu_count: int) -> str | None:
        nodes = await asyncio.to_thread(self.nodes)
        return cannot_place(nodes, location, gpu_type, gpu_count)

    # -- lifecycle ---------------------------------------------------------------------

    def command(self, spec: ReplicaSpec) -> list[str]:
        """The replica's command line; the node's Python and address are
        filled in on the node."""
        gpu_ids = () if spec.gpu_type == CPU else tuple(range(spec.gpu_count))
        config = config_for(
            spec, self._settings, host=NODE_HOST, advertise_host=NODE_HOST, gpu_ids=gpu_ids
        )
        return [PYTHON, "-m", "inferd.replica", *to_argv(config)]

    def _peers(self, endpoint_id: str) -> dict[str, int]:
        """Node id -> replicas of this endpoint there (placed or being placed)."""
        peers: dict[str, int] = {}
        for placed in self._placed.values():
            if placed.endpoint_id == endpoint_id:
                peers[placed.node_id] = peers.get(placed.node_id, 0) + 1
        for endpoint, node_id in self._choosing.values():
            if endpoint == endpoint_id:
                peers[node_id] = peers.get(node_id, 0) + 1
        return peers

    async def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        if self._closed:
            raise RuntimeError("the launcher is shut down")
        nodes = await asyncio.to_thread(self.nodes)
        reason = cannot_place(nodes, spec.location, spec.gpu_type, spec.gpu_count)
        if reason is not None:
            raise RuntimeError(reason)
        # Spread: Ray alone packs a node before it uses the next, and a node
        # holding all of an endpoint's replicas takes the endpoint down with
        # it. The choice is soft: if that node filled up meanwhile, Ray
        # places the replica wherever it fits.
        if not self._spread:
            return await self._place(spec, "DEFAULT")
        node_id = spread_choice(
            nodes, spec.location, spec.gpu_type, spec.gpu_count, self._peers(spec.endpoint_id)
        )
        strategy: Any = "SPREAD"
        if node_id is not None:
            strategy = NodeAffinitySchedulingStrategy(node_id, soft=True)
            self._choosing[spec.replica_id] = (spec.endpoint_id, node_id)
        try:
            return await self._place(spec, strategy)
        finally:
            self._choosing.pop(spec.replica_id, None)

    async def _place(self, spec: ReplicaSpec, strategy: Any) -> ReplicaHandle:
        demand = replica_demand(spec.location, spec.gpu_type, spec.gpu_count)
        env = {SECRET_ENV: spec.secret}
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
            scheduling_strategy=strategy,
        ).remote(
            spec.replica_id,
            self.command(spec),
            env,
            spec.model.source,
            self._linger_s,
            endpoint_id=spec.endpoint_id,
        )
        try:
            info = await asyncio.wait_for(actor.start.remote(), self._start_timeout_s)
        except (TimeoutError, RayError) as exc:
            await self._remove(actor)
            raise RuntimeError(
                f"replica {spec.replica_id} was not placed and started on the Ray cluster: "
                f"{_first_line(exc) if isinstance(exc, RayError) else 'timed out'}"
            ) from None
        placed = self._track(spec.replica_id, actor, info)
        logger.info(
            "replica %s placed on node %s (%s) in %s, CUDA_VISIBLE_DEVICES=%r",
            spec.replica_id,
            placed.node_ip,
            placed.node_id[:12],
            spec.location,
            info["cudaVisibleDevices"],
        )
        return self._handle(placed)

    def _handle(self, placed: _Placed) -> ReplicaHandle:
        return ReplicaHandle(
            placed.replica_id,
            # The address alone does not tell apart nodes on one machine.
            node=f"{placed.node_ip} ({placed.node_id[:12]})",
            placement={
                "actor": actor_name(placed.replica_id),
                "namespace": self._namespace,
                "nodeId": placed.node_id,
            },
        )

    def _track(self, replica_id: str, actor: Any, info: Mapping[str, Any]) -> _Placed:
        placed = _Placed(
            replica_id, info.get("endpointId") or "", actor, info["nodeIp"], info["nodeId"]
        )
        self._placed[replica_id] = placed
        placed.watcher = asyncio.ensure_future(self._watch(placed))
        return placed

    async def _watch(self, placed: _Placed) -> None:
        """Until the replica ends; then its exit, once, and the actor goes."""
        try:
            returncode, detail = await placed.actor.wait.remote()
            reason = placed.ending or ExitReason.EXITED
        except RayActorError as exc:
            returncode = None
            reason = placed.ending or ExitReason.LOST
            detail = await asyncio.to_thread(self._death_reason, placed, exc)
        except RayError as exc:
            returncode, reason = None, placed.ending or ExitReason.LOST
            detail = f"the replica's Ray actor failed: {_first_line(exc)}"
        if placed.killer is not None:
            placed.killer.cancel()
        await self._remove(placed.actor)  # its GPUs are free again
        self._placed.pop(placed.replica_id, None)
        await self._exits.put(ReplicaExit(placed.replica_id, reason, returncode, detail))

    @staticmethod
    def _death_reason(placed: _Placed, exc: Exception) -> str:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        if placed.node_id not in alive:
            return f"node {placed.node_ip} ({placed.node_id[:12]}) left the Ray cluster"
        return f"the replica's Ray actor died: {_first_line(exc)}"

    async def adopt(self, handle: ReplicaHandle) -> bool:
        # By the name the replica id gives, whatever else the handle kept.
        name = actor_name(handle.replica_id)
        if self._closed:
            return False
        try:
            actor = ray.get_actor(name, namespace=self._namespace)
            info = await asyncio.wait_for(actor.info.remote(), ACTOR_CALL_TIMEOUT_S)
        except (ValueError, RayError, TimeoutError) as exc:
            logger.info("replica %s is not on the cluster any more (%s)", handle.replica_id, exc)
            return False
        if not info["running"]:
            logger.info("replica %s has ended (its actor is removed)", handle.replica_id)
            await self._remove(actor)
            return False
        self._track(handle.replica_id, actor, info)
        logger.info("adopted replica %s (actor %s)", handle.replica_id, name)
        return True

    async def sweep_orphans(
        self, keep: Iterable[str], confirm: Callable[[], Awaitable[None]] | None = None
    ) -> list[str]:
        """Remove this namespace's replica actors whose replica id is not in
        `keep` (left by a control plane that crashed between placing a
        replica and recording it). `confirm` runs before each removal and
        raises when this instance may no longer act (a deposed leader must
        not remove what its successor just placed). Returns the replica ids
        removed."""
        wanted = {actor_name(r) for r in keep} | {actor_name(r) for r in self._placed}
        named = await asyncio.to_thread(ray.util.list_named_actors, True)
        removed = []
        for entry in named:
            name = entry["name"]
            if entry["namespace"] != self._namespace or not name.startswith(ACTOR_PREFIX):
                continue
            if name in wanted:
                continue
            if confirm is not None:
                await confirm()
            with contextlib.suppress(ValueError, RayError):
                await self._remove(ray.get_actor(name, namespace=self._namespace))
                removed.append(name[len(ACTOR_PREFIX) :])
        if removed:
            logger.warning("removed %d replica actor(s) the store did not know", len(removed))
        return removed

    async def stop(self, handle: ReplicaHandle, grace_s: float) -> None:
        placed = self._placed.get(handle.replica_id)
        if placed is None or placed.ending is not None:
            return
        placed.ending = ExitReason.STOPPED
        placed.actor.terminate.remote()  # the replica drains, then exits

        async def kill_late() -> None:
            await asyncio.sleep(grace_s)
            logger.warning("replica %s did not drain in time; killing it", placed.replica_id)
            placed.ending = ExitReason.KILLED
            await self._remove(placed.actor)

        placed.killer = asyncio.ensure_future(kill_late())

    async def kill(self, handle: ReplicaHandle) -> None:
        placed = self._placed.get(handle.replica_id)
        if placed is None or placed.ending is ExitReason.KILLED:
            return
        placed.ending = ExitReason.KILLED
        await self._remove(placed.actor)

    async def _remove(self, actor: Any) -> None:
        """The replica's process group first (`ray.kill` alone would leave a
        child of the actor in a session of its own running), then the actor,
        which gives its resources back."""
        with contextlib.suppress(RayError, TimeoutError):
            await asyncio.wait_for(actor.kill.remote(), ACTOR_CALL_TIMEOUT_S)
        with contextlib.suppress(RayError, ValueError):
            ray.kill(actor, no_restart=True)

    async def exits(self) -> AsyncIterator[ReplicaExit]:
        while True:
            exited = await self._exits.get()
            if exited is None:
                return
            yield exited

    def running(self) -> list[str]:
        return list(self._placed)

    async def log_tail(self, replica_id: str, max_bytes: int) -> str | None:
        """Read on the replica's node, by its actor (the file is there)."""
        try:
            actor = ray.get_actor(actor_name(replica_id), namespace=self._namespace)
            tail: str | None = await asyncio.wait_for(
                actor.log_tail.remote(max_bytes), ACTOR_CALL_TIMEOUT_S
            )
        except (ValueError, RayError, TimeoutError):
            return None  # its actor is gone, and the file with its node's temp
        return tail

    async def shutdown(self, grace_s: float) -> None:
        self._closed = True
        placed = list(self._placed.values())
        for p in placed:
            await self.stop(self._handle(p), grace_s)
        watchers = [p.watcher for p in placed if p.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=grace_s + ACTOR_CALL_TIMEOUT_S + 5)
        await self._exits.put(None)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a wrong address: `ray.init` retries an unreachable GCS
    for minutes before it gives up."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and the like: Ray resolves those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address}: {exc}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
