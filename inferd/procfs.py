"""The few facts about local processes inferd reads from Linux /proc, parsed
one way: state, parent, group, CPU time, start time, command line, threads.

/proc/PID/stat's second field is the command name in parentheses, and a
process may name itself anything (vLLM's workers rename themselves with
setproctitle), spaces and parentheses included: fields are counted after
the last ")", never by splitting the whole line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")  # the unit of stat's times


@dataclass(frozen=True)
class ProcessStat:
    state: str  # one letter: "R" running, "S" sleeping, ... "Z" zombie
    ppid: int
    pgrp: int
    cpu_s: float  # user + system time so far, all threads
    started_s: float  # when it started, in seconds after boot

    @property
    def zombie(self) -> bool:
        return self.state == "Z"


def process_stat(pid: int) -> ProcessStat | None:
    """The process's state, parent, group, CPU and start time; None when there is no such
    process (or it went while being read)."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return ProcessStat(
            state=fields[0],
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS_PER_S,
            started_s=int(fields[19]) / _TICKS_PER_S,
        )
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie has exited; it
    only waits for its parent to collect the exit code)."""
    stat = process_stat(pid)
    return stat is not None and not stat.zombie


def command_line(pid: int) -> list[bytes] | None:
    """The process's arguments; [] for a process that is exiting (the kernel
    drops its memory, command line included, before it closes its files) or
    a kernel thread; None when there is no such process."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").split(b"\0") if raw else []


def all_pids() -> Iterator[int]:
    """Every process visible in /proc, in no particular order."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def children(parent: int) -> list[int]:
    """The processes whose parent is `parent`."""
    return [
        pid for pid in all_pids() if (stat := process_stat(pid)) is not None and stat.ppid == parent
    ]


def threads(pid: int) -> list[int]:
    """The thread ids of `pid` ([pid] when they cannot be read)."""
    try:
        return [int(tid.name) for tid in (PROC / str(pid) / "task").iterdir()]
    except OSError:
        return [pid]


def environment(pid: int) -> list[bytes] | None:
    """The process's environment as `NAME=value` entries (what it started
    with, unless it overwrote that memory, as setproctitle does); None when
    it cannot be read."""
    try:
        return (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
