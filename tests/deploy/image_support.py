"""Building inferd's image (scripts/build_image.sh) and running commands in it
with buildah: `buildah run` shares the host's network, so a server started in
the image answers on 127.0.0.1 like a local one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def build(flavor: str, tag: str, log: Path, timeout: float = 3600) -> str:
    """The build's output (it ends with each layer's size)."""
    with open(log, "wb") as out:
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "build_image.sh"), flavor, tag],
            stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False,
        )  # fmt: skip
    text = log.read_text(errors="replace")
    assert done.returncode == 0, f"build_image.sh {flavor} failed:\n{text[-6000:]}"
    return text


class Container:
    """A working container of an image; commands run in it as its user."""

    def __init__(self, image: str) -> None:
        self.name = subprocess.run(
            ["buildah", "from", "--pull-never", image],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip

    def command(self, *argv: str, env: dict[str, str] | None = None) -> list[str]:
        # `env` in the image, not buildah's: the variables are the container's.
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        return ["buildah", "run", "--isolation", "chroot", self.name, "--", *prefix, *argv]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True, check=False)


class ImageServer:
    """`inferd serve` inside a container, on a port of this machine."""

    def __init__(self, container: Container, port: int, log: Path, env: dict[str, str]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log
        command = container.command(
            "inferd", "serve", "--host", "127.0.0.1", "--port", str(port), env=env
        )
        with open(log, "wb") as out:
            # Its own session: stopping it reaches buildah and what runs under it.
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def wait_healthy(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"inferd serve exited:\n{self.log()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise AssertionError(f"inferd serve in the image never answered:\n{self.log()}")

    def stop(self, timeout: float = 120) -> None:
        """SIGTERM: the server drains and stops its replicas; then whatever is left."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
