"""The embedded launcher: replicas as local processes on this machine's GPUs.

Each replica is `python -m inferd.replica ...` in a session of its own, so
that it and every process it starts (vLLM's engine core and workers) form one
process group: a stop is SIGTERM to the replica (it drains), and a kill, or a
stop past its grace period, is SIGKILL to the whole group, which leaves no
orphan behind. Whole GPUs are assigned with CUDA_VISIBLE_DEVICES.

Replicas survive a crash of the control plane on purpose (in-flight requests
finish); after a restart `adopt` takes them over by PID, checking that the
process really is that replica. A replica whose control plane never comes
back exits by itself (its `--orphan-timeout`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from inferd import procfs
from inferd.control.launchers.base import (
    Capacity,
    ExitedReplica,
    LaunchedReplica,
    LiveCapacity,
    ReplicaSpec,
    Slots,
)
from inferd.control.launchers.inventory import LocalGpu

logger = logging.getLogger(__name__)

CPU = "cpu"
LOCAL = "local"


@dataclass
class _Process:
    replica_id: str
    pid: int
    gpu_type: str
    gpu_ids: tuple[int, ...]
    popen: subprocess.Popen[bytes] | None  # None when adopted after a restart
    log_path: Path | None
    kill_at: float | None = None  # monotonic deadline of a pending stop
    log_file: IO[bytes] | None = field(default=None, repr=False)


def _runs_replica(cmdline: list[bytes], replica_id: str) -> bool:
    """True when a command line is the replica `replica_id`'s (guards
    against PID reuse after a restart)."""
    return b"inferd.replica" in cmdline and replica_id.encode() in cmdline


LAUNCHED_BY_ENV = "INFERD_LAUNCHED_BY"


def launched_processes(registry_url: str, groups: Iterable[int] = ()) -> list[int]:
    """PIDs of the live processes (not zombies) that this control plane
    launched: those with its mark in their environment, and every member of
    their process groups and of `groups` (each replica leads its own group,
    which its children join). The groups matter because vLLM's engine core
    and workers rename themselves with setproctitle, which overwrites the
    environment that /proc shows; they stay in the replica's group, even
    when the replica itself is gone."""
    mark = f"{LAUNCHED_BY_ENV}={registry_url}".encode()
    live: dict[int, int] = {}  # pid -> process group
    marked = set()
    for pid in procfs.all_pids():
        stat = procfs.process_stat(pid)
        if stat is None or stat.zombie:
            continue
        live[pid] = stat.pgrp
        if mark in (procfs.environment(pid) or ()):
            marked.add(pid)
    wanted = set(groups) | {live[pid] for pid in marked}
    return sorted(pid for pid, group in live.items() if pid in marked or group in wanted)


class LocalLauncher:
    def __init__(
        self,
        *,
        registry_url: str,
        log_dir: Path,
        gpus: Sequence[tuple[LocalGpu, str | None]] = (),
        cpu_slots: int = 4,
        replica_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`gpus`: this machine's GPUs with their catalog type (None when no
        catalog type matches; such a GPU is never assigned)."""
        self._registry_url = registry_url
        self._log_dir = log_dir
        self._replica_args = list(replica_args)
        self._env = dict(os.environ if env is None else env)
        self._python = python
        self._clock = clock
        self._gpu_type_of = {gpu.index: t for gpu, t in gpus if t is not None}
        self._cpu_slots = cpu_slots
        self._processes: dict[str, _Process] = {}

    # -- capacity ---------------------------------------------------------------

    def _used_gpus(self) -> set[int]:
        return {i for p in self._processes.values() for i in p.gpu_ids}

    def _free_gpus(self, gpu_type: str) -> list[int]:
        used = self._used_gpus()
        return sorted(i for i, t in self._gpu_type_of.items() if t == gpu_type and i not in used)

    def capacity(self) -> Capacity:
        total: dict[str, int] = {CPU: self._cpu_slots}
        for gpu_type in self._gpu_type_of.values():
            total[gpu_type] = total.get(gpu_type, 0) + 1
        cpu_used = sum(1 for p in self._processes.values() if p.gpu_type == CPU)
        free = {t: len(self._free_gpus(t)) for t in total if t != CPU}
        free[CPU] = self._cpu_slots - cpu_used
        return Capacity(free=free, total=total)

    def locations(self) -> LiveCapacity:
        """This machine is the `local` location."""
        capacity = self.capacity()
        return {
            LOCAL: {
                t: Slots(total=n, free=capacity.free.get(t, 0), nodes=1,
                         largest_free=capacity.free.get(t, 0))
                for t, n in capacity.total.items()
            }
        }  # fmt: skip

    def cannot_place(self, gpu_type: str, gpu_count: int, location: str = "local") -> str | None:
        # One machine: whatever location an endpoint names, this is where it runs.
        capacity = self.capacity()
        if gpu_type == CPU:
            if capacity.free[CPU] >= 1:
                return None
            return f"all {self._cpu_slots} CPU replica slots of this machine are in use"
        total = capacity.total.get(gpu_type, 0)
        if total < gpu_count:
            return f"this machine has {total} {gpu_type} GPU(s); a replica needs {gpu_count}"
        free = capacity.free.get(gpu_type, 0)
        if free < gpu_count:
            return (
                f"{free} of this machine's {total} {gpu_type} GPU(s) are free; "
                f"a replica needs {gpu_count}"
            )
        return None

    # -- lifecycle ----------------------------------------------------------------

    def command(self, spec: ReplicaSpec, gpu_ids: tuple[int, ...]) -> list[str]:
        names = spec.served_names or (spec.model_name,)
        command = [
            self._python, "-m", "inferd.replica",
            "--model", spec.model_name,
            "--replica-id", spec.replica_id,
            "--endpoint-id", spec.endpoint_id,
            "--registry-url", self._registry_url,
            "--host", "127.0.0.1",
            "--port", "0",
            "--device", "cpu" if spec.gpu_type == CPU else "cuda",
        ]  # fmt: skip
        for name in names:
            command += ["--served-model-name", name]
        if gpu_ids:
            # Indices as the replica sees them under CUDA_VISIBLE_DEVICES.
            command += ["--gpus", ",".join(str(i) for i in range(len(gpu_ids)))]
        return command + self._replica_args

    def launch(self, spec: ReplicaSpec) -> LaunchedReplica:
        reason = self.cannot_place(spec.gpu_type, spec.gpu_count)
        if reason is not None:
            raise RuntimeError(reason)
        gpu_ids = (
            () if spec.gpu_type == CPU else tuple(self._free_gpus(spec.gpu_type)[: spec.gpu_count])
        )
        env = {
            **self._env,
            "INFERD_REPLICA_SECRET": spec.secret,
            # Inherited by every process of the replica, vLLM's engine core
            # and workers included (which rename themselves and may outlive a
            # crashed parent): `launched_processes` finds them all by it.
            LAUNCHED_BY_ENV: self._registry_url,
        }
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / f"replica-{spec.replica_id}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed when the process is reaped
        popen = subprocess.Popen(
            self.command(spec, gpu_ids),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._processes[spec.replica_id] = _Process(
            spec.replica_id, popen.pid, spec.gpu_type, gpu_ids, popen, log_path, log_file=log_file
        )
        logger.info("launched replica %s (pid %d, gpus %s)", spec.replica_id, popen.pid, gpu_ids)
        return LaunchedReplica(spec.replica_id, popen.pid, gpu_ids, log_path=str(log_path))

    def adopt(self, replica_id: str, pid: int, gpu_ids: tuple[int, ...]) -> bool:
        if not _runs_replica(procfs.command_line(pid) or [], replica_id):
            return False
        gpu_type = self._gpu_type_of.get(gpu_ids[0], CPU) if gpu_ids else CPU
        self._processes[replica_id] = _Process(replica_id, pid, gpu_type, gpu_ids, None, None)
        logger.info("adopted replica %s (pid %d)", replica_id, pid)
        return True

    def stop(self, replica_id: str, grace_s: float) -> None:
        process = self._processes.get(replica_id)
        if process is None:
            return
        if process.kill_at is None:
            process.kill_at = self._clock() + grace_s
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)  # the replica itself: it drains

    def kill(self, replica_id: str) -> None:
        process = self._processes.get(replica_id)
        if process is not None:
            _kill_group(process.pid)

    def running(self) -> list[str]:
        return list(self._processes)

    def pid(self, replica_id: str) -> int | None:
        process = self._processes.get(replica_id)
        return process.pid if process else None

    def reap(self) -> list[ExitedReplica]:
        exited = []
        now = self._clock()
        for replica_id, process in list(self._processes.items()):
            returncode = self._poll(process)
            if returncode is False and process.kill_at is not None and now >= process.kill_at:
                logger.warning("replica %s did not drain in time; killing it", replica_id)
                _kill_group(process.pid)
                returncode = self._poll(process)
            if returncode is False:
                continue
            # The replica is gone; make sure nothing it started lingers.
            _kill_group(process.pid)
            del self._processes[replica_id]
            if process.log_file is not None:
                process.log_file.close()
            exited.append(ExitedReplica(replica_id, returncode, _tail(process.log_path)))
        return exited

    def _poll(self, process: _Process) -> int | bool | None:
        """Exit code, None (adopted, exited, code unknown), or False (alive)."""
        if process.popen is not None:
            code = process.popen.poll()
            return False if code is None else code
        if not procfs.alive(process.pid):
            return None
        cmdline = procfs.command_line(process.pid)
        if cmdline is None:
            return None  # gone between the two reads
        if not cmdline:
            # Exiting: the kernel drops a process's memory (and with it the
            # command line) before it closes its files, GPU handles included.
            # Not gone until it is a zombie, or its GPUs could be handed on
            # while still held.
            return False
        return False if _runs_replica(cmdline, process.replica_id) else None

    def shutdown(self, grace_s: float) -> None:
        for replica_id in list(self._processes):
            self.stop(replica_id, grace_s)
        deadline = self._clock() + grace_s + 5
        while self._processes and self._clock() < deadline:
            self.reap()
            time.sleep(0.05)
        for replica_id in list(self._processes):
            self.kill(replica_id)
        self.reap()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(path: Path | None, limit: int = 2000) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
