"""The local launcher with real replica processes (fake engine): placement,
drain on stop, forced kill past the grace period, adoption by PID, and no
orphan processes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd import procfs
from inferd.control.launchers.base import ReplicaSpec
from inferd.control.launchers.inventory import LocalGpu
from inferd.control.launchers.local import LocalLauncher
from tests.support import FakeRegistry


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    reg = FakeRegistry()
    yield reg
    reg.stop()


def make_launcher(registry: FakeRegistry, tmp_path: Path, **kwargs: object) -> LocalLauncher:
    return LocalLauncher(
        registry_url=registry.url,
        log_dir=tmp_path / "logs",
        replica_args=["--engine", "fake", "--report-interval", "0.2"],
        **kwargs,  # type: ignore[arg-type]
    )


def spec(rid: str, gpu_type: str = "cpu", count: int = 1) -> ReplicaSpec:
    return ReplicaSpec(rid, "ep-1", "tiny-chat", gpu_type, count, secret=f"secret-{rid}")


alive = procfs.alive  # a zombie is dead for our purposes


def wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_capacity_and_placement_refusals(registry: FakeRegistry, tmp_path: Path) -> None:
    gpus = [(LocalGpu(0, "NVIDIA L4", 23034), "L4"), (LocalGpu(1, "NVIDIA L4", 23034), "L4")]
    launcher = make_launcher(registry, tmp_path, gpus=gpus, cpu_slots=1)
    assert launcher.capacity().total == {"cpu": 1, "L4": 2}
    assert launcher.cannot_place("L4", 2) is None
    assert "has 2 L4" in (launcher.cannot_place("L4", 4) or "")
    assert "has 0 H100-80GB" in (launcher.cannot_place("H100-80GB", 1) or "")
    assert launcher.command(spec("x", "L4", 2), (0, 1))[-6:-4] == ["--gpus", "0,1"]


def test_launch_report_stop_drains_and_frees_the_slot(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    launcher = make_launcher(registry, tmp_path, cpu_slots=1)
    launched = launcher.launch(spec("r-a"))
    try:
        assert launcher.cannot_place("cpu", 1) is not None  # the one slot is taken
        wait_for(lambda: any(r["status"] == "ready" for r in registry.reports), 30)
        ready = next(r for r in registry.reports if r["status"] == "ready")
        assert ready["replicaId"] == "r-a" and ready["pid"] == launched.pid
        assert registry.auth[-1] == "Bearer secret-r-a"  # the secret, by environment
        launcher.stop("r-a", grace_s=20)
        exited: list[object] = []
        wait_for(lambda: exited.extend(launcher.reap()) or exited, 20)
        assert exited[0].returncode == 0  # type: ignore[attr-defined]
        assert registry.statuses()[-2:] == ["draining", "stopped"]
        assert launcher.cannot_place("cpu", 1) is None
        assert not alive(launched.pid)
    finally:
        launcher.shutdown(5)


def test_a_replica_that_will_not_drain_is_killed_after_the_grace(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    launcher = make_launcher(registry, tmp_path)
    launched = launcher.launch(spec("r-b"))
    try:
        wait_for(lambda: any(r["status"] == "ready" for r in registry.reports), 30)
        os.kill(launched.pid, signal.SIGSTOP)  # hangs: SIGTERM will not be handled
        launcher.stop("r-b", grace_s=0.5)
        exited: list[object] = []
        wait_for(lambda: exited.extend(launcher.reap()) or exited, 10)
        assert exited[0].returncode == -signal.SIGKILL  # type: ignore[attr-defined]
        assert not alive(launched.pid)
    finally:
        launcher.shutdown(5)


def test_adopt_after_restart_and_refuse_a_stranger(registry: FakeRegistry, tmp_path: Path) -> None:
    first = make_launcher(registry, tmp_path)
    launched = first.launch(spec("r-c"))
    try:
        wait_for(lambda: any(r["status"] == "ready" for r in registry.reports), 30)
        # A new launcher (the control plane restarted) takes the process over.
        second = make_launcher(registry, tmp_path)
        assert second.adopt("r-c", launched.pid, ()) is True
        assert second.adopt("r-other", launched.pid, ()) is False  # PID is not that replica
        assert second.adopt("r-gone", 2**22 - 1, ()) is False
        assert second.running() == ["r-c"]
        second.stop("r-c", grace_s=10)
        exited: list[object] = []
        wait_for(lambda: exited.extend(second.reap()) or exited, 20)
        assert exited[0].returncode is None  # not our child: code unknown  # type: ignore[attr-defined]
        assert not alive(launched.pid)
    finally:
        first.shutdown(2)


def test_shutdown_leaves_no_process(registry: FakeRegistry, tmp_path: Path) -> None:
    launcher = make_launcher(registry, tmp_path)
    pids = [launcher.launch(spec(f"r-{i}")).pid for i in range(2)]
    wait_for(lambda: sum(r["status"] == "ready" for r in registry.reports) >= 2, 30)
    launcher.shutdown(10)
    assert launcher.running() == []
    assert not any(alive(pid) for pid in pids)
