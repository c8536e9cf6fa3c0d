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

Process ids and host GPU indices exist only here: the rest of the control
plane sees a `ReplicaHandle` whose `placement` carries them as opaque text.
A replica inherits only an allow-list of the control plane's environment
(`ALLOWED_ENV`): model code runs in it, and the control plane's environment
holds secrets (`INFERD_ADMIN_KEY`, a database password).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from inferd import procfs
from inferd.control.launchers.cpu_cores import bind_environment, usable_cores
from inferd.control.launchers.inventory import LocalGpu
from inferd.control.launchers.logs import log_name, read_tail
from inferd.control.ports import (
    Capacity,
    ExitReason,
    PlacementKey,
    ReplicaExit,
    ReplicaHandle,
)
from inferd.replica.config import SECRET_ENV, ReplicaSettings, ReplicaSpec, config_for, to_argv
from inferd.replica.groups import group_members, sweep

logger = logging.getLogger(__name__)

CPU = "cpu"
NODE = "local"
# How often replica processes are checked for having ended. A child's end
# could be awaited instead, but an adopted replica is not our child.
POLL_S = 0.1
# A process stuck in the kernel (uninterruptible I/O, a wedged driver) can
# outlive SIGKILL; past this its replica is reported gone all the same.
REAP_TIMEOUT_S = 30.0

# What a replica inherits from the control plane's environment: what finds
# programs, libraries, caches and devices, never the control plane's own
# settings or secrets.
ALLOWED_ENV = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
        "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD",
        "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "INFERD_CACHE_DIR",
        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_HOME", "CUDA_PATH",
    }
)  # fmt: skip
ALLOWED_ENV_PREFIXES = ("LC_", "HF_", "VLLM_", "NCCL_", "TORCH", "TRITON_", "NVIDIA_", "HIP_")


