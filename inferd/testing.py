"""Helpers for tests and benchmarks: run replica processes and async code.

Shipped in the package (as LitServe does with its fakes) so that the test
suite, the benchmarks and users' own tests start replicas the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopThread:
    """An event loop on its own thread, for sharing one started engine across
    synchronous tests (an engine is bound to the loop that started it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class ReplicaHandle:
    """A replica started as a real process (`python -m inferd.replica`)."""

    def __init__(
        self,
        model: str,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="inferd-replica-")
        self.port_file = Path(self._tmp.name) / "port"
        self.log_path = log_path or Path(self._tmp.name) / "replica.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = [
            sys.executable, "-m", "inferd.replica",
            "--model", model,
            "--port", "0",
            "--port-file", str(self.port_file),
            *args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: vLLM's workers included
        )
        self.url = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 300) -> ReplicaHandle:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica exited with {self.process.returncode}:\n{self.log()}")
            if not self.url and self.port_file.exists() and self.port_file.read_text().strip():
                self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"
            if self.url:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                        return self
            time.sleep(0.2)
        raise TimeoutError(f"replica not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (drain), then SIGKILL of the whole group if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        self._log.close()
        self._tmp.cleanup()
        return self.process.returncode

    def __enter__(self) -> ReplicaHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
