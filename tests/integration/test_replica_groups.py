"""A replica's process tree dies with it, however it ends (real processes:
a replica with the fake engine's stand-in for vLLM's engine core, which
ignores SIGTERM as the real one does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from inferd import procfs
from inferd.engines.fake import FAKE_ENGINE_CORE
from inferd.replica import groups
from inferd.replica.groups import REAPER_NAME
from inferd.testing import ReplicaHandle
from inferd.testing.cluster import wait_until


def _named(name: str, group: int) -> list[int]:
    """Live processes of `group` whose command line carries `name`."""
    return [
        pid
        for pid in groups.group_members(group)
        if name.encode() in b" ".join(procfs.command_line(pid) or [])
    ]


@pytest.fixture
def replica(tmp_path: Path) -> ReplicaHandle:
    handle = ReplicaHandle(
        "tiny-chat",
        ["--engine", "fake", "--engine-arg", "child_process=true", "--replica-id", "r-tree"],
        env={"TMPDIR": str(tmp_path)},
    )
    return handle.wait_ready(timeout=60)


def test_a_killed_replica_takes_its_engine_processes_with_it(
    replica: ReplicaHandle, tmp_path: Path
) -> None:
    """SIGKILL to the replica alone (what its actor's or node's death does):
    its reaper kills the engine core that would have stayed with parent 1."""
    try:
        (core,) = _named(FAKE_ENGINE_CORE, replica.pid)
        assert len(_named(REAPER_NAME, replica.pid)) == 1
        (mark,) = groups.read_marks(tmp_path / "inferd-replicas" / "groups")
        assert (mark.pgid, mark.replica_id) == (replica.pid, "r-tree")
        os.kill(replica.pid, signal.SIGKILL)
        wait_until(lambda: not groups.group_members(replica.pid), timeout=10)
        assert not procfs.alive(core)
    finally:
        replica.stop()


def test_a_drained_replica_leaves_nothing_and_removes_its_mark(
    replica: ReplicaHandle, tmp_path: Path
) -> None:
    pgid = replica.pid
    assert _named(FAKE_ENGINE_CORE, pgid)
    assert replica.stop() == 0
    wait_until(lambda: not groups.group_members(pgid), timeout=10)
    assert groups.read_marks(tmp_path / "inferd-replicas" / "groups") == []


def test_the_sweep_kills_what_a_dead_replica_and_its_reaper_left(tmp_path: Path) -> None:
    """The backstop: the reaper was killed too (say, by the OOM killer);
    a launcher or node start sweeps the marked group whose leader is gone,
    and leaves a live replica's group alone."""
    marks = tmp_path / "groups"
    script = (
        "import os, subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from inferd.replica import groups\n"
        f"groups.mark_group(sys.argv[1], Path({str(marks)!r}))\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', 'leftover'])\n"
        "time.sleep(300)\n"
    )
    dead = subprocess.Popen([sys.executable, "-c", script, "r-dead"], start_new_session=True)
    live = subprocess.Popen([sys.executable, "-c", script, "r-live"], start_new_session=True)
    try:
        wait_until(lambda: len(groups.read_marks(marks)) == 2, timeout=30)
        wait_until(lambda: len(groups.group_members(dead.pid)) == 2, timeout=30)
        wait_until(lambda: len(groups.group_members(live.pid)) == 2, timeout=30)
        dead.kill()
        dead.wait()
        (leftover,) = groups.group_members(dead.pid)
        assert procfs.process_stat(leftover).ppid != dead.pid  # type: ignore[union-attr]
        swept = groups.sweep(marks)
        assert [m.replica_id for m in swept] == ["r-dead"]
        wait_until(lambda: not procfs.alive(leftover), timeout=5)
        assert len(groups.group_members(live.pid)) == 2
        assert [m.replica_id for m in groups.read_marks(marks)] == ["r-live"]
    finally:
        for process in (dead, live):
            if groups.group_members(process.pid):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
