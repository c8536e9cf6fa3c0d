"""Fixtures shared by the reliability tests (issue 5). Append new ones; the
helpers that are not fixtures live in modules next to this file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferd.gateway.settings import GatewaySettings
from inferd.testing import ReplicaHandle, ServeHandle
from tests.reliability.fault_support import GatewayInFront

# -- `inferd serve` with fake-engine replicas, tuned for short waits ---------

# Control-plane faults are about the control plane: fake-engine replicas
# (a "token" every 20 ms), short health and reconcile periods.
FAST_SERVE = {
    "replica_args": "--engine fake --engine-arg token_delay_s=0.02",
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.1",
    "replica_drain_timeout_seconds": "10",
    "autoscale_upscale_delay_seconds": "0.5",
    "autoscale_downscale_delay_seconds": "1",
}


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Callable[..., ServeHandle]]:
    """serve_factory(**settings) -> a started `inferd serve` (FAST_SERVE
    overridden by `settings`). Every one is stopped at the end of the test,
    and none may leave a replica process behind."""
    handles: list[ServeHandle] = []

    def start(**settings: str) -> ServeHandle:
        settings = {**FAST_SERVE, **settings}
        handle = ServeHandle(tmp_path / f"serve-{len(handles)}", settings=settings)
        handles.append(handle)
        return handle.start()

    yield start
    for handle in handles:
        handle.cleanup()
    assert [pid for handle in handles for pid in handle.launched_pids()] == []


# -- the gateway alone, in front of given replica processes -------------------


@pytest.fixture
def gateway_in_front() -> Iterator[Callable[..., GatewayInFront]]:
    """gateway_in_front(kind, model, replicas, settings=None) -> a running
    gateway; stopped at the end of the test."""
    started: list[GatewayInFront] = []

    def start(
        kind: str,
        model: str,
        replicas: list[ReplicaHandle],
        settings: GatewaySettings | None = None,
    ) -> GatewayInFront:
        gateway = GatewayInFront(kind, model, replicas, settings or GatewaySettings())
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
