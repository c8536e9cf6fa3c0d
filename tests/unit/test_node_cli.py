"""`inferd node start`: which GPU type and location a node declares, and the
`ray start` command that declares them (pure: GPUs passed in, nothing run)."""

from __future__ import annotations

import json

import pytest

from inferd.catalog import load_catalog
from inferd.control.launchers.inventory import LocalGpu
from inferd.node.cli import NodeError, NodePlan, plan_node, ray_start_command

GPUS = load_catalog().gpus
H100 = LocalGpu(0, "NVIDIA H100 80GB HBM3", 81559)
L4 = LocalGpu(1, "NVIDIA L4", 23034)


def test_detected_gpus_are_matched_to_the_catalog_type() -> None:
    plan = plan_node(GPUS, location="us-east", detected=[H100, H100])
    assert plan == NodePlan("us-east", "H100-80GB", 2, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"location": "mars", "detected": [H100]}, "unknown location 'mars'"),
        ({"location": "us-east", "detected": [H100, L4]}, "several types"),
        ({"location": "us-east", "detected": [LocalGpu(0, "Tesla K80", 12000)]}, "--gpu-type"),
        ({"location": "us-west", "detected": [], "gpu_type": "H200", "gpu_count": 1},
         "does not offer H200"),
        ({"location": "us-east", "detected": [], "gpu_type": "H200"}, "needs --gpu-count"),
        ({"location": "us-east", "detected": [], "gpu_type": "B300", "gpu_count": 1},
         "unknown GPU type"),
        ({"location": "local", "detected": [], "gpu_type": "L4", "gpu_count": 1},
         "does not offer L4"),
    ],
)  # fmt: skip
def test_a_node_that_cannot_be_declared_says_why(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(NodeError, match=message):
        plan_node(GPUS, **kwargs)  # type: ignore[arg-type]


def test_the_ray_start_command_declares_location_gpus_and_cpu_slots() -> None:
    plan = plan_node(GPUS, location="eu-west", detected=[], gpu_type="L4", gpu_count=1, cpu_slots=2)
    command = ray_start_command(plan, head=False, address="10.0.0.1:6379", extra=["--block"])
    assert command[:3] == ["ray", "start", "--address=10.0.0.1:6379"]
    assert "--num-gpus=1" in command and command[-1] == "--block"
    (resources,) = [a for a in command if a.startswith("--resources=")]
    assert json.loads(resources.split("=", 1)[1]) == {
        "location:eu-west": 1000.0,
        "gpu_type:L4": 1.0,
        "gpu_type:cpu": 2.0,
    }
    head = ray_start_command(
        plan_node(GPUS, location="us-east", detected=[]), head=True, address=None
    )
    assert "--head" in head and "--num-gpus=0" in head and "--include-dashboard=false" in head
    with pytest.raises(NodeError, match="--address"):
        ray_start_command(plan, head=False, address=None)


def test_a_node_declares_its_failure_domain() -> None:
    """`--failure-domain rack-7`: a marker resource the Ray launcher spreads
    an endpoint's replicas over before it spreads them over nodes."""
    import dataclasses

    plan = plan_node(GPUS, location="us-east", detected=[], gpu_type="H100-80GB", gpu_count=8)
    command = ray_start_command(
        dataclasses.replace(plan, failure_domain="rack-7"), head=False, address="h:6379"
    )
    (resources,) = [a for a in command if a.startswith("--resources=")]
    declared = json.loads(resources.split("=", 1)[1])
    assert declared["failure_domain:rack-7"] > 0
    assert declared["gpu_type:H100-80GB"] == 8.0
