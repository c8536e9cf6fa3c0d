"""What only the local launcher does, with real replica processes (fake
engine): GPU placement, CPU replicas' own cores, a forced kill past the
grace period, adoption by process id, the environment allow-list, and no
orphan processes. The
behaviour every launcher shares is in `tests/contract/test_launcher.py`."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferd import procfs
from inferd.control.launchers.cpu_cores import BIND_ENV, slot_cores, usable_cores
from inferd.control.launchers.inventory import LocalGpu
from inferd.control.launchers.local import LocalLauncher, replica_environment
from inferd.control.ports import ExitReason, PlacementKey, ReplicaExit, ReplicaHandle
from inferd.replica.config import ModelSource, ReplicaSettings, ReplicaSpec
from inferd.vocab import ModelKind
from tests.support import FakeRegistry

pytestmark = pytest.mark.anyio


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    reg = FakeRegistry()
    yield reg
    reg.stop()


def make_launcher(registry: FakeRegistry, tmp_path: Path, **kwargs: object) -> LocalLauncher:
    return LocalLauncher(
        settings=ReplicaSettings(
            registry_url=registry.url, report_interval_s=0.2, replica_args="--engine fake"
        ),
        log_dir=tmp_path / "logs",
        poll_s=0.05,
        **kwargs,  # type: ignore[arg-type]
    )


def spec(rid: str, gpu_type: str = "cpu", count: int = 1) -> ReplicaSpec:
    model = ModelSource("tiny-chat", ModelKind.CHAT, "builtin:tiny-chat")
    return ReplicaSpec(rid, "ep-1", model, gpu_type, count, secret=f"secret-{rid}")


alive = procfs.alive  # a zombie is dead for our purposes


def pid_of(handle: ReplicaHandle) -> int:
    return int(handle.placement["pid"])


async def wait_for(predicate: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def ready(registry: FakeRegistry, rid: str) -> None:
    await wait_for(
        lambda: any(r["replicaId"] == rid and r["status"] == "ready" for r in registry.reports), 30
    )


async def test_capacity_and_placement_refusals(registry: FakeRegistry, tmp_path: Path) -> None:
    gpus = [(LocalGpu(0, "NVIDIA L4", 23034), "L4"), (LocalGpu(1, "NVIDIA L4", 23034), "L4")]
    launcher = make_launcher(registry, tmp_path, gpus=gpus, cpu_slots=1)
    capacity = await launcher.capacity()
    assert capacity.total == {PlacementKey("local", "cpu"): 1, PlacementKey("local", "L4"): 2}
    assert await launcher.cannot_place("local", "L4", 2) is None
    assert "has 2 L4" in (await launcher.cannot_place("local", "L4", 4) or "")
    assert "has 0 H100-80GB" in (await launcher.cannot_place("local", "H100-80GB", 1) or "")
    argv = launcher.command(spec("x", "L4", 2), (0, 1))
    assert argv[argv.index("--gpus") + 1] == "0,1"  # as the replica sees them
    assert argv[argv.index("--device") + 1] == "cuda"
    assert argv[argv.index("--model-source") + 1] == "builtin:tiny-chat"
    assert not any("secret" in a for a in argv)  # secrets go by environment only


async def test_the_replica_reports_with_its_secret_and_no_process_id(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    launcher = make_launcher(registry, tmp_path)
    try:
        await launcher.launch(spec("r-a"))
        await ready(registry, "r-a")
        assert registry.auth[-1] == "Bearer secret-r-a"
        assert "pid" not in registry.reports[-1]
    finally:
        await launcher.shutdown(5)


async def test_a_replica_that_will_not_drain_is_killed_after_the_grace(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    launcher = make_launcher(registry, tmp_path)
    exits = launcher.exits()
    try:
        handle = await launcher.launch(spec("r-b"))
        await ready(registry, "r-b")
        os.kill(pid_of(handle), signal.SIGSTOP)  # hangs: SIGTERM will not be handled
        await launcher.stop(handle, grace_s=0.5)
        exited: ReplicaExit = await asyncio.wait_for(anext(exits), 10)
        assert (exited.reason, exited.returncode) == (ExitReason.KILLED, -signal.SIGKILL)
        assert not alive(pid_of(handle))
    finally:
        await launcher.shutdown(5)


async def test_adopt_after_restart_and_refuse_a_stranger(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    first = make_launcher(registry, tmp_path)
    handle = await first.launch(spec("r-c"))
    try:
        await ready(registry, "r-c")
        # A new launcher (the control plane restarted) takes the process over.
        second = make_launcher(registry, tmp_path)
        exits = second.exits()
        assert await second.adopt(handle) is True
        stranger = ReplicaHandle("r-other", handle.node, handle.placement)
        assert await second.adopt(stranger) is False  # that PID is not this replica
        gone = ReplicaHandle("r-gone", "local", {"pid": str(2**22 - 1), "gpu_ids": ""})
        assert await second.adopt(gone) is False
        assert second.running() == ["r-c"]
        await second.stop(handle, grace_s=10)
        exited = await asyncio.wait_for(anext(exits), 20)
        assert exited.reason is ExitReason.STOPPED
        assert exited.returncode is None  # not our child: code unknown
        assert not alive(pid_of(handle))
        await second.shutdown(2)
    finally:
        await first.shutdown(2)


async def test_a_replica_does_not_inherit_the_control_planes_secrets(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "INFERD_ADMIN_KEY": "infd_admin_secretsecretsecret",
        "INFERD_DATABASE_URL": "postgresql://u:password@db/inferd",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HF_HOME": "/tmp/hf",
    }
    env.update({k: v for k, v in os.environ.items() if k in ("VIRTUAL_ENV", "PYTHONPATH")})
    launcher = make_launcher(registry, tmp_path, env=env)
    try:
        handle = await launcher.launch(spec("r-d"))
        await ready(registry, "r-d")
        environ = procfs.environment(pid_of(handle)) or []
        names = {item.split(b"=", 1)[0] for item in environ if item}
        assert b"INFERD_ADMIN_KEY" not in names
        assert b"INFERD_DATABASE_URL" not in names
        assert b"AWS_SECRET_ACCESS_KEY" not in names
        assert b"HF_HOME" in names and b"INFERD_REPLICA_SECRET" in names
    finally:
        await launcher.shutdown(5)
    assert replica_environment({"INFERD_ADMIN_KEY": "k", "LC_ALL": "C"}) == {"LC_ALL": "C"}


def bound_cores(handle: ReplicaHandle) -> str | None:
    for item in procfs.environment(pid_of(handle)) or []:
        name, _, value = item.partition(b"=")
        if name.decode() == BIND_ENV:
            return value.decode()
    return None


async def test_cpu_replicas_compute_on_cores_of_their_own(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    """vLLM left to bind itself puts every engine on the same cores: each
    CPU slot names its own share instead, and a freed slot is reused."""
    env = {k: v for k, v in os.environ.items() if k != BIND_ENV}
    launcher = make_launcher(registry, tmp_path, env=env, cpu_slots=2)
    cores = usable_cores()
    want = [",".join(map(str, slot_cores(i, 2, cores))) for i in range(2)]
    try:
        a, b = [await launcher.launch(spec(f"r-core-{i}")) for i in range(2)]
        assert [bound_cores(a), bound_cores(b)] == want
        assert [a.placement["cpu_slot"], b.placement["cpu_slot"]] == ["0", "1"]
        await launcher.kill(a)
        await wait_for(lambda: "r-core-0" not in launcher.running(), 10)
        c = await launcher.launch(spec("r-core-2"))
        assert bound_cores(c) == want[0]
    finally:
        await launcher.shutdown(5)
    # A binding the operator chose is theirs to keep.
    mine = make_launcher(registry, tmp_path, env={**env, BIND_ENV: "nobind"}, cpu_slots=2)
    try:
        assert bound_cores(await mine.launch(spec("r-core-3"))) == "nobind"
    finally:
        await mine.shutdown(5)


async def test_a_replica_is_gone_only_once_its_whole_group_is(
    registry: FakeRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's engine core and workers hold the GPU after the replica itself
    has exited: its exit is reported (and its GPUs handed on) only once
    nothing of its group is left."""
    from inferd.control.launchers import local

    lingering: set[int] = set()
    monkeypatch.setattr(local, "group_members", lambda pgid: [pgid] if pgid in lingering else [])
    launcher = make_launcher(registry, tmp_path)
    try:
        handle = await launcher.launch(spec("r-group"))
        await ready(registry, "r-group")
        lingering.add(pid_of(handle))
        await launcher.kill(handle)
        await wait_for(lambda: not alive(pid_of(handle)), 10)
        await asyncio.sleep(0.5)  # ten polls: still not reported while its group lives
        assert "r-group" in launcher.running()
        lingering.clear()
        await wait_for(lambda: "r-group" not in launcher.running(), 10)
        exited = await asyncio.wait_for(anext(aiter(launcher.exits())), 5)
        assert (exited.replica_id, exited.reason) == ("r-group", ExitReason.KILLED)
    finally:
        await launcher.shutdown(5)


async def test_shutdown_leaves_no_process(registry: FakeRegistry, tmp_path: Path) -> None:
    launcher = make_launcher(registry, tmp_path)
    handles = [await launcher.launch(spec(f"r-{i}")) for i in range(2)]
    for handle in handles:
        await ready(registry, handle.replica_id)
    await launcher.shutdown(10)
    assert launcher.running() == []
    assert not any(alive(pid_of(h)) for h in handles)
