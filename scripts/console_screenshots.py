"""Regenerate the console's screenshots in docs/console/ (shown in the README).

Starts a real `inferd serve` in a temporary directory, signs in with its
admin key in Debian's Chromium (Playwright, never `playwright install`),
creates a tiny-chat endpoint from the recommendation table, chats with it in
the playground, and photographs each page.

    .venv/bin/python scripts/console_screenshots.py [--out docs/console]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from inferd.testing import ServeHandle  # noqa: E402
from tests.browser.conftest import CHROMIUM_ARGS, EXPECT_TIMEOUT_MS, chromium_path  # noqa: E402

SETTINGS = {
    # The pictures show us-east's prices: this machine is said to be there,
    # so that its CPU replicas are placed (a location it is not in stays pending).
    "default_location": "us-east",
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "replica_args": "--cpu-kv-cache-gib 1",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "console")
    args = parser.parse_args()
    chromium = chromium_path()
    if chromium is None:
        print("Chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 1
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="inferd-shots-") as tmp:
        serve = ServeHandle(Path(tmp), settings=SETTINGS).start()
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 860})

                def shot(name: str) -> None:
                    page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
                    print(f"wrote {args.out / name}.png")

                page.goto(f"{serve.url}/console/signin")
                shot("signin")
                page.get_by_label("Key").fill(serve.admin_key or "")
                page.get_by_role("button", name="Sign in").click()
                expect(page.get_by_test_id("empty-state")).to_be_visible()
                shot("endpoints-empty")

                page.goto(f"{serve.url}/console/endpoints/new")
                page.get_by_test_id("name").fill("support-chat")
                page.get_by_test_id("model").select_option("tiny-chat")
                page.get_by_test_id("location").select_option("us-east")
                expect(page.get_by_test_id("option-cpu-1")).to_be_visible()
                page.get_by_test_id("min").fill("1")
                page.get_by_test_id("max").fill("3")
                expect(page.get_by_test_id("ceiling")).to_contain_text("1.35")
                shot("create")
                # Enter in the name field submits the form, as a person would.
                page.get_by_test_id("name").press("Enter")
                expect(page.get_by_test_id("token")).to_be_visible()
                endpoint_url = page.url
                shot("endpoint-token-once")

                page.goto(f"{serve.url}/console/endpoints")
                row = page.get_by_test_id("row-support-chat")
                expect(row.get_by_test_id("status")).to_have_text("running", timeout=600_000)
                shot("endpoints")

                page.goto(endpoint_url + "/playground")
                page.get_by_test_id("pg-max-tokens").fill("32")
                for _ in range(3):
                    page.get_by_test_id("pg-send").click()
                    expect(page.get_by_test_id("pg-send")).to_be_enabled(timeout=120_000)
                expect(page.get_by_test_id("pg-rate")).to_contain_text("tokens")
                shot("playground-chat")

                page.goto(endpoint_url)
                page.get_by_test_id("settings-max").fill("4")
                expect(page.get_by_test_id("cost-change")).to_be_visible()
                # Let a sample of the series land, so the charts have a point.
                page.wait_for_timeout(2500)
                page.get_by_role("button", name="Hour").click()
                expect(page.get_by_test_id("chart-requests")).to_be_visible()
                shot("endpoint")

                page.goto(f"{serve.url}/console/usage")
                expect(page.get_by_test_id("project-cost")).to_be_visible()
                shot("usage")
                assert re.search(r"/console/usage$", page.url)
                browser.close()
        finally:
            serve.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
