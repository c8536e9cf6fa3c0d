"""The console, in a real Chromium, for two teams on one server: another
project's private model is not offered (form nor options fragment), and the
pages read as words: validation errors, statuses, a header badge that
follows the live section, charts with a time axis and a "no data yet" state,
a log panel never blank, a deleted endpoint's usage under its name, the
playground's token hint. In-process control plane with fake replicas
(tests/console_support.py seeds two projects)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from inferd.control.accounts.model import UsageDelta, hour_of
from tests.console_support import ADMIN, ServedConsole, signed_in

pytestmark = [pytest.mark.browser]


def test_another_projects_model_is_not_offered(
    browser: Any, console: ServedConsole, tiny_chat_dir: Path
) -> None:
    from playwright.sync_api import expect

    private = console.api("POST", "/models", json={
        "source": str(tiny_chat_dir), "name": "secret-weights", "projectId": "alpha",
    })["name"]  # fmt: skip
    assert private == "alpha:secret-weights"
    olga = signed_in(browser, console.url, console.keys["olga"])  # beta's developer
    olga.goto(f"{console.url}/console/endpoints/new")
    offered = olga.get_by_test_id("model").locator("option").all_text_contents()
    assert "tiny-chat" in " ".join(offered)
    assert not [o for o in offered if "secret-weights" in o]
    # Nor through the options fragment, asked for by name.
    olga.goto(f"{console.url}/console/endpoints/new/options?model={private}&location=local")
    expect(olga.get_by_test_id("recommendations")).to_be_visible()
    assert "secret-weights" not in olga.content()


def test_pages_read_as_words(browser: Any, console: ServedConsole) -> None:
    from playwright.sync_api import expect

    page = signed_in(browser, console.url, ADMIN)
    # A name the API's pattern refuses: the form says what it wants, in words.
    page.goto(f"{console.url}/console/endpoints/new")
    page.get_by_test_id("project").select_option("beta")
    page.get_by_test_id("name").fill("Bad_Name")
    page.get_by_test_id("model").select_option("tiny-chat")
    page.get_by_test_id("create-submit").click()
    error = page.get_by_test_id("create-error")
    expect(error).to_contain_text("Name: use lowercase letters, digits and '-'")
    assert "pattern" not in error.inner_text()

    page.get_by_test_id("name").fill("worded")
    page.get_by_test_id("create-submit").click()
    expect(page.get_by_test_id("endpoint-name")).to_have_text("worded")
    endpoint_id = page.url.rsplit("/", 1)[-1]
    # minReplicas 0: a status in words, the same in the header and the live part.
    badge, live = page.get_by_test_id("endpoint-status"), page.get_by_test_id("live-status")
    expect(live).to_have_text("scaled to zero")
    expect(badge).to_have_text("scaled to zero")
    # The charts: a time axis, and no empty plot passed off as a flat line.
    requests = page.get_by_test_id("chart-requests")
    expect(requests.get_by_test_id("chart-no-data")).to_be_visible()
    ticks = requests.get_by_test_id("chart-time-axis").locator("span").all_text_contents()
    assert len(ticks) == 3 and all(re.match(r"\d\d:\d\d", t) for t in ticks), ticks
    assert ticks[-1].endswith("UTC")
    # The log panel says what it has without a click.
    expect(page.get_by_test_id("log-panel").get_by_test_id("log-empty")).to_be_visible()

    # A change made elsewhere: the header badge follows the polled live part.
    console.api("PATCH", f"/endpoints/{endpoint_id}", json={"minReplicas": 1, "maxReplicas": 1})
    expect(live).not_to_have_text("scaled to zero", timeout=15_000)
    expect(badge).to_have_text(live.inner_text(), timeout=15_000)
    assert "scaledToZero" not in page.content().replace('data-status="scaledToZero"', "")

    # The playground's token hint is how tokens start.
    page.goto(f"{console.url}/console/endpoints/{endpoint_id}/playground")
    placeholder = page.get_by_test_id("pg-token").get_attribute("placeholder")
    assert placeholder is not None and placeholder.startswith("infd_ep_")

    # Usage outlives the endpoint: listed under the name it had.
    now = datetime.now(UTC)
    console.run(console.plane.accounts.store.add_usage([
        UsageDelta(endpoint_id, "beta", hour_of(now), "cpu", 1, replica_seconds=90.0,
                   requests=3),
    ]))  # fmt: skip
    console.api("DELETE", f"/endpoints/{endpoint_id}")
    page.goto(f"{console.url}/console/usage")
    beta = page.get_by_test_id("project-beta")
    expect(beta.get_by_test_id("deleted-name")).to_have_text("worded")
