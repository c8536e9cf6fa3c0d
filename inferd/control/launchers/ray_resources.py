"""Locations and GPU types as Ray resources, and what a cluster has free.

A node declares where it is and what it has as custom resources (`inferd
node start` sets them):

- `location:<name>`: a marker (a large amount; a replica asks for a sliver),
  so that a replica lands only in its endpoint's location;
- `gpu_type:<name>`: one unit per GPU of that catalog type (for `cpu`: one
  per CPU replica slot), so that a replica lands only on a node with enough
  GPUs of its type;
- `failure_domain:<name>` (optional): a marker for what fails together (a
  rack, a power feed, a zone), so that an endpoint's replicas are spread
  across domains before nodes.

A replica asks for `num_gpus` (Ray sets its CUDA_VISIBLE_DEVICES) plus both,
on one node. Resources rather than Ray's newer labels: resources are the
stable interface in Ray 2.x, and they are counted, which labels are not.

Everything here is pure: it reads the per-node resource mappings Ray
reports (total and available) and never imports Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LOCATION_PREFIX = "location:"
GPU_TYPE_PREFIX = "gpu_type:"
FAILURE_DOMAIN_PREFIX = "failure_domain:"
CPU = "cpu"
# The location marker's amount on a node, and a replica's share of it: a
# node holds up to this many replicas as far as the marker is concerned.
LOCATION_MARKER = 1000.0
LOCATION_SHARE = 0.001


def location_resource(location: str) -> str:
    return LOCATION_PREFIX + location


def gpu_type_resource(gpu_type: str) -> str:
    return GPU_TYPE_PREFIX + gpu_type


def node_resources(
    location: str, gpu_type: str | None, units: int, failure_domain: str | None = None
) -> dict[str, float]:
    """The custom resources a node declares: its location, `units` of its
    GPU type (GPUs, or CPU replica slots for `cpu`) and its failure domain."""
    resources = {location_resource(location): LOCATION_MARKER}
    if failure_domain:
        resources[FAILURE_DOMAIN_PREFIX + failure_domain] = LOCATION_MARKER
    if gpu_type is not None and units > 0:
        resources[gpu_type_resource(gpu_type)] = float(units)
    return resources


@dataclass(frozen=True)
class ReplicaDemand:
    """What one replica asks Ray for."""

    num_gpus: int
    resources: dict[str, float]


def replica_demand(location: str, gpu_type: str, gpu_count: int) -> ReplicaDemand:
    if gpu_type == CPU:
        return ReplicaDemand(
            0, {location_resource(location): LOCATION_SHARE, gpu_type_resource(CPU): 1.0}
        )
    return ReplicaDemand(
        gpu_count,
        {
            location_resource(location): LOCATION_SHARE,
            gpu_type_resource(gpu_type): float(gpu_count),
        },
    )


@dataclass(frozen=True)
class Slots:
    """GPUs of one type in one location (for `cpu`: CPU replica slots)."""

    total: int = 0
    free: int = 0
    nodes: int = 0
    # The most a single node has free: a replica cannot span nodes.
    largest_free: int = 0


@dataclass(frozen=True)
class NodeCapacity:
    node_id: str
    address: str
    location: str | None
    total: Mapping[str, int] = field(default_factory=dict)  # GPU type -> units
    free: Mapping[str, int] = field(default_factory=dict)
    # What fails together with this node; None: the node alone.
    failure_domain: str | None = None


def node_capacity(
    node_id: str, address: str, total: Mapping[str, float], available: Mapping[str, float]
) -> NodeCapacity:
    """One alive node's location and GPUs by type, from Ray's per-node
    resource mappings."""
    locations = sorted(k[len(LOCATION_PREFIX) :] for k in total if k.startswith(LOCATION_PREFIX))
    types: dict[str, int] = {}
    free: dict[str, int] = {}
    for key, amount in total.items():
        if key.startswith(GPU_TYPE_PREFIX):
            name = key[len(GPU_TYPE_PREFIX) :]
            types[name] = int(amount)
            # Ray leaves a fully used resource out of `available`.
            free[name] = int(available.get(key, 0.0) + 1e-9)
    domains = sorted(
        k[len(FAILURE_DOMAIN_PREFIX) :] for k in total if k.startswith(FAILURE_DOMAIN_PREFIX)
    )
    return NodeCapacity(
        node_id,
        address,
        locations[0] if locations else None,
        types,
        free,
        domains[0] if domains else None,
    )


def by_location(nodes: Iterable[NodeCapacity]) -> dict[str, dict[str, Slots]]:
    """location -> GPU type -> totals over the location's nodes."""
    out: dict[str, dict[str, Slots]] = {}
    for node in nodes:
        if node.location is None:
            continue
        types = out.setdefault(node.location, {})
        for gpu_type, total in node.total.items():
            seen = types.get(gpu_type, Slots())
            free = node.free.get(gpu_type, 0)
            types[gpu_type] = Slots(
                total=seen.total + total,
                free=seen.free + free,
                nodes=seen.nodes + 1,
                largest_free=max(seen.largest_free, free),
            )
    return out


def _units(gpu_type: str, count: int) -> str:
    if gpu_type == CPU:
        return f"{count} CPU replica slot(s)"
    return f"{count} {gpu_type} GPU(s)"


def cannot_place(
    nodes: Iterable[NodeCapacity], location: str, gpu_type: str, gpu_count: int
) -> str | None:
    """None when some node of `location` has `gpu_count` free units of
    `gpu_type` now; otherwise what is missing, naming location, type and
    count."""
    need = 1 if gpu_type == CPU else gpu_count
    slots = by_location(nodes).get(location, {}).get(gpu_type)
    if slots is None or slots.total == 0:
        return (
            f"no node of the cluster in location '{location}' has {gpu_type} "
            f"(a replica needs {_units(gpu_type, need)} on one node)"
        )
    if slots.largest_free >= need:
        return None
    return (
        f"no node in location '{location}' has {_units(gpu_type, need)} free: "
        f"{slots.free} of {slots.total} free on {slots.nodes} node(s), at most "
        f"{slots.largest_free} on one"
    )


def spread_choice(
    nodes: Sequence[NodeCapacity],
    location: str,
    gpu_type: str,
    gpu_count: int,
    peers: Mapping[str, int],
) -> str | None:
    """The node for an endpoint's next replica: among the nodes of its
    location with room for it, the one whose failure domain, then the node
    itself, holds the fewest of the endpoint's replicas (`peers`: node id ->
    replicas of this endpoint there); ties go to the node with the most free
    units, then to the node id (the same inputs give the same node). None
    when no node has room. One node is used twice only when it is the only
    one with room."""
    need = 1 if gpu_type == CPU else gpu_count
    candidates = [n for n in nodes if n.location == location and n.free.get(gpu_type, 0) >= need]
    if not candidates:
        return None
    in_domain: dict[str, int] = {}
    for node in nodes:
        if node.failure_domain is not None:
            in_domain[node.failure_domain] = in_domain.get(node.failure_domain, 0) + peers.get(
                node.node_id, 0
            )

    def rank(node: NodeCapacity) -> tuple[int, int, int, str]:
        own = peers.get(node.node_id, 0)
        domain = own if node.failure_domain is None else in_domain[node.failure_domain]
        return (domain, own, -node.free.get(gpu_type, 0), node.node_id)

    return min(candidates, key=rank).node_id
