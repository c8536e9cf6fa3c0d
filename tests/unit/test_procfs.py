"""inferd.procfs on real processes: a child that names itself with spaces
and parentheses (as setproctitle-renamed vLLM workers may), the same child
as a zombie, and once it is reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd import procfs

# The child renames itself, burns some CPU, then says so and sleeps until killed.
CHILD = (
    "import time\n"
    "open('/proc/self/comm', 'w').write('odd) name (x')\n"
    "end = time.process_time() + 0.1\n"
    "while time.process_time() < end: pass\n"
    "print('renamed', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, "marker-arg"],
        stdout=subprocess.PIPE,
        env={**os.environ, "PROCFS_TEST_MARK": "1"},
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"renamed\n"
    yield process
    process.kill()
    process.wait()


def wait_until_zombie(pid: int) -> procfs.ProcessStat:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = procfs.process_stat(pid)
        if stat is not None and stat.zombie:
            return stat
        time.sleep(0.01)
    raise AssertionError(f"{pid} did not become a zombie: {procfs.process_stat(pid)}")


def test_a_live_child_with_an_odd_name(child: subprocess.Popen[bytes]) -> None:
    assert Path(f"/proc/{child.pid}/comm").read_text() == "odd) name (x\n"
    stat = procfs.process_stat(child.pid)
    assert stat is not None
    assert stat.state in {"R", "S"}
    assert stat.ppid == os.getpid()
    assert stat.pgrp == os.getpgrp()
    me = procfs.process_stat(os.getpid())
    assert me is not None and me.started_s <= stat.started_s  # the child started later
    assert 0.09 <= stat.cpu_s < 30  # the 0.1 s it burnt, in 10 ms ticks
    assert procfs.alive(child.pid)
    assert child.pid in procfs.children(os.getpid())
    assert child.pid in set(procfs.all_pids())
    cmdline = procfs.command_line(child.pid)
    assert cmdline is not None and cmdline[-1] == b"marker-arg"
    assert b"PROCFS_TEST_MARK=1" in (procfs.environment(child.pid) or [])


def test_a_zombie_is_not_alive_and_has_no_command_line(
    child: subprocess.Popen[bytes],
) -> None:
    os.kill(child.pid, 9)  # not waited for: a zombie until reaped
    stat = wait_until_zombie(child.pid)
    assert stat.ppid == os.getpid()
    assert not procfs.alive(child.pid)
    assert procfs.command_line(child.pid) == []
    assert child.pid in procfs.children(os.getpid())


def test_a_reaped_process_is_gone(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait()
    assert procfs.process_stat(child.pid) is None
    assert not procfs.alive(child.pid)
    assert procfs.command_line(child.pid) is None
    assert procfs.environment(child.pid) is None
    assert child.pid not in procfs.children(os.getpid())
    assert procfs.threads(child.pid) == [child.pid]  # unreadable: the pid itself


def test_threads_lists_every_thread_of_this_process() -> None:
    started = threading.Event()
    stop = threading.Event()

    def run() -> None:
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        started.wait(10)
        tids = procfs.threads(os.getpid())
        assert os.getpid() in tids
        assert thread.native_id in tids
    finally:
        stop.set()
        thread.join()
