"""Reports a replica's status and load to the control plane's registry.

Push, not poll: a report on every status change and a heartbeat every
`interval` seconds. The registry marks a replica that goes quiet as failed;
the replica in turn treats a registry it cannot reach for `orphan_timeout`
seconds, or one that no longer knows it (404/410), as the end of its
employment and drains itself, so no replica outlives its control plane for
long.

With several control-plane instances, the instance that launched a replica
may go away while the replica lives on (the next leader adopts it): a
report that cannot reach one URL goes to the next of `fallback_urls` (the
other instances, or their load balancer), and later reports stay there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from inferd.api.replica import ReplicaReport

logger = logging.getLogger(__name__)


class StatusReporter:
    def __init__(
        self,
        registry_url: str,
        replica_id: str,
        secret: str | None,
        snapshot: Callable[[], ReplicaReport],
        on_orphaned: Callable[[], None],
        interval: float = 2.0,
        orphan_timeout: float | None = None,
        fallback_urls: Sequence[str] = (),
    ) -> None:
        self._urls = [
            f"{url.rstrip('/')}/replicas/{replica_id}" for url in (registry_url, *fallback_urls)
        ]
        self._current = 0
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=5.0)
        self._snapshot = snapshot
        self._on_orphaned = on_orphaned
        self._interval = interval
        self._orphan_timeout = orphan_timeout
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_success = time.monotonic()
        self._seq = 0
        self._orphaned = False
        self._closing = False
        # Snapshots taken when the status changed, not yet sent: each change
        # is reported as it was, so a quick succession (starting -> loading
        # before the first report goes out) is not collapsed into its end.
        self._pending: list[ReplicaReport] = []

    def start(self) -> None:
        self._pending.append(self._snapshot())  # the first status: starting
        self._task = asyncio.ensure_future(self._run())

    def notify(self) -> None:
        """Report now (a status change) instead of at the next heartbeat."""
        self._pending.append(self._snapshot())
        self._wake.set()

    async def report_now(self, snapshot: ReplicaReport | None = None) -> bool:
        self._seq += 1
        report = (snapshot or self._snapshot()).model_copy(update={"seq": self._seq})
        response = await self._post(report.to_wire())
        if response is None:
            return False
        if response.status_code in (404, 410):
            self._orphan("the registry no longer knows this replica")
            return False
        if response.status_code >= 400:
            logger.warning("registry refused the status report: %s", response.status_code)
            return False
        self._last_success = time.monotonic()
        return True

    async def _post(self, payload: dict[str, Any]) -> httpx.Response | None:
        """POST to the current URL; past a connection failure, to the next
        ones in turn (each once)."""
        for _ in range(len(self._urls)):
            url = self._urls[self._current]
            try:
                return await self._client.post(url, json=payload)
            except httpx.TransportError as exc:
                logger.debug("status report to %s failed: %s", url, exc)
                self._current = (self._current + 1) % len(self._urls)
            except httpx.HTTPError as exc:
                logger.debug("status report failed: %s", exc)
                return None
        return None

    def _orphan(self, why: str) -> None:
        if not self._orphaned:
            self._orphaned = True
            logger.warning("replica orphaned (%s); draining", why)
            self._on_orphaned()

    async def _run(self) -> None:
        # A flag, not task cancellation, ends the loop: on Python < 3.12
        # `wait_for` can swallow a cancel that races with the event it waits on.
        while not self._closing:
            self._wake.clear()
            pending: list[ReplicaReport | None] = [*self._pending] or [None]
            self._pending = []
            for snapshot in pending:  # None: a heartbeat, the state as it is now
                await self.report_now(snapshot)
            if (
                self._orphan_timeout is not None
                and time.monotonic() - self._last_success > self._orphan_timeout
            ):
                self._orphan(f"registry unreachable for {self._orphan_timeout:.0f}s")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)

    async def close(self) -> None:
        """Send a last report (the final status), then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        for snapshot in self._pending:
            await self.report_now(snapshot)
        await self.report_now()
        await self._client.aclose()
