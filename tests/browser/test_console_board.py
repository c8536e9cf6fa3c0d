"""The endpoints board in a real Chromium over more endpoints than one page:
next and previous swapped in by htmx (the address follows), a filter by
name and by status, live updates on the page shown, a project member's
pages holding only their project's endpoints, and the same paging and
filter in a browser without scripts (plain links and a GET form). In-process
control plane with fake replicas (tests/console_support.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inferd.console.pages.board import PAGE_SIZE
from tests.console_support import ADMIN, ServedConsole, signed_in

pytestmark = [pytest.mark.browser]

PER_PROJECT = PAGE_SIZE + 10  # alpha alone spans two pages; everything, three


@pytest.fixture(scope="module")
def endpoints(console: ServedConsole) -> dict[str, str]:
    """Alpha's and beta's endpoints, interleaved so that every store page
    mixes the two projects: name -> id, in the order they were created."""
    ids = {}
    for i in range(PER_PROJECT):
        for project in ("alpha", "beta"):
            name = f"{project[0]}-{i:03d}"
            record = console.api("POST", "/endpoints", json={
                "name": name, "modelName": "tiny-chat", "locationName": "local",
                "minReplicas": 0, "maxReplicas": 1, "projectId": project,
            })  # fmt: skip
            ids[name] = record["id"]
    return ids


def shown(page: Any) -> list[str]:
    names = page.locator("#rows tr[data-testid^=row-]").evaluate_all(
        "rows => rows.map(r => r.dataset.testid.slice(4))"
    )
    return list(names)


def test_pages_and_filters_with_htmx(
    browser: Any, console: ServedConsole, endpoints: dict[str, str]
) -> None:
    from playwright.sync_api import expect

    names = list(endpoints)
    page = signed_in(browser, console.url, ADMIN)
    page.evaluate("window.__notReloaded = true")
    number, following, preceding = (
        page.get_by_test_id("page-number"),
        page.get_by_test_id("page-next"),
        page.get_by_test_id("page-previous"),
    )
    expect(number).to_have_text("Page 1")
    expect(preceding).to_have_count(0)
    assert shown(page) == names[:PAGE_SIZE]
    following.click()
    expect(number).to_have_text("Page 2")
    expect(page).to_have_url(re.compile(r"/console/endpoints\?page=\d+$"))
    assert shown(page) == names[PAGE_SIZE : 2 * PAGE_SIZE]
    second_url = page.url
    following.click()
    expect(number).to_have_text("Page 3")
    expect(following).to_have_count(0)
    assert shown(page) == names[2 * PAGE_SIZE :]
    preceding.click()
    expect(number).to_have_text("Page 2")
    assert page.url == second_url
    assert shown(page) == names[PAGE_SIZE : 2 * PAGE_SIZE]

    # The page shown follows changes made elsewhere, in place.
    row = page.get_by_test_id(f"row-{names[PAGE_SIZE + 3]}")
    expect(row.get_by_test_id("replicas")).to_have_text("0 / 0 / 1")
    console.api("PATCH", f"/endpoints/{endpoints[names[PAGE_SIZE + 3]]}", json={"maxReplicas": 4})
    expect(row.get_by_test_id("replicas")).to_have_text("0 / 0 / 4", timeout=15_000)

    # Filters: a name prefix as typed, then a status; each starts at page 1.
    page.get_by_test_id("search").fill("B-01")
    expect(number).to_have_text("Page 1")
    expect(page.locator("#rows tr[data-testid^=row-]")).to_have_count(10)
    assert shown(page) == [f"b-01{i}" for i in range(10)]
    expect(following).to_have_count(0)
    console.api("PATCH", f"/endpoints/{endpoints['a-042']}", json={"minReplicas": 1})
    page.get_by_test_id("search").fill("")
    page.get_by_test_id("status-filter").select_option("pending")
    # Pending once the reconciler has looked at it: a moment, longer on a
    # loaded machine than Playwright's default 5 s.
    expect(page.locator("#rows tr[data-testid^=row-]")).to_have_count(1, timeout=15_000)
    assert shown(page) == ["a-042"]
    expect(page).to_have_url(re.compile(r"/console/endpoints\?status=pending$"))
    page.get_by_test_id("location-filter").select_option("us-east")
    expect(page.get_by_test_id("empty-state")).to_contain_text(
        "No endpoint matches status pending and location us-east"
    )
    expect(page).to_have_url(re.compile(r"/console/endpoints\?status=pending&location=us-east$"))
    page.get_by_test_id("location-filter").select_option("local")
    expect(page.locator("#rows tr[data-testid^=row-]")).to_have_count(1, timeout=15_000)
    assert page.evaluate("window.__notReloaded") is True


def test_a_member_pages_through_their_project_only(
    browser: Any, console: ServedConsole, endpoints: dict[str, str]
) -> None:
    from playwright.sync_api import expect

    page = signed_in(browser, console.url, console.keys["vera"])  # alpha's viewer
    alpha = [name for name in endpoints if name.startswith("a-")]
    assert shown(page) == alpha[:PAGE_SIZE]
    page.get_by_test_id("page-next").click()
    expect(page.get_by_test_id("page-number")).to_have_text("Page 2")
    expect(page.locator("#rows tr[data-testid^=row-]")).to_have_count(PER_PROJECT - PAGE_SIZE)
    assert shown(page) == alpha[PAGE_SIZE:]
    expect(page.get_by_test_id("page-next")).to_have_count(0)
    page.get_by_test_id("search").fill("b-")
    expect(page.get_by_test_id("empty-state")).to_contain_text("No endpoint matches “b-”")


def test_pages_and_filters_without_scripts(
    browser: Any, console: ServedConsole, endpoints: dict[str, str]
) -> None:
    from playwright.sync_api import expect

    page = signed_in(browser, console.url, console.keys["olga"], java_script_enabled=False)
    beta = [name for name in endpoints if name.startswith("b-")]
    assert shown(page) == beta[:PAGE_SIZE]
    page.get_by_test_id("page-next").click()
    expect(page.get_by_test_id("page-number")).to_have_text("Page 2")
    assert shown(page) == beta[PAGE_SIZE:]
    page.get_by_test_id("page-previous").click()
    expect(page.get_by_test_id("page-number")).to_have_text("Page 1")
    assert shown(page) == beta[:PAGE_SIZE]
    page.get_by_test_id("search").fill("b-05")
    page.get_by_test_id("filter-submit").click()
    expect(page).to_have_url(re.compile(r"/console/endpoints\?name=b-05&status=&model=&location=$"))
    assert shown(page) == [f"b-05{i}" for i in range(10)]
    page.get_by_test_id("model-filter").select_option("tiny-sdxl")
    page.get_by_test_id("filter-submit").click()
    expect(page.get_by_test_id("empty-state")).to_contain_text(
        "No endpoint matches “b-05” and model tiny-sdxl"
    )
