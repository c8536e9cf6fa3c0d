"""Locations and GPU types as Ray resources: what nodes declare, what a
replica asks for, and what a cluster has free (pure; no Ray)."""

from __future__ import annotations

import pytest

from inferd.control.launchers.ray_resources import (
    NodeCapacity,
    Slots,
    by_location,
    cannot_place,
    node_capacity,
    node_resources,
    replica_demand,
    spread_choice,
)


def test_a_node_declares_its_location_and_gpu_units() -> None:
    assert node_resources("us-east", "H100-80GB", 8) == {
        "location:us-east": 1000.0,
        "gpu_type:H100-80GB": 8.0,
    }
    assert node_resources("eu-west", None, 0) == {"location:eu-west": 1000.0}


@pytest.mark.parametrize(
    ("gpu_type", "count", "num_gpus", "resources"),
    [
        ("H100-80GB", 2, 2, {"location:us-east": 0.001, "gpu_type:H100-80GB": 2.0}),
        ("cpu", 1, 0, {"location:us-east": 0.001, "gpu_type:cpu": 1.0}),
        ("cpu", 4, 0, {"location:us-east": 0.001, "gpu_type:cpu": 1.0}),  # one slot
    ],
)
def test_a_replica_asks_for_its_gpus_type_and_location(
    gpu_type: str, count: int, num_gpus: int, resources: dict[str, float]
) -> None:
    demand = replica_demand("us-east", gpu_type, count)
    assert (demand.num_gpus, demand.resources) == (num_gpus, resources)


def test_node_capacity_reads_rays_total_and_available_mappings() -> None:
    node = node_capacity(
        "n1",
        "10.0.0.5",
        {"location:us-east": 1000.0, "gpu_type:H100-80GB": 8.0, "GPU": 8.0, "CPU": 32.0},
        # Ray omits a resource that is fully used.
        {"location:us-east": 999.998, "GPU": 6.0, "CPU": 32.0},
    )
    assert node == NodeCapacity("n1", "10.0.0.5", "us-east", {"H100-80GB": 8}, {"H100-80GB": 0})
    head = node_capacity("h", "10.0.0.1", {"CPU": 0.0, "memory": 1.0}, {})
    assert head.location is None and dict(head.total) == {}


NODES = [
    NodeCapacity("a", "ip", "us-east", {"H100-80GB": 2, "cpu": 1}, {"H100-80GB": 0, "cpu": 1}),
    NodeCapacity("b", "ip", "us-east", {"H100-80GB": 1}, {"H100-80GB": 1}),
    NodeCapacity("c", "ip", "eu-west", {"L4": 1}, {"L4": 1}),
    NodeCapacity("head", "ip", None, {}, {}),
]


def test_capacity_by_location_sums_nodes_and_keeps_the_largest_free() -> None:
    live = by_location(NODES)
    assert set(live) == {"us-east", "eu-west"}
    assert live["us-east"]["H100-80GB"] == Slots(total=3, free=1, nodes=2, largest_free=1)
    assert live["us-east"]["cpu"] == Slots(total=1, free=1, nodes=1, largest_free=1)
    assert live["eu-west"]["L4"] == Slots(total=1, free=1, nodes=1, largest_free=1)


@pytest.mark.parametrize(
    ("location", "gpu_type", "count", "reason"),
    [
        ("us-east", "H100-80GB", 1, None),
        ("eu-west", "L4", 1, None),
        ("us-east", "cpu", 1, None),
        (
            "us-east",
            "H100-80GB",
            2,
            "no node in location 'us-east' has 2 H100-80GB GPU(s) free: "
            "1 of 3 free on 2 node(s), at most 1 on one",
        ),
        (
            "us-east",
            "L4",
            1,
            "no node of the cluster in location 'us-east' has L4 "
            "(a replica needs 1 L4 GPU(s) on one node)",
        ),
        (
            "us-west",
            "cpu",
            1,
            "no node of the cluster in location 'us-west' has cpu "
            "(a replica needs 1 CPU replica slot(s) on one node)",
        ),
    ],
)
def test_cannot_place_names_location_type_and_count(
    location: str, gpu_type: str, count: int, reason: str | None
) -> None:
    assert cannot_place(NODES, location, gpu_type, count) == reason


def _node(
    node_id: str, free: int, domain: str | None = None, location: str = "us-east"
) -> NodeCapacity:
    return NodeCapacity(node_id, "ip", location, {"cpu": 2}, {"cpu": free}, domain)


@pytest.mark.parametrize(
    ("nodes", "peers", "chosen", "why"),
    [
        ([_node("a", 2), _node("b", 2)], {}, "a", "a tie goes to the node id"),
        ([_node("a", 1), _node("b", 2)], {}, "b", "else the most free slots"),
        ([_node("a", 2), _node("b", 1)], {"a": 1}, "b", "a node without the endpoint first"),
        ([_node("a", 1), _node("b", 0)], {"a": 1}, "a", "one node only when it is the only one"),
        ([_node("a", 0), _node("b", 0)], {}, None, "no room anywhere"),
        (
            [_node("a", 2, "rack1"), _node("b", 2, "rack1"), _node("c", 1, "rack2")],
            {"a": 1},
            "c",
            "another failure domain before another node of the same",
        ),
        (
            [_node("a", 2, "rack1"), _node("b", 2, "rack1"), _node("c", 0, "rack2")],
            {"a": 1, "c": 1},
            "b",
            "then another node of the domain",
        ),
        ([_node("a", 2, location="eu-west"), _node("b", 1)], {}, "b", "only its location"),
    ],
)
def test_an_endpoints_replicas_spread_over_domains_then_nodes(
    nodes: list[NodeCapacity], peers: dict[str, int], chosen: str | None, why: str
) -> None:
    assert spread_choice(nodes, "us-east", "cpu", 1, peers) == chosen, why


def test_a_node_declares_its_failure_domain_and_capacity_reads_it() -> None:
    declared = node_resources("us-east", "L4", 1, "rack-7")
    assert declared["failure_domain:rack-7"] > 0
    node = node_capacity("n", "ip", declared, declared)
    assert (node.location, node.failure_domain) == ("us-east", "rack-7")
