"""One local Ray cluster for the whole session (starting one costs 10-30 s
and about 1 GB here): a head that takes no work and three nodes with fake
GPUs in two locations. Tests that remove a node put it back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import require_module

NODES = {
    # name: (location, GPU type, GPUs, CPU replica slots)
    "east-a": ("us-east", "H100-80GB", 2, 1),
    "east-b": ("us-east", "H100-80GB", 1, 1),
    "west": ("eu-west", "L4", 1, 1),
}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    require_module("ray", "the Ray launcher's tests need Ray (pip install 'inferd[ray]')")
    from inferd.testing_cluster import FakeNode, start_cluster

    cluster = start_cluster({name: FakeNode(*spec) for name, spec in NODES.items()})
    try:
        yield cluster
    finally:
        cluster.shutdown()
