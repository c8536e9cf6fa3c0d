"""Roles and projects in a real Chromium: a viewer sees no button that
changes anything and the server refuses the change anyway; another
project's endpoint is a 404. The console runs in-process (uvicorn on a
thread) over a control plane with two projects and their members, made
through the management API (tests/console_support.py); no replica is needed."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import load_settings
from inferd.testing import free_port
from tests.console_support import ADMIN, seed_projects

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state: Path = tmp_path_factory.mktemp("console-access")
    settings = load_settings(
        env={}, overrides={"state_dir": state, "admin_key": ADMIN, "public_url": url}
    )
    server: list[uvicorn.Server] = []

    async def serve() -> None:
        # The plane lives in the server's own loop (the sync Playwright API
        # runs a loop in the test's thread, so no asyncio.run there).
        plane = await build(settings, launcher=FakeLauncher(), run_replicas=False)
        try:
            config = uvicorn.Config(
                create_app(plane),
                host="127.0.0.1",
                port=port,
                log_level="warning",
            )
            server.append(uvicorn.Server(config))
            await server[0].serve()
        finally:
            await plane.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server and server[0].started):
        assert thread.is_alive() and time.monotonic() < deadline, "the console did not start"
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=url) as client:
            keys = seed_projects(client)
        yield url, keys
    finally:
        server[0].should_exit = True
        thread.join(10)


def signed_in_page(browser: Any, url: str, key: str) -> Any:
    from playwright.sync_api import expect

    page = browser.new_context().new_page()
    page.goto(f"{url}/console/signin")
    page.get_by_label("Key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/console/endpoints$"))
    return page


def create(page: Any, url: str, project: str, name: str) -> str:
    from playwright.sync_api import expect

    page.goto(f"{url}/console/endpoints/new")
    page.get_by_test_id("project").select_option(project)
    page.get_by_test_id("name").fill(name)
    page.get_by_test_id("model").select_option("tiny-chat")
    page.get_by_test_id("create-submit").click()
    expect(page.get_by_test_id("endpoint-name")).to_have_text(name)
    return str(page.url.rsplit("/", 1)[-1])


def test_viewer_and_other_project(browser: Any, console: tuple[str, dict[str, str]]) -> None:
    from playwright.sync_api import expect

    console_url, keys = console

    admin = signed_in_page(browser, console_url, ADMIN)
    alpha_id = create(admin, console_url, "alpha", "a-chat")
    other_id = create(admin, console_url, "beta", "b-chat")

    viewer = signed_in_page(browser, console_url, keys["vera"])
    expect(viewer.get_by_test_id("row-a-chat")).to_be_visible()
    expect(viewer.get_by_test_id("row-b-chat")).to_have_count(0)
    expect(viewer.get_by_role("link", name="Create endpoint")).to_have_count(0)
    viewer.goto(f"{console_url}/console/endpoints/{alpha_id}")
    expect(viewer.get_by_test_id("endpoint-name")).to_have_text("a-chat")
    for test_id in ("request-token", "settings-save", "delete-submit"):
        expect(viewer.get_by_test_id(test_id)).to_have_count(0)
    assert viewer.locator("form[method=post]").count() == 1  # sign out only
    # The server refuses what the page does not offer, CSRF token and all.
    csrf = viewer.locator("input[name=csrf]").first.get_attribute("value")
    for path, form in (
        (f"/console/endpoints/{alpha_id}/token", {}),
        (f"/console/endpoints/{alpha_id}/delete", {"confirm_name": "a-chat"}),
        (f"/console/endpoints/{alpha_id}/settings", {"minReplicas": "1"}),
    ):
        answer = viewer.request.post(f"{console_url}{path}", form={"csrf": csrf, **form})
        assert answer.status == 403, path
    # Another project's endpoint does not exist for this principal.
    assert viewer.goto(f"{console_url}/console/endpoints/{other_id}").status == 404

    other = signed_in_page(browser, console_url, keys["olga"])
    assert other.goto(f"{console_url}/console/endpoints/{alpha_id}").status == 404
    other.goto(f"{console_url}/console/usage")
    expect(other.get_by_test_id("project-name")).to_have_text("beta")
