"""Roles and projects in a real Chromium: a viewer sees no button that
changes anything and the server refuses the change anyway; another
project's endpoint is a 404. The console runs in-process (uvicorn on a
thread) over a control plane with two projects and their members, made
through the management API (tests/console_support.py); no replica is needed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.console_support import ADMIN, ServedConsole, signed_in

pytestmark = [pytest.mark.browser]


def create(page: Any, url: str, project: str, name: str) -> str:
    from playwright.sync_api import expect

    page.goto(f"{url}/console/endpoints/new")
    page.get_by_test_id("project").select_option(project)
    page.get_by_test_id("name").fill(name)
    page.get_by_test_id("model").select_option("tiny-chat")
    page.get_by_test_id("create-submit").click()
    expect(page.get_by_test_id("endpoint-name")).to_have_text(name)
    return str(page.url.rsplit("/", 1)[-1])


def test_viewer_and_other_project(browser: Any, console: ServedConsole) -> None:
    from playwright.sync_api import expect

    console_url, keys = console.url, console.keys

    admin = signed_in(browser, console_url, ADMIN)
    alpha_id = create(admin, console_url, "alpha", "a-chat")
    other_id = create(admin, console_url, "beta", "b-chat")

    viewer = signed_in(browser, console_url, keys["vera"])
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

    other = signed_in(browser, console_url, keys["olga"])
    assert other.goto(f"{console_url}/console/endpoints/{alpha_id}").status == 404
    other.goto(f"{console_url}/console/usage")
    expect(other.get_by_test_id("project-name")).to_have_text("beta")
