"""Markers and small helpers shared by test modules (import from here, not
from conftest)."""

from __future__ import annotations

import importlib.util
import threading
import time
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferd.testing import free_port

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None

needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
needs_diffusers = pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers is not installed")


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
