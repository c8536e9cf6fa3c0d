"""The console in a real Chromium against a real `inferd serve`: sign in,
create tiny-chat from the recommendation table, the token shown once and
copied, the playground streaming from a real vLLM replica, the image
playground on tiny-sdxl, a new token and the old one refused, scale events,
a live list, delete. Screenshots of each page go to the test's tmp dir (the
README's come from scripts/console_screenshots.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.testing import ServeHandle
from tests.support import needs

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
]

SERVE_SETTINGS = {
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "autoscale_upscale_delay_seconds": "1",
    "autoscale_downscale_delay_seconds": "2",
    "replica_drain_timeout_seconds": "10",
    "replica_args": "--cpu-kv-cache-gib 1",
}
# ms: vLLM loads in 30-60 s on a quiet 2-core CPU, and took 320 s while
# seven other test suites shared the machine.
REPLICA_READY_S = 600_000


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    handle = ServeHandle(tmp_path_factory.mktemp("console-serve"), settings=SERVE_SETTINGS).start()
    try:
        yield handle
    finally:
        handle.cleanup()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.grant_permissions(["clipboard-read", "clipboard-write"])
    try:
        yield ctx
    finally:
        ctx.close()


def sign_in(page: Any, serve: ServeHandle) -> None:
    from playwright.sync_api import expect

    page.goto(f"{serve.url}/console/")
    expect(page).to_have_url(re.compile(r"/console/signin$"))
    page.get_by_label("Key").fill(serve.admin_key or "")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/console/endpoints$"))
    expect(page.get_by_test_id("principal")).to_contain_text("operator")


def create_endpoint(page: Any, serve: ServeHandle, name: str, model: str) -> str:
    """Through the create form, taking the recommended option; returns the id."""
    from playwright.sync_api import expect

    page.goto(f"{serve.url}/console/endpoints/new")
    page.get_by_test_id("name").fill(name)
    page.get_by_test_id("model").select_option(model)
    page.get_by_test_id("location").select_option("local")
    best = page.get_by_test_id("option-cpu-1")
    expect(best.get_by_test_id("best")).to_have_text("recommended")
    expect(best.locator("input[type=radio]")).to_be_checked()
    page.get_by_test_id("min").fill("1")
    page.get_by_test_id("max").fill("2")
    expect(page.get_by_test_id("ceiling")).to_contain_text("per hour")
    page.get_by_test_id("create-submit").click()
    expect(page.get_by_test_id("endpoint-name")).to_have_text(name)
    return str(page.url.rsplit("/", 1)[-1])


def chat(serve: ServeHandle, endpoint_id: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{serve.url}/endpoints/{endpoint_id}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "model": "tiny-chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
        timeout=300,
    )


@needs("vllm")
def test_chat_endpoint_from_create_to_delete(
    serve: ServeHandle, context: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    sign_in(page, serve)
    expect(page.get_by_test_id("empty-state")).to_contain_text("Create your first endpoint")
    page.screenshot(path=str(tmp_path / "empty.png"))

    endpoint_id = create_endpoint(page, serve, "console-chat", "tiny-chat")
    # The token: shown once, copied with the button, gone on reload.
    token = page.get_by_test_id("token").inner_text().strip()
    assert token.startswith("infd_ep_")
    page.get_by_test_id("copy-token").click()
    assert page.evaluate("navigator.clipboard.readText()") == token
    page.reload()
    expect(page.get_by_test_id("token")).to_have_count(0)
    assert token not in page.content()
    expect(page.get_by_test_id("snippet-curl")).to_contain_text("<ACCESS_TOKEN>")

    # The list updates by itself while the replica comes up.
    page.goto(f"{serve.url}/console/endpoints")
    page.evaluate("window.__notReloaded = true")
    row = page.get_by_test_id("row-console-chat")
    expect(row.get_by_test_id("status")).to_have_text("running", timeout=REPLICA_READY_S)
    expect(row.get_by_test_id("replicas")).to_have_text("1 / 1 / 2")
    assert page.evaluate("window.__notReloaded") is True
    page.get_by_test_id("search").fill("no-such-thing")
    expect(page.get_by_test_id("empty-state")).to_contain_text("No endpoint matches")
    page.get_by_test_id("search").fill("console")
    expect(row).to_be_visible()

    # Playground: streamed from the real replica, with the token this tab kept.
    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}/playground")
    expect(page.get_by_test_id("pg-token")).to_have_value(token)
    page.get_by_test_id("pg-max-tokens").fill("16")
    page.get_by_test_id("pg-send").click()
    expect(page.get_by_test_id("pg-rate")).to_contain_text("tokens", timeout=REPLICA_READY_S)
    assert page.get_by_test_id("pg-output").inner_text().strip() != ""
    expect(page.get_by_test_id("pg-ttft")).to_have_text(re.compile(r"^\d+\.\d+ s$"))
    expect(page.get_by_test_id("pg-cost")).to_contain_text("USD")
    expect(page.get_by_test_id("pg-error")).to_be_hidden()

    # A new token: confirmed, shown once; the old one is refused at once.
    assert chat(serve, endpoint_id, token).status_code == 200
    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}")
    page.get_by_test_id("request-token").click()
    expect(page.get_by_test_id("token-warning")).to_contain_text("stops working")
    page.get_by_test_id("confirm-token").click()
    new_token = page.get_by_test_id("token").inner_text().strip()
    assert new_token != token
    assert chat(serve, endpoint_id, token).status_code == 401
    assert chat(serve, endpoint_id, new_token).status_code == 200

    # Scale events with their cause; a settings change shows its cost first.
    events = page.get_by_test_id("scale-event")
    expect(events.first).to_contain_text("manual change")
    page.get_by_test_id("settings-max").fill("3")
    # Local CPU replicas cost 0.00/h: the change is shown, and is nothing
    # (the arithmetic with real prices is tested in-process).
    expect(page.get_by_test_id("ceiling-delta")).to_have_text("±0.00 USD")
    page.get_by_test_id("settings-min").fill("2")
    page.get_by_test_id("settings-save").click()
    expect(page.get_by_test_id("scale-event").first).to_contain_text("1 → 2", timeout=30_000)
    expect(page.get_by_test_id("chart-requests")).to_be_visible()
    expect(page.get_by_test_id("log-tail").first).not_to_be_empty()
    with page.expect_download() as download:
        page.get_by_test_id("logs-download").click()
    assert "==> replica" in Path(download.value.path()).read_text()

    # Delete: only with the name typed.
    page.get_by_test_id("delete-confirm").fill("console-cha")
    page.get_by_test_id("delete-submit").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Type the endpoint's name")
    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}")
    page.get_by_test_id("delete-confirm").fill("console-chat")
    page.get_by_test_id("delete-submit").click()
    expect(page).to_have_url(re.compile(r"/console/endpoints$"))
    expect(page.get_by_test_id("row-console-chat")).to_have_count(0)
    assert chat(serve, endpoint_id, new_token).status_code in (401, 404)


@needs("diffusers")
def test_image_playground_on_tiny_sdxl(serve: ServeHandle, context: Any) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    sign_in(page, serve)
    endpoint_id = create_endpoint(page, serve, "console-image", "tiny-sdxl")
    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}/playground")
    expect(page.get_by_test_id("pg-token")).to_have_value(re.compile(r"^infd_ep_"))
    page.get_by_test_id("pg-steps").fill("2")
    page.get_by_test_id("pg-seed").fill("7")
    page.get_by_test_id("pg-generate").click()
    image = page.get_by_test_id("pg-image-result").locator("img")
    expect(image).to_have_count(1, timeout=REPLICA_READY_S)
    assert image.get_attribute("src").startswith("data:image/png;base64,")
    assert (
        page.evaluate("document.querySelector('[data-testid=pg-image-result] img').naturalWidth")
        > 0
    )
    expect(page.get_by_test_id("pg-cost")).to_contain_text("USD")
    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}")
    page.get_by_test_id("delete-confirm").fill("console-image")
    page.get_by_test_id("delete-submit").click()
    expect(page).to_have_url(re.compile(r"/console/endpoints$"))


# No engine: the page and the form are what this checks.
def test_html_in_a_name_renders_as_text_and_a_post_without_csrf_is_refused(
    serve: ServeHandle, context: Any
) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    sign_in(page, serve)
    page.goto(f"{serve.url}/console/endpoints/new")
    evil = '<img src=x id="pwned">'
    page.get_by_test_id("name").fill(evil)
    page.get_by_test_id("create-submit").click()
    expect(page.get_by_test_id("create-error")).to_be_visible()
    assert page.locator("#pwned").count() == 0
    expect(page.get_by_test_id("name")).to_have_value(evil)
    # The browser's own cookies, no CSRF token: refused.
    answer = page.request.post(
        f"{serve.url}/console/endpoints",
        form={"name": "sneaky", "model": "tiny-chat", "option": "cpu:1"},
    )
    assert answer.status == 403
    with httpx.Client(
        base_url=serve.url, headers={"Authorization": f"Bearer {serve.admin_key}"}
    ) as api:
        names = [e["name"] for e in api.get("/inference/endpoints").json()["data"]]
    assert "sneaky" not in names
