"""The Ray actor that holds one replica's place on a node and runs it there.

Ray places it (GPUs, GPU type, location) and sets CUDA_VISIBLE_DEVICES to
the GPUs it reserved; the actor starts the same replica process the local
launcher starts (`python -m inferd.replica ...`) as its child, bound to the
node's address, and reports when it ends. Ray is never in the request path:
the replica reports its own URL to the control plane, and the gateway talks
to it directly.

No replica outlives its actor: the child is started with a parent-death
signal (PR_SET_PDEATHSIG, SIGKILL), which Ray's own child cleanup does not
give when the actor's worker is SIGKILLed or its node is lost; the replica's
group reaper then takes its engine's processes with it (`replica.groups`);
the replica's orphan timeout covers the rest (a lost control plane). Each
actor, as it starts, sweeps its node for the leftovers of ended replicas. An actor whose
replica has ended and that nobody removes (the control plane is gone) exits
by itself after `linger_s`, giving its GPUs back.

This module does not import Ray at import time: the launcher wraps the
class with `ray.remote` when it is chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inferd.control.launchers.logs import log_name, read_tail

NODE_HOST = "{node_ip}"  # replaced in the command by the node's address
PYTHON = "{python}"  # replaced by the node's Python (the actor's own)
_PR_SET_PDEATHSIG = 1
_LOG_TAIL = 2000
_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the actor's process dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def missing_model_reason(model: str, node: str) -> str | None:
    """A model given as a directory must exist on the node the replica runs
    on (weights are not copied between nodes); a Hugging Face id or a
    built-in model is fetched or built there."""
    if model.startswith("builtin:") or (_HF_REPO_ID.match(model) and not model.startswith(".")):
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        return None
    return f"model directory {model} does not exist on node {node}"


class ReplicaHost:
    def __init__(
        self,
        replica_id: str,
        command: Sequence[str],
        env: Mapping[str, str],
        model: str,
        linger_s: float = 60.0,
        *,
        endpoint_id: str = "",
    ) -> None:
        self.replica_id = replica_id
        self.endpoint_id = endpoint_id
        self._command = list(command)
        self._env = dict(env)
        self._model = model
        self._linger_s = linger_s
        self._process: asyncio.subprocess.Process | None = None
        self._returncode: int | None = None
        self._failure: str | None = None  # why the replica never started
        self._ended = asyncio.Event()
        log_dir = Path(tempfile.gettempdir()) / "inferd-replicas"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = log_dir / log_name(replica_id)
        self._tasks: set[asyncio.Task[None]] = set()

    def _node(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    async def start(self) -> dict[str, Any]:
        """Start the replica (once); returns `info()`."""
        if self._process is None and self._failure is None:
            from inferd.replica.groups import sweep

            await asyncio.to_thread(sweep)
            node_ip, node_id = self._node()
            self._failure = missing_model_reason(self._model, f"{node_ip} ({node_id[:12]})")
            if self._failure is None:
                await self._spawn(node_ip)
            else:
                self._ended.set()  # no process, no exit code: the reason says it all
                self._schedule_linger()
        return await self.info()

    async def _spawn(self, node_ip: str) -> None:
        placeholders = {NODE_HOST: node_ip, PYTHON: sys.executable}
        command = [placeholders.get(arg, arg) for arg in self._command]
        # Ray's own variables describe the actor's worker, and Ray pins a
        # worker's OpenMP threads to its CPU reservation (0 here); the
        # replica is not a Ray worker and sizes its own threads.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RAY_") and k != "OMP_NUM_THREADS"
        }
        env.update(self._env)
        log = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *command,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own group: vLLM's processes included
                preexec_fn=_die_with_parent,
            )
        finally:
            os.close(log)  # the child has its own copy
        task = asyncio.ensure_future(self._watch(self._process))
        self._tasks.add(task)

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        self._returncode = await process.wait()
        # The replica is gone; nothing it started may linger.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        self._ended.set()
        self._schedule_linger()

    def _schedule_linger(self) -> None:
        async def linger() -> None:
            await asyncio.sleep(self._linger_s)
            os._exit(0)  # nobody removed this actor: give its resources back

        task = asyncio.ensure_future(linger())
        self._tasks.add(task)

    async def wait(self) -> tuple[int | None, str]:
        """Until the replica ends: its exit code and the tail of its output
        (or why it never started)."""
        await self._ended.wait()
        return self._returncode, self._failure or self._tail()

    async def info(self) -> dict[str, Any]:
        node_ip, node_id = self._node()
        return {
            "replicaId": self.replica_id,
            "endpointId": self.endpoint_id,
            "pid": self._process.pid if self._process else None,
            "running": self._process is not None and not self._ended.is_set(),
            "returncode": self._returncode,
            "failure": self._failure,
            "nodeIp": node_ip,
            "nodeId": node_id,
            "cudaVisibleDevices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "logPath": str(self._log_path),
        }

    async def terminate(self) -> None:
        """SIGTERM to the replica itself: it drains and exits."""
        if self._process is not None and not self._ended.is_set():
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGTERM)

    async def kill(self) -> None:
        """SIGKILL to the replica's whole process group, at once."""
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)

    async def log_tail(self, max_bytes: int) -> str | None:
        """The end of the replica's log, read on this node."""
        return read_tail(self._log_path, max_bytes)

    def _tail(self) -> str:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _LOG_TAIL))
                return f.read().decode(errors="replace")
        except OSError:
            return ""
