"""A replica keeps reporting when the instance that launched it is gone:
the report goes to the next registry URL, and stays there."""

from __future__ import annotations

import asyncio

from inferd.replica.reporter import StatusReporter
from inferd.testing import free_port, replica_report
from tests.support import FakeRegistry


def test_reports_move_to_a_fallback_registry_when_the_first_is_unreachable() -> None:
    fallback = FakeRegistry()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    orphaned: list[bool] = []

    async def scenario() -> None:
        reporter = StatusReporter(
            dead,
            "r1",
            "s3cret",
            lambda: replica_report("r1", {"status": "ready", "url": "http://127.0.0.1:1"}),
            on_orphaned=lambda: orphaned.append(True),
            interval=0.05,
            orphan_timeout=5.0,
            fallback_urls=[fallback.url],
        )
        assert await reporter.report_now()
        assert await reporter.report_now()
        await reporter._client.aclose()

    try:
        asyncio.run(scenario())
        assert [r["status"] for r in fallback.reports] == ["ready", "ready"]
        assert fallback.auth == ["Bearer s3cret", "Bearer s3cret"]
        assert not orphaned
    finally:
        fallback.stop()


def test_with_no_registry_reachable_a_report_fails() -> None:
    async def scenario() -> bool:
        reporter = StatusReporter(
            f"http://127.0.0.1:{free_port()}",
            "r1",
            None,
            lambda: replica_report("r1", {"status": "ready"}),
            on_orphaned=lambda: None,
            fallback_urls=[f"http://127.0.0.1:{free_port()}"],
        )
        try:
            return await reporter.report_now()
        finally:
            await reporter._client.aclose()

    assert asyncio.run(scenario()) is False
