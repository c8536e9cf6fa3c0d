"""LoRA adapters in the console, in a real Chromium against a real `inferd
serve` (fake engines in real replica processes): the endpoint page lists the
adapters and the replica holding each, and the playground tries one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.testing import ServeHandle
from tests.browser.test_console_flows import sign_in
from tests.support import needs

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), needs("peft")]

SETTINGS = {
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "replica_drain_timeout_seconds": "5",
    "replica_args": "--engine fake",
}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    handle = ServeHandle(tmp_path_factory.mktemp("console-lora"), settings=SETTINGS).start()
    try:
        yield handle
    finally:
        handle.cleanup()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield ctx
    finally:
        ctx.close()


def test_the_console_lists_adapters_and_the_playground_tries_one(
    serve: ServeHandle, context: Any, tiny_lora_dir: Path
) -> None:
    from playwright.sync_api import expect

    created = serve.create_endpoint(
        name="tuned", modelName="tiny-chat", minReplicas=1, maxReplicas=1,
        engineSettings={"maxLoras": 2},
    )  # fmt: skip
    endpoint_id, token = created["id"], created["accessToken"]
    with serve.api() as api:
        answer = api.post(f"/inference/endpoints/{endpoint_id}/adapters",
                          json={"name": "sql", "source": str(tiny_lora_dir)})  # fmt: skip
        assert answer.status_code == 201, answer.text
    serve.wait_record(endpoint_id, lambda r: r["status"] == "running")
    # What the API answers for the adapter (the fake engine: greedy, by name).
    expected = httpx.post(
        f"{created['url']}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={"model": "sql", "max_tokens": 5, "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello!"}]},
        timeout=60,
    ).json()["choices"][0]["message"]["content"]  # fmt: skip

    page = context.new_page()
    sign_in(page, serve)
    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}")
    expect(page.get_by_test_id("adapter-name")).to_have_text(["sql"])
    # The replica that served it holds it (the page polls the live part).
    expect(page.get_by_test_id("adapter-held-by")).to_have_text(re.compile(r"^r-"))

    page.goto(f"{serve.url}/console/endpoints/{endpoint_id}/playground")
    page.get_by_test_id("pg-token").fill(token)
    page.get_by_test_id("pg-model").select_option("sql")
    page.get_by_test_id("pg-max-tokens").fill("5")
    page.get_by_test_id("pg-send").click()
    expect(page.get_by_test_id("pg-output")).to_have_text(expected)
