"""What the console's tests share: two projects and two members for the
tests of scoping and roles (in-process and in the browser), made through the
management API with the operator key ('alpha' with vera as viewer, 'beta'
with olga as developer), and a control plane with its console served on a
loopback port for a real browser, with fake replicas."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import uvicorn

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from inferd.testing import free_port

ADMIN = "test-admin-key-0123456789"


class Client(Protocol):
    def request(self, method: str, url: str, **kwargs: Any) -> Any: ...


def seed_projects(client: Client, admin_key: str = ADMIN) -> dict[str, str]:
    """Returns each member's plaintext key by user name."""
    auth = {"Authorization": f"Bearer {admin_key}"}
    keys = {}
    for project in ("alpha", "beta"):
        answer = client.request("POST", "/inference/projects", headers=auth, json={"id": project})
        assert answer.status_code == 201, answer.text
    for project, user, role in (("alpha", "vera", "viewer"), ("beta", "olga", "developer")):
        answer = client.request(
            "PUT",
            f"/inference/projects/{project}/members/{user}",
            headers=auth,
            json={"role": role},
        )
        assert answer.status_code < 300, answer.text
        keys[user] = answer.json()["createdKey"]["key"]
    return keys


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


def sign_in(client: Client, key: str = ADMIN) -> str:
    """Signs an in-process client (Starlette's TestClient) in to the console;
    returns the session's CSRF token."""
    form = client.request("GET", "/console/signin")
    answer = client.request(
        "POST", "/console/signin", data={"key": key, "csrf": csrf_of(form.text)},
        follow_redirects=False,
    )  # fmt: skip
    assert answer.status_code == 303, answer.text
    return csrf_of(client.request("GET", "/console/endpoints").text)


@dataclass
class ServedConsole:
    url: str
    keys: dict[str, str]  # user -> plaintext management key (seed_projects)
    plane: Server
    loop: asyncio.AbstractEventLoop

    def api(self, method: str, path: str, key: str = ADMIN, **kwargs: Any) -> Any:
        answer = httpx.request(
            method, f"{self.url}/inference{path}",
            headers={"Authorization": f"Bearer {key}"}, timeout=120, **kwargs,
        )  # fmt: skip
        assert answer.status_code < 300, answer.text
        return answer.json() if answer.content else None

    def run(self, coro: Any) -> Any:
        """A coroutine on the plane's own loop (its store lives there)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)


@contextlib.contextmanager
def served_console(state: Path) -> Iterator[ServedConsole]:
    """A control plane (fake launcher, no replicas run) serving its API and
    console on a loopback port, with projects alpha and beta seeded. It
    runs in its own thread's event loop: Playwright's sync API keeps a loop
    running in the test's thread, so no asyncio.run there."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = load_settings(
        env={}, overrides={"state_dir": state, "admin_key": ADMIN, "public_url": url}
    )
    server: list[uvicorn.Server] = []
    planes: list[tuple[Server, asyncio.AbstractEventLoop]] = []

    async def serve() -> None:
        plane = await build(settings, launcher=FakeLauncher(), run_replicas=False)
        planes.append((plane, asyncio.get_running_loop()))
        try:
            config = uvicorn.Config(create_app(plane), host="127.0.0.1", port=port,
                                    log_level="warning")  # fmt: skip
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
        yield ServedConsole(url, keys, *planes[0])
    finally:
        server[0].should_exit = True
        thread.join(10)


def signed_in(browser: Any, url: str, key: str, **context: Any) -> Any:
    """A new browser context's page, signed in to the console at `url` with
    `key`, on the endpoints board. `context`: Playwright's context options
    (`java_script_enabled=False` for a browser without scripts)."""
    from playwright.sync_api import expect

    page = browser.new_context(**context).new_page()
    page.goto(f"{url}/console/signin")
    page.get_by_label("Key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/console/endpoints$"))
    return page
