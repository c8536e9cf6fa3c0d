"""Reports a replica's status and load to the control plane's registry.

Push, not poll: a report on every status change and a heartbeat every
`interval` seconds. The registry routes around a replica that goes quiet
and probes it; the replica in turn treats a registry it cannot reach for
`orphan_timeout` seconds, or one that no longer knows it (404/410), as the
end of its employment and drains itself, so no replica outlives its
control plane for long.

Reports are sent from a thread with an event loop of its own, so that
serving cannot starve them: an engine that saturates the serving loop (a
few hundred streams to tokenize and relay) used to delay the reports until
the registry took the busy replica for dead. The snapshot of status and load
is still taken on the serving loop (the engine's figures are not thread
safe); when that loop does not answer in time, the heartbeat goes out with
the last snapshot and says how long the loop has been stalled, which the
registry weighs (the process lives; whether it serves is another matter).
Each report has a timeout and is retried, with jitter, within its period.

With several control-plane instances, the instance that launched a replica
may go away while the replica lives on (the next leader adopts it): a
report that cannot reach one URL goes to the next of `fallback_urls` (the
other instances, or their load balancer), and later reports stay there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from inferd.aio import wait_event
from inferd.api.replica import ReplicaReport

logger = logging.getLogger(__name__)

# Tries per report (the first and retries), each within its timeout.
REPORT_TRIES = 3


@dataclass(frozen=True)
class ReportFaults:
    """Faults injected into the reporter, for tests of the registry's
    judgement (`--report-fault-*`, never set in production): each heartbeat
    is held `delay_s` before it is sent, and `drop` of them (0..1, at
    random) are not sent at all. Status changes are sent as they are."""

    delay_s: float = 0.0
    drop: float = 0.0

    @property
    def any(self) -> bool:
        return self.delay_s > 0 or self.drop > 0


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
        faults: ReportFaults = ReportFaults(),
    ) -> None:
        self._urls = [
            f"{url.rstrip('/')}/replicas/{replica_id}" for url in (registry_url, *fallback_urls)
        ]
        self._current = 0
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        # A report is small: one that takes longer than this is lost, and
        # the next try (or heartbeat) carries the same news.
        self._timeout = min(5.0, max(1.0, interval))
        self._client = httpx.AsyncClient(headers=headers, timeout=self._timeout)
        self._snapshot = snapshot
        self._on_orphaned = on_orphaned
        self._interval = interval
        self._orphan_timeout = orphan_timeout
        self._faults = faults
        self._last_success = time.monotonic()
        self._seq = 0
        self._orphaned = False
        self._closing = False
        # Snapshots taken when the status changed, not yet sent: each change
        # is reported as it was, so a quick succession (starting -> loading
        # before the first report goes out) is not collapsed into its end.
        # Appended on the serving loop, taken on the reporter's thread.
        self._pending: list[ReplicaReport] = []
        self._lock = threading.Lock()
        self._last: ReplicaReport | None = None
        # The snapshot asked of the serving loop and not yet given, and since when.
        self._asked: concurrent.futures.Future[ReplicaReport] | None = None
        self._asked_at = 0.0
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    # -- on the serving loop ----------------------------------------------------------

    def start(self) -> None:
        self._serving_loop = asyncio.get_running_loop()
        self._add_pending(self._snapshot())  # the first status: starting
        self._thread = threading.Thread(target=self._thread_main, name="report", daemon=True)
        self._thread.start()
        self._started.wait()

    def notify(self) -> None:
        """Report now (a status change) instead of at the next heartbeat."""
        self._add_pending(self._snapshot())
        self._ring()

    async def close(self) -> None:
        """Send a last report (the final status), then stop."""
        self._add_pending(self._snapshot())
        self._closing = True
        self._ring()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        else:
            for snapshot in self._take_pending():
                await self.report_now(snapshot)
            await self._client.aclose()

    def _add_pending(self, snapshot: ReplicaReport) -> None:
        with self._lock:
            self._pending.append(snapshot)
            self._last = snapshot

    def _ring(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended
                loop.call_soon_threadsafe(wake.set)

    def _give_snapshot(self, asked: concurrent.futures.Future[ReplicaReport]) -> None:
        try:
            snapshot = self._snapshot()
        except Exception as exc:  # handed to the reporter's thread
            if not asked.done():
                asked.set_exception(exc)
            return
        with self._lock:
            self._last = snapshot
        if not asked.done():
            asked.set_result(snapshot)

    # -- on the reporter's thread ----------------------------------------------------

    def _thread_main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._started.set()
        try:
            # A flag, not task cancellation, ends the loop: on Python < 3.12
            # `wait_for` can swallow a cancel that races with the event it waits on.
            while not self._closing:
                self._wake.clear()
                changes = self._take_pending()
                for snapshot in changes:
                    await self.report_now(snapshot)
                if not changes:
                    await self._heartbeat()
                if (
                    self._orphan_timeout is not None
                    and time.monotonic() - self._last_success > self._orphan_timeout
                ):
                    self._orphan(f"registry unreachable for {self._orphan_timeout:.0f}s")
                await wait_event(self._wake, self._interval)
            for snapshot in self._take_pending():
                await self.report_now(snapshot)
        finally:
            await self._client.aclose()

    def _take_pending(self) -> list[ReplicaReport]:
        with self._lock:
            pending, self._pending = self._pending, []
        return pending

    async def _heartbeat(self) -> None:
        faults = self._faults
        if faults.any:
            if random.random() < faults.drop:
                return
            await asyncio.sleep(faults.delay_s)
        snapshot, stalled = await self._fresh_snapshot()
        if snapshot is None:
            return
        if stalled is not None:
            snapshot = snapshot.model_copy(update={"loop_stalled_s": round(stalled, 3)})
        await self.report_now(snapshot)

    async def _fresh_snapshot(self) -> tuple[ReplicaReport | None, float | None]:
        """The serving loop's snapshot, or (when it does not answer within a
        second or so) the last one and how long the loop has been stalled."""
        serving = self._serving_loop
        if serving is None:
            return self._snapshot(), None
        now = time.monotonic()
        if self._asked is None:
            self._asked = concurrent.futures.Future()
            self._asked_at = now
            try:
                serving.call_soon_threadsafe(self._give_snapshot, self._asked)
            except RuntimeError:  # the serving loop has ended
                self._asked = None
                return None, None
        asked = self._asked
        with contextlib.suppress(asyncio.TimeoutError, concurrent.futures.CancelledError):
            await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(asked)), min(1.0, self._interval / 2)
            )
        if asked.done():
            self._asked = None
            if asked.exception() is not None:
                logger.warning("taking a status snapshot failed: %r", asked.exception())
                return None, None
            return asked.result(), None
        with self._lock:
            last = self._last
        return last, time.monotonic() - self._asked_at

    async def report_now(self, snapshot: ReplicaReport | None = None) -> bool:
        self._seq += 1
        report = (snapshot or self._snapshot()).model_copy(update={"seq": self._seq})
        payload = report.to_wire()
        response = None
        for attempt in range(REPORT_TRIES):
            response = await self._post(payload)
            if response is not None and response.status_code < 500:
                break
            if attempt + 1 < REPORT_TRIES and not self._closing:
                # Jittered: replicas that lost the registry together do not
                # come back at it together.
                await asyncio.sleep(random.uniform(0.5, 1.5) * self._interval / REPORT_TRIES)
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
                if isinstance(exc, httpx.TimeoutException):
                    return None  # slow, not gone: retried here
                self._current = (self._current + 1) % len(self._urls)
            except httpx.HTTPError as exc:
                logger.debug("status report failed: %s", exc)
                return None
        return None

    def _orphan(self, why: str) -> None:
        if self._orphaned:
            return
        self._orphaned = True
        logger.warning("replica orphaned (%s); draining", why)
        serving = self._serving_loop
        if serving is None:  # reporting by hand (`report_now`), not started
            self._on_orphaned()
            return
        with contextlib.suppress(RuntimeError):  # the serving loop has ended
            serving.call_soon_threadsafe(self._on_orphaned)
