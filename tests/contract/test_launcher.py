"""One behaviour for every launcher: the `Launcher` port's contract.

Run against the shipped `FakeLauncher`, the `LocalLauncher` (real replica
processes on the fake engine) and the `RayLauncher` (replicas as actors on a
local Ray cluster); a launcher joins by adding a harness.
A harness plays what differs: how to build the launcher, and how to wait for
a replica to be up (a real replica reports to a registry; a fake one is up
at once). The fake launcher's replicas obey a stop at once (`drains_on_stop`),
as a healthy replica would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.control.fakes import FakeLauncher
from inferd.control.launchers.local import LocalLauncher
from inferd.control.ports import ExitReason, Launcher, PlacementKey, ReplicaExit, ReplicaHandle
from inferd.replica.config import ModelSource, ReplicaSettings, ReplicaSpec
from inferd.vocab import ModelKind
from tests.support import FakeRegistry

pytestmark = pytest.mark.anyio


class Harness:
    name: str

    def launcher(self, slots: int) -> Launcher:
        raise NotImplementedError

    async def up(self, handle: ReplicaHandle) -> None:
        """Until the replica serves (it handles a stop by draining then)."""


class FakeHarness(Harness):
    name = "fake"

    def launcher(self, slots: int) -> Launcher:
        return FakeLauncher(slots, drains_on_stop=True)


class LocalHarness(Harness):
    name = "local"

    def __init__(self, registry: FakeRegistry, tmp_path: Path) -> None:
        self.registry = registry
        self.tmp_path = tmp_path

    def launcher(self, slots: int) -> Launcher:
        return LocalLauncher(
            settings=ReplicaSettings(
                registry_url=self.registry.url,
                report_interval_s=0.2,
                replica_args="--engine fake --no-warmup",
            ),
            log_dir=self.tmp_path / "logs",
            cpu_slots=slots,
            poll_s=0.05,
        )

    async def up(self, handle: ReplicaHandle) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(
                r["replicaId"] == handle.replica_id and r["status"] == "ready"
                for r in self.registry.reports
            ):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"replica {handle.replica_id} never became ready")


class RayHarness(LocalHarness):
    """Replicas as actors on the session's local Ray cluster: each launcher
    gets a node of its own in location `local` with `slots` CPU replica
    slots (removed after the test), and a namespace of its own."""

    name = "ray"

    def __init__(self, registry: FakeRegistry, tmp_path: Path, cluster: Any) -> None:
        super().__init__(registry, tmp_path)
        self.cluster = cluster
        self.node: str | None = None

    def launcher(self, slots: int) -> Launcher:
        from inferd.control.launchers.ray_launcher import RayLauncher
        from inferd.testing.cluster import FakeNode

        self.node = f"contract-{self.tmp_path.name}"
        self.cluster.add(self.node, FakeNode("local", None, 0, cpu_slots=slots))
        return RayLauncher(
            address=self.cluster.address,
            namespace=f"inferd-contract-{self.tmp_path.name}",
            settings=ReplicaSettings(
                registry_url=self.registry.url,
                report_interval_s=0.2,
                replica_args="--engine fake --no-warmup",
            ),
        )

    def close(self) -> None:
        if self.node is not None:
            self.cluster.remove(self.node)


@pytest.fixture(params=["fake", "local", "ray"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "fake":
        yield FakeHarness()
        return
    registry = FakeRegistry()
    try:
        if request.param == "local":
            yield LocalHarness(registry, tmp_path)
            return
        ray_harness = RayHarness(registry, tmp_path, request.getfixturevalue("ray_cluster"))
        try:
            yield ray_harness
        finally:
            ray_harness.close()
    finally:
        registry.stop()


def spec(rid: str, *, location: str = "local") -> ReplicaSpec:
    model = ModelSource("tiny-chat", ModelKind.CHAT, "builtin:tiny-chat")
    return ReplicaSpec(rid, "ep-1", model, "cpu", 1, secret=f"secret-{rid}", location=location)


async def next_exit(exits: AsyncIterator[ReplicaExit], timeout: float = 30) -> ReplicaExit:
    return await asyncio.wait_for(anext(exits), timeout)


async def launched(harness: Harness, slots: int = 2) -> tuple[Launcher, Any]:
    launcher = harness.launcher(slots)
    return launcher, launcher.exits()


async def test_launch_takes_capacity_and_a_full_launcher_says_why(harness: Harness) -> None:
    launcher, _ = await launched(harness, slots=1)
    try:
        key = PlacementKey("local", "cpu")
        assert (await launcher.capacity()).free[key] == 1
        assert await launcher.cannot_place("local", "cpu", 1) is None
        handle = await launcher.launch(spec("r-a"))
        assert handle.replica_id == "r-a" and handle.node
        assert all(isinstance(v, str) for v in handle.placement.values())
        assert (await launcher.capacity()).free[key] == 0
        assert await launcher.cannot_place("local", "cpu", 1)  # a reason, for people
        assert await launcher.cannot_place("elsewhere", "cpu", 1)
        with pytest.raises(RuntimeError):
            await launcher.launch(spec("r-b"))
    finally:
        await launcher.shutdown(5)


async def test_stop_drains_and_the_exit_comes_once_with_its_reason(harness: Harness) -> None:
    launcher, exits = await launched(harness)
    try:
        handle = await launcher.launch(spec("r-a"))
        await harness.up(handle)
        await launcher.stop(handle, grace_s=20)
        await launcher.stop(handle, grace_s=20)  # idempotent
        exited = await next_exit(exits)
        assert (exited.replica_id, exited.reason, exited.returncode) == (
            "r-a",
            ExitReason.STOPPED,
            0,
        )
        assert await launcher.cannot_place("local", "cpu", 2) is None  # its slot is free
    finally:
        await launcher.shutdown(5)


async def test_kill_ends_it_now(harness: Harness) -> None:
    launcher, exits = await launched(harness)
    try:
        handle = await launcher.launch(spec("r-a"))
        await launcher.kill(handle)
        await launcher.kill(handle)  # idempotent
        exited = await next_exit(exits)
        assert (exited.replica_id, exited.reason) == ("r-a", ExitReason.KILLED)
    finally:
        await launcher.shutdown(5)


async def test_adopt_refuses_what_is_not_running(harness: Harness) -> None:
    launcher, _ = await launched(harness)
    try:
        assert await launcher.adopt(ReplicaHandle("r-never", "local", {})) is False
        assert await launcher.adopt(ReplicaHandle("r-never", "fake", {"pid": "1"})) is False
    finally:
        await launcher.shutdown(5)


async def test_shutdown_ends_every_replica_and_the_exits(harness: Harness) -> None:
    launcher, exits = await launched(harness)
    for rid in ("r-a", "r-b"):
        await harness.up(await launcher.launch(spec(rid)))
    await launcher.shutdown(10)
    ended = [e async for e in exits]  # the iterator ends after shutdown
    assert sorted(e.replica_id for e in ended) == ["r-a", "r-b"]
    with pytest.raises(RuntimeError):
        await launcher.launch(spec("r-c"))
