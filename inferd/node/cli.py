"""`inferd node start`: join (or start) a Ray cluster as a node that declares
where it is and what it has, so that the Ray launcher places an endpoint's
replicas only on nodes of its location and GPU type.

It wraps `ray start`: the node's GPUs are detected (`nvidia-smi`, as the
local launcher does), matched to a catalog GPU type, and declared with the
location as Ray custom resources (`location:<name>`, `gpu_type:<type>`; see
`inferd.control.launchers.ray_resources`). `--dry-run` prints the `ray
start` command instead, for operators who start Ray their own way.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inferd.catalog import CatalogError, GpuCatalog
from inferd.catalog.gpus import load_gpus
from inferd.control.launchers.inventory import LocalGpu, detect_gpus, match_gpu_type
from inferd.control.launchers.ray_resources import CPU, node_resources
from inferd.paths import default_configs_dir
from inferd.replica.groups import sweep

DEFAULT_HEAD_PORT = 6379


class NodeError(ValueError):
    """A node cannot be started as asked (the message says why)."""


@dataclass(frozen=True)
class NodePlan:
    location: str
    gpu_type: str | None  # None: no GPUs (CPU replica slots only, or nothing)
    gpu_count: int
    cpu_slots: int
    # What fails together with this node (a rack, a zone); replicas of one
    # endpoint are spread across these first.
    failure_domain: str | None = None


def plan_node(
    catalog: GpuCatalog,
    *,
    location: str,
    detected: Sequence[LocalGpu],
    gpu_type: str | None = None,
    gpu_count: int | None = None,
    cpu_slots: int = 0,
) -> NodePlan:
    """What the node declares. Detected GPUs are matched to catalog types; a
    node declares one GPU type (Ray hands out GPU indices, not types, so two
    types on one node could not be told apart): start one node per type,
    each with its own CUDA_VISIBLE_DEVICES. `gpu_type`/`gpu_count` override
    detection (a machine whose GPUs the catalog does not name, or a test)."""
    if location not in catalog.locations:
        known = ", ".join(catalog.locations)
        raise NodeError(f"unknown location '{location}'; known locations: {known}")
    offers = catalog.locations[location].offers
    if gpu_type is None:
        types = {match_gpu_type(gpu, catalog.gpu_types) for gpu in detected}
        if None in types:
            names = ", ".join(sorted({g.name for g in detected}))
            raise NodeError(
                f"no catalog GPU type matches this node's GPUs ({names}); name one with --gpu-type"
            )
        if len(types) > 1:
            raise NodeError(
                f"this node has GPUs of several types ({', '.join(sorted(map(str, types)))}); "
                "start one node per type, each with its own CUDA_VISIBLE_DEVICES"
            )
        gpu_type = types.pop() if types else None
        if gpu_count is None:
            gpu_count = len(detected)
    elif gpu_type not in catalog.gpu_types or gpu_type == CPU:
        raise NodeError(f"unknown GPU type '{gpu_type}'; known: {', '.join(catalog.gpu_types)}")
    elif gpu_count is None:
        gpu_count = len(detected)
    if gpu_type is not None and gpu_count < 1:
        raise NodeError(f"--gpu-type {gpu_type} needs --gpu-count (no GPU was detected)")
    if gpu_type is not None and gpu_type not in offers:
        raise NodeError(
            f"location '{location}' does not offer {gpu_type} "
            f"(configs/locations.yaml offers there: {', '.join(offers)})"
        )
    if cpu_slots and CPU not in offers:
        raise NodeError(f"location '{location}' does not offer CPU replicas")
    return NodePlan(location, gpu_type, gpu_count or 0, cpu_slots)


def declared_resources(plan: NodePlan) -> dict[str, float]:
    resources = node_resources(plan.location, plan.gpu_type, plan.gpu_count, plan.failure_domain)
    resources.update(node_resources(plan.location, CPU if plan.cpu_slots else None, plan.cpu_slots))
    return resources


def ray_start_command(
    plan: NodePlan,
    *,
    head: bool,
    address: str | None,
    ray: str = "ray",
    port: int = DEFAULT_HEAD_PORT,
    node_ip_address: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    command = [ray, "start"]
    if head:
        # No dashboard: inferd reads the cluster through the GCS, not the
        # State API, and the dashboard costs a process and a port per head.
        command += ["--head", f"--port={port}", "--include-dashboard=false"]
    else:
        if not address:
            raise NodeError("a node that is not the head needs --address HEAD:PORT")
        command += [f"--address={address}"]
    if node_ip_address:
        command += [f"--node-ip-address={node_ip_address}"]
    # Ray counts the GPUs it hands out; it must count exactly the declared ones.
    command += [f"--num-gpus={plan.gpu_count if plan.gpu_type else 0}"]
    command += [f"--resources={json.dumps(declared_resources(plan), sort_keys=True)}"]
    return command + list(extra)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    node = subparsers.add_parser("node", help="run this machine as a node of a Ray cluster")
    verbs = node.add_subparsers(dest="verb", metavar="VERB", required=True)
    start = verbs.add_parser(
        "start",
        help="start a Ray node that declares its location and GPU type (wraps `ray start`)",
        description="Start a Ray head (--head) or join a cluster (--address), declaring this "
        "node's location and its GPUs, detected and matched to the catalog's GPU types, "
        "as Ray resources. Arguments after `--` go to `ray start` as they are.",
    )
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start a new cluster's head node")
    role.add_argument("--address", help="join the cluster whose head is at HOST:PORT")
    start.add_argument("--location", required=True, help="catalog location of this node")
    start.add_argument("--gpu-type", help="catalog GPU type (default: detected)")
    start.add_argument("--gpu-count", type=int, help="GPUs to declare (default: all detected)")
    start.add_argument(
        "--cpu-slots", type=int, default=0, help="CPU-only replicas this node runs (gpuType cpu)"
    )
    start.add_argument(
        "--failure-domain",
        help="what fails together with this node (rack, zone): an endpoint's replicas are "
        "spread across failure domains first, then across nodes",
    )
    start.add_argument("--port", type=int, default=DEFAULT_HEAD_PORT, help="head's GCS port")
    start.add_argument("--node-ip-address", help="this node's address as the cluster sees it")
    start.add_argument("--configs-dir", type=Path, help="GPU types and locations directory")
    start.add_argument("--dry-run", action="store_true", help="print the `ray start` command")
    start.add_argument("ray_args", nargs=argparse.REMAINDER, help="-- then `ray start` flags")
    start.set_defaults(func=cmd_start)


def _ray_executable() -> str:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def cmd_start(args: argparse.Namespace) -> int:
    try:
        catalog = load_gpus(args.configs_dir or default_configs_dir())
        detected = [] if args.gpu_type and args.gpu_count is not None else detect_gpus()
        plan = plan_node(
            catalog,
            location=args.location,
            detected=detected,
            gpu_type=args.gpu_type,
            gpu_count=args.gpu_count,
            cpu_slots=args.cpu_slots,
        )
        if args.failure_domain:
            plan = replace(plan, failure_domain=args.failure_domain)
        extra = [a for a in args.ray_args if a != "--"]
        command = ray_start_command(
            plan,
            head=args.head,
            address=args.address,
            ray=_ray_executable(),
            port=args.port,
            node_ip_address=args.node_ip_address,
            extra=extra,
        )
    except (NodeError, CatalogError) as exc:
        print(f"inferd node start: {exc}", file=sys.stderr)
        return 2
    what = f"{plan.gpu_count} x {plan.gpu_type}" if plan.gpu_type else "no GPUs"
    print(f"node in {plan.location}: {what}, {plan.cpu_slots} CPU replica slot(s)", flush=True)
    print(shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    # Whatever ended replicas left on this machine (a node that died with
    # them) goes before the node takes new ones.
    sweep()
    return subprocess.call(command, env=os.environ.copy())
