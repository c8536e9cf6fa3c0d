"""A replica's process group: everything it starts dies with it.

A launcher starts each replica in a session of its own, so the replica leads
a process group that its engine's processes join (vLLM's engine core and
workers, diffusers' workers). Killing the replica alone would leave those
running with parent pid 1, holding their memory and GPUs: vLLM's engine core
ignores SIGTERM, and a parent-death signal reaches only the replica.

Two guards, both keyed on the group:

- a *reaper*: a tiny process in the replica's group that polls its parent
  (the replica) and, the moment the replica is gone however it ended
  (SIGKILL, its Ray actor's death, its node's), SIGKILLs the whole group,
  itself included. It holds no pipe: a forked engine process would inherit
  the pipe's end and keep it open.
- a *mark*: a file per group under `run_dir()` naming the replica and when
  its leader started. `sweep` (at launcher and node start) kills every
  marked group whose leader is gone, the backstop for a reaper that was
  itself killed. A process group id is not reused while any member lives,
  so a group whose leader is gone is the replica's leftovers, never a
  stranger's.

Nothing here is started unless the replica leads its own group: killing a
group it merely joined would kill whoever started it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inferd import procfs

logger = logging.getLogger(__name__)

REAPER_NAME = "inferd-replica-reaper"
# Runs with `python -I -S`: no site, no inferd import, a few ms to start.
_REAPER = """
import os, signal, sys, time
parent = int(sys.argv[2])
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
while os.getppid() == parent:
    time.sleep(float(sys.argv[3]))
os.killpg(os.getpgrp(), signal.SIGKILL)
"""
REAPER_POLL_S = 0.1


def run_dir() -> Path:
    """Where this machine's replica groups are marked (shared by every
    launcher and node of the machine)."""
    return Path(tempfile.gettempdir()) / "inferd-replicas" / "groups"


def leads_group() -> bool:
    return os.getpgrp() == os.getpid()


def start_reaper(poll_s: float = REAPER_POLL_S) -> int | None:
    """Start the group's reaper (see the module); its pid, or None when this
    process does not lead its own group."""
    if not leads_group():
        return None
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _REAPER, REAPER_NAME, str(os.getpid()), str(poll_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    return process.pid


@dataclass(frozen=True)
class GroupMark:
    pgid: int
    replica_id: str
    started_s: float  # the leader's start time (seconds after boot)


def mark_group(replica_id: str, directory: Path | None = None) -> Path | None:
    """Mark this process's group as a replica's; None when it leads none."""
    if not leads_group():
        return None
    stat = procfs.process_stat(os.getpid())
    if stat is None:
        return None
    directory = directory or run_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / str(os.getpid())
    mark = {"pgid": os.getpid(), "replicaId": replica_id, "startedS": stat.started_s}
    path.write_text(json.dumps(mark))
    return path


def read_marks(directory: Path | None = None) -> list[GroupMark]:
    marks = []
    for path in sorted((directory or run_dir()).glob("[0-9]*")):
        try:
            raw = json.loads(path.read_text())
            marks.append(GroupMark(int(raw["pgid"]), str(raw["replicaId"]), float(raw["startedS"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return marks


def leader_alive(mark: GroupMark) -> bool:
    """The group's leader is the very process that marked it (not a later
    process that got its pid)."""
    stat = procfs.process_stat(mark.pgid)
    return stat is not None and not stat.zombie and abs(stat.started_s - mark.started_s) < 0.05


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of the process group."""
    members = []
    for pid in procfs.all_pids():
        stat = procfs.process_stat(pid)
        if stat is not None and stat.pgrp == pgid and not stat.zombie:
            members.append(pid)
    return members


def sweep(directory: Path | None = None) -> list[GroupMark]:
    """Kill every marked group whose replica is gone and drop its mark;
    returns the groups that still had processes."""
    directory = directory or run_dir()
    killed = []
    for mark in read_marks(directory):
        if leader_alive(mark):
            continue
        if group_members(mark.pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(mark.pgid, signal.SIGKILL)
            killed.append(mark)
        with contextlib.suppress(OSError):
            (directory / str(mark.pgid)).unlink()
    if killed:
        logger.warning(
            "killed the leftover processes of %d ended replica(s): %s",
            len(killed),
            ", ".join(m.replica_id for m in killed),
        )
    return killed
