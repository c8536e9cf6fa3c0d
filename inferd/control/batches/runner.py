"""The leader's batch duty: run every unfinished batch, request by request.

Started with the leader's term on each election (`LeaderDuties`), stopped
when the lead ends. It reads the unfinished batches from the store (every
`poll_seconds`, or at once when this instance created or cancelled one), so
a batch created on any instance, and one a dead leader left, is picked up
where it stands: its requests still pending are run, those finished are
not. A result is recorded, fenced by the term, in the statement that marks
its request finished; a request in flight when the leader died has no
result and is run again by the next (at-least-once execution,
exactly-once results).

Each request goes through the gateway in-process (`Executor`), at the
lowest priority, `concurrency` of a batch at a time. A batch whose
`capacity` is `running` sends none while its endpoint has no ready replica
(it wakes none): its requests wait, pending, until one is up for other
reasons or the window passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from inferd.aio import wait_event
from inferd.control.batches.model import (
    Batch,
    BatchSettings,
    BatchStatus,
    Capacity,
    PendingRequest,
    RequestState,
    Result,
    batch_cost,
)
from inferd.control.batches.ports import BatchStore
from inferd.control.batches.service import result_line
from inferd.control.model import Deposed

logger = logging.getLogger(__name__)

# Answers worth trying again later: the endpoint was busy or had no replica.
RETRIED = frozenset({0, 429, 502, 503, 504})
# The endpoint is up and busy (its slots taken by interactive work, or the
# client's rate limit): the batch waits for capacity, however long, within
# its window; it is never failed for it.
BUSY = 429
# A request held past the gateway's hold timeout: busy too when a replica is
# up (its slots stayed taken by interactive work all that time), a failure
# when none is (the endpoint could not start one).
HELD_TOO_LONG = (503, "hold_timeout")
# The longest wait between two tries of a busy request.
MAX_BUSY_WAIT_S = 30.0


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (the call raised)
    body: bytes
    request_id: str = ""


class Executor(Protocol):
    async def run(self, batch: Batch, idx: int, body: bytes) -> Answer:
        """Send one request of `batch` to its endpoint; the answer."""
        ...

    async def wait_ready(self, batch: Batch, timeout: float) -> bool:
        """Whether `batch`'s endpoint has a ready replica: True at once if
        it has one, else as soon as one is ready, False after `timeout`
        seconds. Asks for none."""
        ...


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        executor: Executor,
        settings: BatchSettings,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._store = store
        self._executor = executor
        self.settings = settings
        self._clock = clock
        self._sleep = sleep
        self._term: int | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        # Batches cancelled while they run: their requests in flight are abandoned.
        self._cancelled: dict[str, asyncio.Event] = {}
        self._wakeup = asyncio.Event()

    # --- LeaderDuties ----------------------------------------------------------------------

    async def start(self, term: int) -> None:
        self._term = term
        self._loop_task = asyncio.ensure_future(self._follow())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loop_task = None
        self._running.clear()
        self._cancelled.clear()
        self._term = None

    def wake(self) -> None:
        """A batch was created or cancelled here: look now."""
        self._wakeup.set()

    # --- the loop ----------------------------------------------------------------------------

    async def _follow(self) -> None:
        while True:
            self._wakeup.clear()
            try:
                await self.look_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("reading the unfinished batches failed; trying again")
            await wait_event(self._wakeup, self.settings.poll_seconds)

    async def look_once(self) -> None:
        """Start a task for each unfinished batch that has none; tell the
        running ones that were cancelled."""
        for batch in await self._store.running_batches():
            task = self._running.get(batch.id)
            if task is None or task.done():
                self._running[batch.id] = asyncio.ensure_future(self._guarded(batch))
            elif batch.status is BatchStatus.CANCELLING:
                self._cancel_event(batch.id).set()

    async def _guarded(self, batch: Batch) -> None:
        try:
            await self.run_batch(batch)
        except Deposed:
            logger.info("batch %s: this instance no longer leads; the next leader resumes it",
                        batch.id)  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("batch %s: running it failed; it is tried again", batch.id)
            await self._sleep(self.settings.poll_seconds)
        finally:
            self._running.pop(batch.id, None)
            self._cancelled.pop(batch.id, None)

    def _cancel_event(self, batch_id: str) -> asyncio.Event:
        return self._cancelled.setdefault(batch_id, asyncio.Event())

    async def run_batch(self, batch: Batch) -> None:
        """Take `batch` from the status it is in to a final one (or until
        the lead is lost)."""
        term = self._term
        store = self._store
        if batch.status is BatchStatus.VALIDATING:
            moved = await store.move_batch(
                batch.id, (BatchStatus.VALIDATING,), BatchStatus.IN_PROGRESS, self._clock(), term
            )
            if moved is None:  # cancelled meanwhile: the next look sees it
                return
            batch = moved
        if batch.status is BatchStatus.IN_PROGRESS:
            await self._run_requests(batch)
            batch = await store.get_batch(batch.id) or batch
        if batch.status is BatchStatus.IN_PROGRESS:
            if self._clock() >= batch.expires_at:
                await self._expire(batch)
                return
            if batch.counts.finished < batch.counts.total:
                return  # left pending: cancelled mid-way, or the next look runs them
            moved = await store.move_batch(
                batch.id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING, self._clock(), term
            )
            batch = moved or await store.get_batch(batch.id) or batch
        if batch.status is BatchStatus.FINALIZING:
            await store.move_batch(
                batch.id, (BatchStatus.FINALIZING,), BatchStatus.COMPLETED, self._clock(), term
            )
        elif batch.status is BatchStatus.CANCELLING:
            await store.move_batch(
                batch.id, (BatchStatus.CANCELLING,), BatchStatus.CANCELLED, self._clock(), term
            )

    async def _run_requests(self, batch: Batch) -> None:
        """Every pending request, `concurrency` at a time, until none is
        left, the batch is cancelled (its requests in flight are abandoned:
        a cancelled batch keeps the results it has) or its window passed."""
        cancelled = self._cancel_event(batch.id)
        feeding = asyncio.ensure_future(self._feed(batch, cancelled))
        stop = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait({feeding, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (feeding, stop):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _feed(self, batch: Batch, cancelled: asyncio.Event) -> None:
        limit = asyncio.Semaphore(self.settings.concurrency)
        in_flight: set[asyncio.Task[None]] = set()
        after = -1
        try:
            while not cancelled.is_set() and self._clock() < batch.expires_at:
                page = await self._store.pending_requests(
                    batch.id, after, self.settings.concurrency * 4
                )
                if not page:
                    break
                for request in page:
                    await limit.acquire()
                    if self._clock() >= batch.expires_at:
                        limit.release()
                        break
                    task = asyncio.ensure_future(self._one(batch, request))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    task.add_done_callback(lambda _: limit.release())
                    after = request.idx
            if in_flight:
                await asyncio.gather(*in_flight)
        finally:
            for task in in_flight:
                task.cancel()

    async def _one(self, batch: Batch, request: PendingRequest) -> None:
        """Run one request until it has an answer to record: a busy answer
        (429) is tried again for as long as the batch's window lasts (past
        it the request is left pending, for the error file as expired);
        others worth trying again, `max_attempts` times in all."""
        settings = self.settings
        failures = tries = 0
        idle_only = batch.capacity is Capacity.RUNNING
        while True:
            if idle_only and not await self._until_ready(batch):
                return  # the window passed with no replica up: expired with the rest
            try:
                answer = await self._executor.run(batch, request.idx, request.body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # recorded as the request's failure if it lasts
                logger.warning("batch %s request %d: %r", batch.id, request.idx, exc)
                answer = Answer(0, str(exc).encode())
            tries += 1
            if answer.status not in RETRIED:
                break
            if idle_only and not await self._executor.wait_ready(batch, 0.0):
                # The endpoint scaled down under it (or its replica failed):
                # not the request's failure; it runs when one is up again.
                continue
            busy = await self._busy(batch, answer)
            if not busy:
                failures += 1
                if failures >= settings.max_attempts:
                    break
            wait = min(settings.retry_seconds * 2 ** min(tries - 1, 16), MAX_BUSY_WAIT_S)
            if busy and self._clock() >= batch.expires_at:
                return
            await self._sleep(wait)
        await self._store.record_result(batch.id, self._result(batch, request, answer), self._term)

    async def _busy(self, batch: Batch, answer: Answer) -> bool:
        """Whether `answer` says the endpoint is up but its capacity taken."""
        if answer.status == BUSY:
            return True
        if (answer.status, error_code(answer.body)) == HELD_TOO_LONG:
            return await self._executor.wait_ready(batch, 0.0)
        return False

    async def _until_ready(self, batch: Batch) -> bool:
        """Until `batch`'s endpoint has a ready replica (True), or its window
        passed (False)."""
        while not await self._executor.wait_ready(batch, self.settings.poll_seconds):
            if self._clock() >= batch.expires_at:
                return False
        return True

    def _result(self, batch: Batch, request: PendingRequest, answer: Answer) -> Result:
        ok = 200 <= answer.status < 300
        error = None
        if answer.status == 0:
            error = {"code": "no_answer", "message": answer.body.decode("utf-8", "replace")}
        line = result_line(
            batch.id,
            request.idx,
            request.custom_id,
            answer.status or None,
            answer.body,
            answer.request_id,
            error,
        )
        prompt, completion = usage_of(answer.body) if ok else (0, 0)
        cost = batch_cost(
            prompt + completion, self.settings.price_per_million_tokens, self.settings.discount
        )
        state = RequestState.DONE if ok else RequestState.FAILED
        return Result(request.idx, state, line, prompt, completion, cost, self._clock())

    async def _expire(self, batch: Batch) -> None:
        """The window passed: what is still pending goes to the error file."""

        def line_of(idx: int, custom_id: str) -> str:
            error = {"code": "batch_expired", "message": "the batch's completion window passed"}
            return result_line(batch.id, idx, custom_id, None, b"", "", error)

        await self._store.fail_pending(batch.id, line_of, self._term)
        await self._store.move_batch(
            batch.id, (BatchStatus.IN_PROGRESS,), BatchStatus.EXPIRED, self._clock(), self._term
        )


def error_code(body: bytes) -> str | None:
    """The `error.code` of an error answer (None for anything else)."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def usage_of(body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens of an answer's `usage` (0, 0 without one)."""
    try:
        usage: Any = json.loads(body).get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0, 0
    return prompt, completion
