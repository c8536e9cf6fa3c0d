"""Holding requests: scale from zero, busy replicas, and the bounds on both.

The decisions are pure functions (`admit`, `plan_release`, `retry_after`),
table-tested with an injected clock. `Dispatcher` applies them on the event
loop: it hands out replica slots, queues what cannot go yet in arrival order,
and releases held requests first-in first-out as slots free up or replicas
become ready. A held request leaves the queue when it is placed, when its
time is up (503) or when its client goes away; nothing stays behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inferd.errors import InferdError, NotFound, ServiceUnavailable, TooManyRequests
from inferd.gateway.directory import ReplicaDirectory, RoutableReplica
from inferd.gateway.routing import Outcome, choose_replica
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.traffic import EndpointTraffic

logger = logging.getLogger(__name__)

# Directory re-asked for capacity at most this often while requests wait.
_CAPACITY_REPEAT_S = 1.0
MAX_RETRY_AFTER_S = 600


class Verdict(enum.Enum):
    FORWARD = "forward"
    HOLD = "hold"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    # For REFUSE: 503 while no replica can take it (scaling from zero), 429
    # when replicas exist and are all busy.
    status: int | None = None


def admit(outcome: Outcome, held: int, max_held: int) -> Admission:
    """What to do with a request, given the routing outcome for it and the
    number of requests already held for its endpoint. A request never
    overtakes held ones: with a queue, it queues too."""
    if outcome is Outcome.CHOSEN and held == 0:
        return Admission(Verdict.FORWARD)
    if held >= max_held:
        return Admission(Verdict.REFUSE, 429 if outcome is not Outcome.NO_REPLICA else 503)
    return Admission(Verdict.HOLD)


@dataclass(frozen=True)
class Placement:
    index: int  # position in the queue given to plan_release
    replica: RoutableReplica


def plan_release(
    excluded: Sequence[frozenset[str]],
    replicas: Sequence[RoutableReplica],
    in_flight: dict[str, int],
    *,
    max_in_flight: int,
    turn: int,
) -> tuple[list[Placement], int]:
    """Held requests (given by what each must avoid, in queue order) that can
    go now, and to which replica; first come first placed. A request that can
    go nowhere (every replica it may use is busy or tried) does not block the
    ones behind it. Returns the placements and the advanced turn counter;
    `in_flight` is not modified."""
    placements: list[Placement] = []
    load = dict(in_flight)
    for index, exclude in enumerate(excluded):
        if all(load.get(r.replica_id, 0) >= max_in_flight for r in replicas):
            break  # every replica is full: nobody else can go
        choice = choose_replica(
            replicas, load, max_in_flight=max_in_flight, turn=turn, exclude=exclude
        )
        if choice.replica is None:
            continue
        turn += 1
        rid = choice.replica.replica_id
        load[rid] = load.get(rid, 0) + 1
        placements.append(Placement(index, choice.replica))
    return placements, turn


def retry_after(
    *,
    scaling: bool,
    ahead: int,
    slots: int,
    mean_service_s: float | None,
    cold_start_s: float,
    scaling_for_s: float,
) -> float:
    """Seconds a refused client should wait, from what was observed.

    Busy: the `ahead` requests in front drain through `slots` parallel slots
    at the mean service time. Scaling from zero: what is left of the expected
    cold start, plus the queue's drain time once a replica is up. At least 1.
    """
    service = mean_service_s if mean_service_s is not None else 1.0
    drain = ahead * service / max(1, slots)
    estimate = max(0.0, cold_start_s - scaling_for_s) + drain if scaling else drain
    return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(estimate))))


class Waiter:
    __slots__ = ("exclude", "future")

    def __init__(self, future: asyncio.Future[RoutableReplica], exclude: frozenset[str]) -> None:
        self.future = future
        self.exclude = exclude


class Dispatcher:
    """Replica slots for one gateway, over all endpoints."""

    def __init__(
        self,
        directory: ReplicaDirectory,
        settings: GatewaySettings,
        clock: Callable[[], float],
    ) -> None:
        self._directory = directory
        self._settings = settings
        self._clock = clock
        self._cap = settings.max_in_flight_per_replica
        self._closed = False

    async def acquire(
        self, ep: EndpointTraffic, exclude: frozenset[str], deadline: float
    ) -> RoutableReplica:
        """A replica slot for one request (release it with `release`), at once
        or after holding; raises 429/503 past the bounds."""
        directory = self._directory
        replicas = directory.ready_replicas(ep.endpoint_id)
        if ep.scale_requested_at is not None and replicas:
            self._cold_start_done(ep)
        choice = choose_replica(
            replicas, ep.in_flight, max_in_flight=self._cap, turn=ep.turn, exclude=exclude
        )
        admission = admit(choice.outcome, len(ep.queue), self._settings.max_held_requests)
        if admission.verdict is Verdict.FORWARD:
            assert choice.replica is not None
            ep.turn += 1
            ep.reserve(choice.replica.replica_id)
            return choice.replica
        if self._closed:
            raise ServiceUnavailable("The gateway is shutting down.", code="shutting_down")
        now = self._clock()
        if choice.outcome is Outcome.NO_REPLICA:
            if ep.scale_requested_at is None and not replicas:
                ep.scale_requested_at = now
            directory.request_capacity(ep.endpoint_id)
        if admission.verdict is Verdict.REFUSE:
            raise self._refusal(ep, admission.status == 503, len(replicas))
        return await self._hold(ep, exclude, deadline - now)

    async def _hold(
        self, ep: EndpointTraffic, exclude: frozenset[str], timeout: float
    ) -> RoutableReplica:
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), exclude)
        ep.queue.append(waiter)
        self.pump(ep)
        if not waiter.future.done():
            self._ensure_watcher(ep)
        timer = loop.call_later(max(0.0, timeout), self._expire, ep, waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away while held. If a slot was handed over in
            # the same instant, give it back.
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(ep, future.result().replica_id)
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                ep.queue.remove(waiter)

    def _expire(self, ep: EndpointTraffic, waiter: Waiter) -> None:
        if waiter.future.done():
            return
        with contextlib.suppress(ValueError):
            ep.queue.remove(waiter)
        replicas = self._directory.ready_replicas(ep.endpoint_id)
        error = self._refusal(ep, not replicas, len(replicas), timed_out=True)
        waiter.future.set_exception(error)

    def release(self, ep: EndpointTraffic, replica_id: str) -> None:
        ep.unreserve(replica_id)
        if ep.queue:
            self.pump(ep)

    def pump(self, ep: EndpointTraffic) -> None:
        """Hand free slots to held requests, oldest first."""
        queue = ep.queue
        if not queue:
            return
        replicas = self._directory.ready_replicas(ep.endpoint_id)
        if not replicas:
            return
        if ep.scale_requested_at is not None:
            self._cold_start_done(ep)
        waiters = list(queue)
        placements, ep.turn = plan_release(
            [w.exclude for w in waiters],
            replicas,
            ep.in_flight,
            max_in_flight=self._cap,
            turn=ep.turn,
        )
        for placement in placements:
            waiter = waiters[placement.index]
            queue.remove(waiter)
            if waiter.future.done():  # cancelled in this very loop turn
                continue
            ep.reserve(placement.replica.replica_id)
            waiter.future.set_result(placement.replica)

    def _cold_start_done(self, ep: EndpointTraffic) -> None:
        assert ep.scale_requested_at is not None
        ep.cold_start_s = self._clock() - ep.scale_requested_at
        ep.scale_requested_at = None

    def _ensure_watcher(self, ep: EndpointTraffic) -> None:
        if ep.watcher is None:
            ep.watcher = asyncio.ensure_future(self._watch(ep))

    async def _watch(self, ep: EndpointTraffic) -> None:
        """While requests are held: wait for a ready replica (scale from zero)
        or re-read the directory now and then (a replica added while the
        others are busy), and pump."""
        directory = self._directory
        poll = self._settings.hold_poll_seconds
        asked = self._clock()
        try:
            while ep.queue:
                gone = _gone(directory, ep.endpoint_id)
                if gone is not None:
                    self._fail_held(ep, gone)
                    break
                if directory.ready_replicas(ep.endpoint_id):
                    self.pump(ep)
                    if not ep.queue:
                        break
                    await asyncio.sleep(poll)
                    continue
                now = self._clock()
                if now - asked >= _CAPACITY_REPEAT_S:
                    asked = now
                    directory.request_capacity(ep.endpoint_id)
                await directory.wait_ready(ep.endpoint_id, poll)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Held requests still time out on their own; log the directory bug.
            logger.exception("hold watcher for endpoint %s failed", ep.endpoint_id)
        finally:
            ep.watcher = None

    def _fail_held(self, ep: EndpointTraffic, error: InferdError) -> None:
        for waiter in list(ep.queue):
            if not waiter.future.done():
                waiter.future.set_exception(error)
        ep.queue.clear()

    def _refusal(
        self, ep: EndpointTraffic, scaling: bool, ready: int, *, timed_out: bool = False
    ) -> InferdError:
        now = self._clock()
        started = ep.scale_requested_at
        seconds = retry_after(
            scaling=scaling,
            ahead=len(ep.queue) + 1,
            slots=max(1, ready) * self._cap,
            mean_service_s=ep.mean_service_time(),
            cold_start_s=(
                ep.cold_start_s
                if ep.cold_start_s is not None
                else self._settings.cold_start_estimate_seconds
            ),
            scaling_for_s=0.0 if started is None else now - started,
        )
        if timed_out:
            return ServiceUnavailable(
                "No replica of this endpoint became available in time; retry later.",
                code="hold_timeout",
                retry_after=seconds,
            )
        if scaling:
            return ServiceUnavailable(
                "This endpoint is starting a replica and its waiting queue is full; retry later.",
                code="scaling_up",
                retry_after=seconds,
            )
        return TooManyRequests(
            "This endpoint is at capacity and its waiting queue is full; retry later.",
            code="overloaded",
            retry_after=seconds,
        )

    async def close(self, endpoints: Sequence[EndpointTraffic]) -> None:
        """Refuse what is still held (503) and stop the watchers."""
        self._closed = True
        watchers = []
        for ep in endpoints:
            self._fail_held(
                ep,
                ServiceUnavailable(
                    "The gateway is shutting down.", code="shutting_down", retry_after=1
                ),
            )
            if ep.watcher is not None:
                ep.watcher.cancel()
                watchers.append(ep.watcher)
        await asyncio.gather(*watchers, return_exceptions=True)


def endpoint_gone(exists: bool, deleting: bool) -> InferdError | None:
    """The answer for requests of an endpoint that was deleted (404) or is
    being deleted (503, no Retry-After: it will not come back); else None."""
    if not exists:
        return NotFound("This endpoint does not exist.", code="endpoint_not_found")
    if deleting:
        return ServiceUnavailable("This endpoint is being deleted.", code="endpoint_deleting")
    return None


def _gone(directory: ReplicaDirectory, endpoint_id: str) -> InferdError | None:
    route = directory.endpoint(endpoint_id)
    return endpoint_gone(route is not None, route is not None and route.deleting)
