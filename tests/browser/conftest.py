"""Real-browser fixtures: Debian's Chromium driven by Playwright.

Never `playwright install` (it downloads from a CDN): Playwright launches
the system Chromium by path. Where it is missing the tests skip on a
developer machine and fail with `CI` set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.console_support import ServedConsole, served_console
from tests.support import chromium_path, require

EXPECT_TIMEOUT_MS = 30_000
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # as root in containers the sandbox cannot start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# Per module, not per session: Playwright's sync API keeps an event loop
# running in the main thread while it is started, and every later test that
# calls asyncio.run() (most integration tests) would fail.
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    require("chromium", "the console's browser tests drive it")
    require("playwright", "the console's browser tests drive Chromium with it")
    path = chromium_path()
    assert path is not None
    from playwright.sync_api import expect, sync_playwright

    # The suite shares a 2-core machine with real engines loading: a page
    # that needs a store commit can take seconds under that load.
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedConsole]:
    """The console of an in-process control plane with fake replicas and two
    seeded projects (tests/console_support.py); one per test module."""
    with served_console(tmp_path_factory.mktemp("console")) as served:
        yield served