def replica_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` a replica may see (see `ALLOWED_ENV`)."""
    return {
        key: value
        for key, value in env.items()
        if key in ALLOWED_ENV or key.startswith(ALLOWED_ENV_PREFIXES)
    }


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
    # Why it will have ended: set by stop (STOPPED) and kill (KILLED).
    ending: ExitReason | None = None
    # Which CPU slot (and so which cores) a CPU replica holds; None: a GPU one.
    cpu_slot: int | None = None
    # When its own process was first seen gone while others of its group
    # (vLLM's engine core, workers) were still exiting.
    reaping_since: float | None = None


def _placement(pid: int, gpu_ids: tuple[int, ...], cpu_slot: int | None) -> dict[str, str]:
    placement = {"pid": str(pid), "gpu_ids": ",".join(str(i) for i in gpu_ids)}
    if cpu_slot is not None:
        placement["cpu_slot"] = str(cpu_slot)
    return placement


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
        settings: ReplicaSettings,
        log_dir: Path,
        gpus: Sequence[tuple[LocalGpu, str | None]] = (),
        cpu_slots: int = 4,
        location: str = "local",
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = POLL_S,
    ) -> None:
        """`gpus`: this machine's GPUs with their catalog type (None when no
        catalog type matches; such a GPU is never assigned). `env`: the
        environment replicas inherit from, through the allow-list."""
        self._settings = settings
        self._log_dir = log_dir
        self._location = location
        self._env = replica_environment(os.environ if env is None else env)
        self._python = python
        self._clock = clock
        self._poll_s = poll_s
        self._gpu_type_of = {gpu.index: t for gpu, t in gpus if t is not None}
        self._cpu_slots = cpu_slots
        self._cores = usable_cores()
        self._processes: dict[str, _Process] = {}
        self._exits: asyncio.Queue[ReplicaExit | None] = asyncio.Queue()
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False
        # Leftovers of replicas that ended while nobody watched (their group
        # reaper killed too); live replicas, adopted later, are left alone.
        sweep()

    # -- capacity ---------------------------------------------------------------

    def _used_gpus(self) -> set[int]:
        return {i for p in self._processes.values() for i in p.gpu_ids}

    def _free_cpu_slot(self) -> int:
        used = {p.cpu_slot for p in self._processes.values()}
        return next(s for s in range(len(self._processes) + 1) if s not in used)

    def _free_gpus(self, gpu_type: str) -> list[int]:
        used = self._used_gpus()
        return sorted(i for i, t in self._gpu_type_of.items() if t == gpu_type and i not in used)

    def _capacity(self) -> tuple[dict[str, int], dict[str, int]]:
        total: dict[str, int] = {CPU: self._cpu_slots}
        for gpu_type in self._gpu_type_of.values():
            total[gpu_type] = total.get(gpu_type, 0) + 1
        cpu_used = sum(1 for p in self._processes.values() if p.gpu_type == CPU)
        free = {t: len(self._free_gpus(t)) for t in total if t != CPU}
        free[CPU] = self._cpu_slots - cpu_used
        return free, total

    async def capacity(self) -> Capacity:
        free, total = self._capacity()
        return Capacity(
            free={PlacementKey(self._location, t): n for t, n in free.items()},
            total={PlacementKey(self._location, t): n for t, n in total.items()},
        )

    async def cannot_place(self, location: str, gpu_type: str, gpu_count: int) -> str | None:
        return self._cannot_place(location, gpu_type, gpu_count)

    def _cannot_place(self, location: str, gpu_type: str, gpu_count: int) -> str | None:
        if location != self._location:
            return (
                f"this machine is location {self._location!r}, not {location!r}: "
                f"start `inferd serve --default-location {location}` where it is in "
                f"{location} (or create the endpoint in {self._location!r})"
            )
        free, total = self._capacity()
        if gpu_type == CPU:
            if free[CPU] >= 1:
                return None
            return f"all {self._cpu_slots} CPU replica slots of this machine are in use"
        have = total.get(gpu_type, 0)
        if have < gpu_count:
            return (
                f"this machine has {have} {gpu_type} GPU(s) ({self.describe()}); a replica "
                f"needs {gpu_count}; GPUs whose type was not detected are declared with "
                "`inferd serve --gpu-types`"
            )
        available = free.get(gpu_type, 0)
        if available < gpu_count:
            return (
                f"{available} of this machine's {have} {gpu_type} GPU(s) are free; "
                f"a replica needs {gpu_count}"
            )
        return None

    def describe(self) -> str:
        """What this machine offers, for the banner and pending reasons:
        "location 'us-east': 8 x H100-80GB, 4 CPU slots"."""
        _, total = self._capacity()
        gpus = [f"{n} x {t}" for t, n in sorted(total.items()) if t != CPU]
        return f"location {self._location!r}: " + ", ".join(
            [*(gpus or ["no GPUs"]), f"{self._cpu_slots} CPU slots"]
        )

    # -- lifecycle ----------------------------------------------------------------

    def command(self, spec: ReplicaSpec, gpu_ids: tuple[int, ...]) -> list[str]:
        # Indices as the replica sees them under CUDA_VISIBLE_DEVICES.
        visible = tuple(range(len(gpu_ids)))
        config = config_for(spec, self._settings, host="127.0.0.1", gpu_ids=visible)
        return [self._python, "-m", "inferd.replica", *to_argv(config)]

    async def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        if self._closed:
            raise RuntimeError("the launcher is shut down")
        reason = self._cannot_place(spec.location, spec.gpu_type, spec.gpu_count)
        if reason is not None:
            raise RuntimeError(reason)
        gpu_ids = (
            () if spec.gpu_type == CPU else tuple(self._free_gpus(spec.gpu_type)[: spec.gpu_count])
        )
        # Forking takes milliseconds: not worth a thread hop.
        self._processes[spec.replica_id] = process = self._spawn(spec, gpu_ids)
        self._watch()
        logger.info(
            "launched replica %s of endpoint %s (pid %d, gpus %s); its log: %s",
            spec.replica_id,
            spec.endpoint_id,
            process.pid,
            gpu_ids or "none",
            process.log_path,
        )
        return ReplicaHandle(
            spec.replica_id, NODE, _placement(process.pid, gpu_ids, process.cpu_slot)
        )

    def _spawn(self, spec: ReplicaSpec, gpu_ids: tuple[int, ...]) -> _Process:
        cpu_slot = self._free_cpu_slot() if spec.gpu_type == CPU else None
        cores = (
            {}
            if cpu_slot is None
            else bind_environment(cpu_slot, self._cpu_slots, self._cores, self._env)
        )
        env = {
            **self._env,
            **cores,
            SECRET_ENV: spec.secret,
            # Inherited by every process of the replica, vLLM's engine core
            # and workers included (which rename themselves and may outlive a
            # crashed parent): `launched_processes` finds them all by it.
            LAUNCHED_BY_ENV: self._settings.registry_url,
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_ids),
        }
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / log_name(spec.replica_id)
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed when the process is reaped
        try:
            popen = subprocess.Popen(
                self.command(spec, gpu_ids),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        return _Process(
            spec.replica_id,
            popen.pid,
            spec.gpu_type,
            gpu_ids,
            popen,
            log_path,
            log_file=log_file,
            cpu_slot=cpu_slot,
        )

    async def adopt(self, handle: ReplicaHandle) -> bool:
        if self._closed or handle.node != NODE:
            return False
        try:
            pid = int(handle.placement["pid"])
            gpus = handle.placement.get("gpu_ids", "")
            gpu_ids = tuple(int(i) for i in gpus.split(",") if i)
        except (KeyError, ValueError):
            return False
        if not _runs_replica(procfs.command_line(pid) or [], handle.replica_id):
            return False
        gpu_type = self._gpu_type_of.get(gpu_ids[0], CPU) if gpu_ids else CPU
        cpu_slot = None
        if gpu_type == CPU:
            # Its cores stay its own; a replica from before slots were kept
            # takes the lowest free one.
            kept = handle.placement.get("cpu_slot", "")
            cpu_slot = int(kept) if kept.isdigit() else self._free_cpu_slot()
        self._processes[handle.replica_id] = _Process(
            handle.replica_id, pid, gpu_type, gpu_ids, None, None, cpu_slot=cpu_slot
        )
        self._watch()
        logger.info("adopted replica %s (pid %d)", handle.replica_id, pid)
        return True

    async def stop(self, handle: ReplicaHandle, grace_s: float) -> None:
        process = self._processes.get(handle.replica_id)
        if process is None or process.kill_at is not None:
            return
        process.kill_at = self._clock() + grace_s
        process.ending = process.ending or ExitReason.STOPPED
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)  # the replica itself: it drains

    async def kill(self, handle: ReplicaHandle) -> None:
        process = self._processes.get(handle.replica_id)
        if process is not None:
            process.ending = ExitReason.KILLED
            _kill_group(process.pid)
            self._poll_once()

    async def exits(self) -> AsyncIterator[ReplicaExit]:
        while True:
            exited = await self._exits.get()
            if exited is None:
                return
            yield exited

    def running(self) -> list[str]:
        """Replica ids whose process has not been seen to end (for tests)."""
        return list(self._processes)

    # -- watching -------------------------------------------------------------------

    def _watch(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        while self._processes:
            await asyncio.sleep(self._poll_s)
            self._poll_once()

    def _poll_once(self) -> None:
        now = self._clock()
        for replica_id, process in list(self._processes.items()):
            returncode = self._poll(process)
            if returncode is False and process.kill_at is not None and now >= process.kill_at:
                logger.warning("replica %s did not drain in time; killing it", replica_id)
                process.ending = ExitReason.KILLED
                _kill_group(process.pid)
                returncode = self._poll(process)
            if returncode is False:
                continue
            # The replica is gone; make sure nothing it started lingers, and
            # call it gone only once its whole group is: vLLM's engine core
            # and workers hold the GPU's memory (and the slot's cores) until
            # they have exited, which a SIGKILLed process takes a moment to do.
            _kill_group(process.pid)
            if group_members(process.pid):
                if process.reaping_since is None:
                    process.reaping_since = now
                if now - process.reaping_since < REAP_TIMEOUT_S:
                    continue
                logger.warning(
                    "replica %s: processes of its group outlived a SIGKILL by %.0f s; "
                    "reporting it gone anyway",
                    replica_id,
                    REAP_TIMEOUT_S,
                )
            del self._processes[replica_id]
            if process.log_file is not None:
                process.log_file.close()
            if process.ending is not None:
                reason = process.ending
            else:
                reason = ExitReason.LOST if process.popen is None else ExitReason.EXITED
            code = None if returncode is None else int(returncode)
            self._exits.put_nowait(ReplicaExit(replica_id, reason, code, _tail(process.log_path)))

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

    async def log_tail(self, replica_id: str, max_bytes: int) -> str | None:
        return await asyncio.to_thread(read_tail, self._log_dir / log_name(replica_id), max_bytes)

    async def shutdown(self, grace_s: float) -> None:
        for replica_id in list(self._processes):
            await self.stop(ReplicaHandle(replica_id, NODE), grace_s)
        deadline = self._clock() + grace_s + 5
        while self._processes and self._clock() < deadline:
            self._poll_once()
            if self._processes:
                await asyncio.sleep(self._poll_s)
        for replica_id in list(self._processes):
            await self.kill(ReplicaHandle(replica_id, NODE))
        self._poll_once()
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._exits.put_nowait(None)


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
