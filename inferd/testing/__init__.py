"""Helpers for tests and benchmarks: run replica processes and async code.

Shipped in the package (as LitServe does with its fakes) so that the test
suite, the benchmarks and users' own tests start replicas the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from inferd import procfs
from inferd.api.replica import ReplicaReport
from inferd.control.endpoints.tokens import TokenVerifier, hash_token
from inferd.control.stores.memory import MemoryStore

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


def replica_processes(registry_port: int) -> list[int]:
    """PIDs of replica processes started by the control plane on this port."""
    marker = f":{registry_port}/internal/registry".encode()
    pids = []
    for pid in procfs.all_pids():
        cmdline = b"\0".join(procfs.command_line(pid) or [])
        if b"inferd.replica" in cmdline and marker in cmdline and procfs.alive(pid):
            pids.append(pid)
    return pids


class ServeHandle:
    """`inferd serve` as a real process, with its own state directory."""

    def __init__(
        self,
        state_dir: Path,
        *,
        port: int | None = None,
        admin_key: str | None = "infd_admin_test_key_0123456789abcdef",
        settings: dict[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_key = admin_key
        # The developer's own INFERD_* settings must not leak in; the shared
        # cache of tiny models may.
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERD_")}
        if "INFERD_CACHE_DIR" in os.environ:
            env["INFERD_CACHE_DIR"] = os.environ["INFERD_CACHE_DIR"]
        if admin_key is not None:
            env["INFERD_ADMIN_KEY"] = admin_key
        self.env = env
        self.settings = dict(settings or {})
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._groups_seen: set[int] = set()

    def start(self, timeout: float = 60) -> ServeHandle:
        self.runs += 1
        self.state_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "inferd", "serve",
            "--port", str(self.port),
            "--state-dir", str(self.state_dir / "state"),
        ]  # fmt: skip
        for key, value in self.settings.items():
            command += ["--" + key.replace("_", "-"), value]
        self.out_path = self.state_dir / f"serve-{self.runs}.log"
        with open(self.out_path, "wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"inferd serve exited:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise TimeoutError(f"inferd serve did not start:\n{self.log()}")

    def log(self) -> str:
        return self.out_path.read_text(errors="replace")[-8000:]

    def api(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def create_endpoint(self, **body: Any) -> dict[str, Any]:
        with self.api() as api:
            response = api.post("/inference/endpoints", json=body)
        if response.status_code != 201:
            raise AssertionError(f"create failed: {response.status_code} {response.text}")
        return dict(response.json())

    def record(self, endpoint_id: str) -> dict[str, Any]:
        with self.api() as api:
            response = api.get(f"/inference/endpoints/{endpoint_id}")
        response.raise_for_status()
        return dict(response.json())

    def wait_record(
        self, endpoint_id: str, predicate: Any, timeout: float = 120, interval: float = 0.2
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        record = self.record(endpoint_id)
        while time.monotonic() < deadline:
            if predicate(record):
                return record
            time.sleep(interval)
            record = self.record(endpoint_id)
        raise AssertionError(f"record never matched within {timeout}s: {record}")

    def replica_pids(self) -> list[int]:
        """The replica processes (one per replica) this server launched."""
        pids = replica_processes(self.port)
        self._groups_seen.update(pids)  # each leads its own process group
        return pids

    def replica_url(self, replica_id: str) -> str:
        """A replica's own base URL, from the line it logs when it binds."""
        log = self.state_dir / "state" / "logs" / f"replica-{replica_id}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        match = re.search(rf"replica {replica_id} serving .*? on (http://\S+)", text)
        if match is None:
            raise AssertionError(f"replica {replica_id} has not logged its URL")
        return match.group(1)

    def launched_pids(self) -> list[int]:
        """Every live process this server launched or its replicas started
        (vLLM's engine core and workers included): [] once all are gone."""
        from inferd.control.launchers.local import launched_processes
        from inferd.control.replicas.registry_api import REGISTRY_PATH

        self.replica_pids()
        return launched_processes(f"http://127.0.0.1:{self.port}{REGISTRY_PATH}", self._groups_seen)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def cleanup(self) -> None:
        """Stop the server and make sure no replica of it is left."""
        self.stop()
        for pid in self.replica_pids():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for pid in self.launched_pids():  # children that left their group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def verifier_for(tokens: Mapping[str, str]) -> TokenVerifier:
    """A token verifier that knows exactly these endpoint tokens (endpoint id ->
    token), for gateways built without a control plane (tests, benchmarks)."""
    verifier = TokenVerifier(MemoryStore())
    for endpoint_id, token in tokens.items():
        verifier.set_active(endpoint_id, hash_token(token))
    return verifier


_report_seq = itertools.count(1)


def replica_report(replica_id: str, fields: Mapping[str, Any]) -> ReplicaReport:
    """A replica's status report as it arrives on the wire: `fields` in the
    report's JSON spelling (`{"status": "ready", "url": ...}`), numbered after
    every earlier one (a registry drops reports older than one it applied)."""
    body = {"replicaId": replica_id, "seq": next(_report_seq), **fields}
    return ReplicaReport.model_validate_json(json.dumps(body))


# The function tool that chat tests and benchmarks offer (OpenAI's shape).
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


async def open_loop(
    targets: Sequence[str],
    token: str,
    body: Mapping[str, Any],
    rate: float,
    duration: float,
    limits: httpx.Limits | None = None,
) -> list[tuple[float, int, float]]:
    """Requests sent at fixed times (`rate` a second, round robin over
    `targets`) whatever the answers: (sent at, status, latency) each; a
    connection error counts as status 0."""
    results: list[tuple[float, int, float]] = []
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=60, limits=limits or httpx.Limits()) as client:

        async def one(url: str, at: float) -> None:
            try:
                status = (await client.post(url, json=body, headers=headers)).status_code
            except httpx.HTTPError:
                status = 0
            results.append((at, status, time.monotonic() - at))

        start = time.monotonic()
        tasks = []
        for n in range(int(rate * duration)):
            at = start + n / rate
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(targets[n % len(targets)], at)))
        await asyncio.gather(*tasks)
    return results
