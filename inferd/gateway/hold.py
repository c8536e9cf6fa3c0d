"""Holding requests: scale from zero, busy replicas, and the bounds on both.

The decisions are pure functions (`admit`, `plan_release`, `retry_after`),
table-tested with an injected clock. `Dispatcher` applies them on the event
loop: it hands out replica slots, queues what cannot go yet in arrival order,
and releases held requests as slots free up or replicas become ready, by a
fair share between the endpoint's clients (`inferd.gateway.fairness`; one
client alone is first in, first out). A full queue is shared fairly too: a
newcomer takes the place of the newest request of the client most over its
share (`inferd.gateway.hold_share`). A held request leaves the queue when
it is placed, when its time is up (503), when it gives way to another
client's (429) or when its client goes away; nothing stays behind.
A background request (`Claim.background`) is never held for a replica to
start: while none is ready it is refused at once (503 `no_ready_replica`)
and no capacity is asked for.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

from inferd.errors import InferdError, NotFound, ServiceUnavailable, TooManyRequests
from inferd.gateway.directory import ReplicaDirectory, RoutableReplica
from inferd.gateway.fairness import INTERACTIVE_OWNER, OWNER, Claim, FairShare, Picker
from inferd.gateway.hold_share import Bounds, ClientHold, Room, make_room
from inferd.gateway.routing import NO_AFFINITY, Affinity, Choice, Outcome, Reason, choose_replica
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.traffic import EndpointTraffic

logger = logging.getLogger(__name__)


class CapacitySignal(Protocol):
    """Told when a request waits and no replica is ready (the control plane's
    `ScaleSignals.capacity_wanted`; the gateway never imports the control plane)."""

    def capacity_wanted(self, endpoint_id: str) -> None: ...


class _NoScaling:
    def capacity_wanted(self, endpoint_id: str) -> None:
        return None


# For a gateway in front of fixed replicas: nothing to scale.
NO_SCALING: CapacitySignal = _NoScaling()

# Directory re-asked for capacity at most this often while requests wait.
_CAPACITY_REPEAT_S = 1.0
MAX_RETRY_AFTER_S = 600
_DEFAULT_SETTINGS = GatewaySettings()
# The code of a 429 whose client holds more than its share of a full queue.
OVER_SHARE = "hold_share_exceeded"
# A background request refused while no replica is ready: nothing is started
# for it, so no estimate is better than a poll's.
UNREADY_RETRY_AFTER_S = 5


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


@dataclass(frozen=True)
class HoldRoom:
    """What is held now against the bounds (GatewaySettings): for the
    request's endpoint, and for the whole instance (bytes only)."""

    held: int = 0
    held_bytes: int = 0
    instance_bytes: int = 0


def admit(
    outcome: Outcome,
    held: int,
    max_held: int,
    *,
    room: HoldRoom | None = None,
    cost: int = 0,
    max_bytes: int | None = None,
    max_instance_bytes: int | None = None,
) -> Admission:
    """What to do with a request, given the routing outcome for it, the
    number of requests already held for its endpoint and, where bounded, the
    bytes held (`room`) and what this one would add (`cost`). A request
    never overtakes held ones: with a queue, it queues too."""
    if outcome is Outcome.CHOSEN and held == 0:
        return Admission(Verdict.FORWARD)
    room = room or HoldRoom(held)
    full = held >= max_held or (
        (max_bytes is not None and room.held_bytes + cost > max_bytes)
        or (max_instance_bytes is not None and room.instance_bytes + cost > max_instance_bytes)
    )
    if full:
        return Admission(Verdict.REFUSE, 429 if outcome is not Outcome.NO_REPLICA else 503)
    return Admission(Verdict.HOLD)


@dataclass(frozen=True)
class Placement:
    index: int  # position in the queue given to plan_release
    replica: RoutableReplica
    reason: Reason | None = None


def plan_release(
    excluded: Sequence[frozenset[str]],
    replicas: Sequence[RoutableReplica],
    in_flight: dict[str, int],
    *,
    max_in_flight: int,
    turn: int,
    batch_max_in_flight: int | None = None,
    affinities: Sequence[Affinity] | None = None,
    settings: GatewaySettings | None = None,
    claims: Sequence[Claim] | None = None,
    counters: Mapping[str, float] | None = None,
) -> tuple[list[Placement], int]:
    """Held requests (given by what each must avoid, in queue order, and
    optionally by their prefix affinity) that can go now, and to which
    replica. Without `claims`, first come first placed; with them (whose
    client each is, its weight and priority class) in the fair order of
    `inferd.gateway.fairness.Picker` over the clients' `counters`. A request
    that can go nowhere (every replica it may use is busy or tried) does not
    block the ones behind it. A batch request goes only to a replica under
    `batch_max_in_flight` (default: `max_in_flight`), which keeps the rest
    of its slots for interactive requests. Returns the placements and the
    advanced turn counter; `in_flight` and `counters` are not modified."""
    placements: list[Placement] = []
    load = dict(in_flight)
    settings = settings or _DEFAULT_SETTINGS
    picker = Picker(
        claims if claims is not None else [INTERACTIVE_OWNER] * len(excluded), counters or {}
    )
    batch_cap = max_in_flight if batch_max_in_flight is None else batch_max_in_flight
    batch_claims = claims if claims is not None else []
    while (index := picker.next()) is not None:
        exclude = excluded[index]
        if all(load.get(r.replica_id, 0) >= max_in_flight for r in replicas):
            break  # every replica is full: nobody else can go
        batch = index < len(batch_claims) and batch_claims[index].batch
        choice = choose_replica(
            replicas,
            load,
            max_in_flight=batch_cap if batch else max_in_flight,
            turn=turn,
            exclude=exclude,
            affinity=affinities[index] if affinities is not None else NO_AFFINITY,
            policy=settings.routing_policy,
            load_factor=settings.routing_load_factor,
            min_bound=settings.routing_min_load_bound,
        )
        if choice.replica is None:
            continue
        turn += 1
        rid = choice.replica.replica_id
        load[rid] = load.get(rid, 0) + 1
        picker.placed(index)
        placements.append(Placement(index, choice.replica, choice.reason))
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
    __slots__ = ("affinity", "claim", "cost", "exclude", "future")

    def __init__(
        self,
        future: asyncio.Future[RoutableReplica],
        exclude: frozenset[str],
        affinity: Affinity = NO_AFFINITY,
        cost: int = 0,
        claim: Claim = INTERACTIVE_OWNER,
    ) -> None:
        self.future = future
        self.exclude = exclude
        self.affinity = affinity
        self.cost = cost  # bytes it holds (body plus a fixed cost)
        self.claim = claim  # whose it is, for the fair release


class _Costs(Sequence[int]):
    """The bytes of one client's held requests, oldest first, read off its
    queue without copying it (`make_room` reads a few from the end)."""

    __slots__ = ("_queue",)

    def __init__(self, queue: deque[Waiter]) -> None:
        self._queue = queue

    def __len__(self) -> int:
        return len(self._queue)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [w.cost for w in list(self._queue)[index]]
        return self._queue[index].cost


class _HeldRequests:
    """One endpoint's held requests and what the hold machinery remembers
    about it between requests."""

    __slots__ = (
        "by_client",
        "bytes",
        "client_bytes",
        "cold_start_s",
        "instance",
        "queue",
        "scale_requested_at",
        "share",
        "traffic",
        "turn",
        "watcher",
    )

    def __init__(self, traffic: EndpointTraffic, instance: _HeldBytes) -> None:
        self.traffic = traffic
        # Bytes held for this endpoint, and the instance's total they add to.
        self.bytes = 0
        self.instance = instance
        # Held requests in arrival order; change it only through the methods,
        # which keep the endpoint's accounting of held requests current.
        self.queue: deque[Waiter] = deque()
        self.watcher: asyncio.Task[None] | None = None
        # Round-robin position among equally loaded replicas.
        self.turn = 0
        # Scale from zero: when capacity was first asked for, and how long the
        # last cold start took (for an honest Retry-After).
        self.scale_requested_at: float | None = None
        self.cold_start_s: float | None = None
        # The clients' virtual token counters; each waiting client's held
        # requests in arrival order and their bytes (a client with none is
        # not waiting, and not in these).
        self.share = FairShare()
        self.by_client: dict[str, deque[Waiter]] = {}
        self.client_bytes: dict[str, int] = {}

    def add(self, waiter: Waiter) -> None:
        client = waiter.claim.client
        mine = self.by_client.get(client)
        if mine is None:
            self.share.forget_idle(self.by_client)
            self.share.started_waiting(client, self.by_client)
            mine = self.by_client[client] = deque()
        mine.append(waiter)
        self.client_bytes[client] = self.client_bytes.get(client, 0) + waiter.cost
        self.queue.append(waiter)
        self.traffic.held = len(self.queue)
        self.traffic.background_held += waiter.claim.background
        self.bytes += waiter.cost
        self.traffic.held_bytes = self.bytes
        self.instance.total += waiter.cost

    def discard(self, waiter: Waiter) -> None:
        try:
            self.queue.remove(waiter)
        except ValueError:
            return
        client = waiter.claim.client
        mine = self.by_client.get(client)
        if mine is not None:
            mine.remove(waiter)
            if mine:
                self.client_bytes[client] -= waiter.cost
            else:
                del self.by_client[client]
                self.client_bytes.pop(client, None)
                self.share.stopped_waiting(client)
        self.traffic.held = len(self.queue)
        self.traffic.background_held -= waiter.claim.background
        self.bytes -= waiter.cost
        self.traffic.held_bytes = self.bytes
        self.instance.total -= waiter.cost

    def holds(self) -> dict[str, ClientHold]:
        """Each waiting client's held requests, for `make_room` (weighted
        as its newest request's claim says: a token's weight may change)."""
        return {
            client: ClientHold(queue[-1].claim.weight, _Costs(queue), self.client_bytes[client])
            for client, queue in self.by_client.items()
        }

    def clear(self) -> None:
        self.queue.clear()
        self.by_client.clear()
        self.client_bytes.clear()
        self.traffic.held = 0
        self.traffic.background_held = 0
        self.instance.total -= self.bytes
        self.bytes = 0
        self.traffic.held_bytes = 0


class _HeldBytes:
    """Bytes held over every endpoint of one gateway."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


@dataclass(frozen=True)
class HoldView:
    """What the hold machinery knows about one endpoint (for tests, metrics)."""

    held: int
    watching: bool
    scale_requested_at: float | None
    cold_start_s: float | None


class Dispatcher:
    """Replica slots for one gateway, over all endpoints. The only producer
    of refusals (429/503) and their Retry-After."""

    def __init__(
        self,
        directory: ReplicaDirectory,
        settings: GatewaySettings,
        clock: Callable[[], float],
        signals: CapacitySignal,
    ) -> None:
        self._directory = directory
        self._signals = signals
        self._settings = settings
        self._clock = clock
        self._cap = settings.max_in_flight_per_replica
        self._batch_cap = settings.batch_in_flight_per_replica
        self._closed = False
        self._held: dict[str, _HeldRequests] = {}
        self._held_bytes = _HeldBytes()

    def _state(self, ep: EndpointTraffic) -> _HeldRequests:
        state = self._held.get(ep.endpoint_id)
        if state is None:
            state = self._held[ep.endpoint_id] = _HeldRequests(ep, self._held_bytes)
        return state

    def held_bytes(self, endpoint_id: str | None = None) -> int:
        """Bytes held for one endpoint, or for all (for tests and metrics)."""
        if endpoint_id is None:
            return self._held_bytes.total
        state = self._held.get(endpoint_id)
        return state.bytes if state else 0

    def held(self, endpoint_id: str) -> int:
        state = self._held.get(endpoint_id)
        return len(state.queue) if state else 0

    def view(self, endpoint_id: str) -> HoldView:
        state = self._held.get(endpoint_id) or _HeldRequests(
            EndpointTraffic(endpoint_id, 1), _HeldBytes()
        )
        return HoldView(
            len(state.queue), state.watcher is not None, state.scale_requested_at,
            state.cold_start_s,
        )  # fmt: skip

    def idle(self, endpoint_id: str) -> bool:
        state = self._held.get(endpoint_id)
        return state is None or (not state.queue and state.watcher is None)

    def forget(self, endpoint_id: str) -> None:
        """Drop an idle endpoint's memory (it was deleted)."""
        if self.idle(endpoint_id):
            self._held.pop(endpoint_id, None)

    def choose(
        self,
        replicas: Sequence[RoutableReplica],
        ep: EndpointTraffic,
        turn: int,
        exclude: frozenset[str],
        affinity: Affinity,
        batch: bool = False,
    ) -> Choice:
        """A replica with a free slot (for a batch request: one that keeps
        the slots reserved for interactive requests free)."""
        settings = self._settings
        return choose_replica(
            replicas,
            ep.in_flight,
            max_in_flight=self._batch_cap if batch else self._cap,
            turn=turn,
            exclude=exclude,
            affinity=affinity,
            policy=settings.routing_policy,
            load_factor=settings.routing_load_factor,
            min_bound=settings.routing_min_load_bound,
        )

    async def acquire(
        self,
        ep: EndpointTraffic,
        exclude: frozenset[str],
        deadline: float,
        affinity: Affinity = NO_AFFINITY,
        size: int = 0,
        claim: Claim = INTERACTIVE_OWNER,
        on_hold: Callable[[], None] | None = None,
    ) -> RoutableReplica:
        """A replica slot for one request (release it with `release`), at once
        or after holding; raises 429/503 past the bounds. `size`: the bytes of
        its body, which it holds while held; `claim`: whose request it is
        (from `claim`), charged to that client when it gets its slot;
        `on_hold()`: called once the request is admitted to the hold queue
        while no replica is ready (not when it is refused, nor when it waits
        only for a busy replica's slot)."""
        directory = self._directory
        held = self._state(ep)
        replicas = directory.ready_replicas(ep.endpoint_id)
        if claim.background and not replicas:
            raise self._not_woken(ep)
        if held.scale_requested_at is not None and replicas:
            self._cold_start_done(held)
        choice = self.choose(replicas, ep, held.turn, exclude, affinity, claim.batch)
        settings = self._settings
        cost = size + settings.held_request_overhead_bytes
        admission = admit(
            choice.outcome,
            len(held.queue),
            settings.max_held_requests,
            room=HoldRoom(len(held.queue), held.bytes, self._held_bytes.total),
            cost=cost,
            max_bytes=settings.max_held_bytes_per_endpoint,
            max_instance_bytes=settings.max_held_bytes,
        )
        if admission.verdict is Verdict.FORWARD:
            assert choice.replica is not None
            held.turn += 1
            held.share.charge(claim, claim.cost)
            ep.reserve(choice.replica.replica_id, claim.background)
            ep.routed_by(choice.reason)
            return choice.replica
        if self._closed:
            raise ServiceUnavailable("The gateway is shutting down.", code="shutting_down")
        now = self._clock()
        if choice.outcome is Outcome.NO_REPLICA:
            nowhere = None if replicas else _nowhere(directory, ep.endpoint_id)
            if nowhere is not None:
                raise nowhere
            if held.scale_requested_at is None and not replicas:
                held.scale_requested_at = now
            if not claim.background:
                self._signals.capacity_wanted(ep.endpoint_id)
        if admission.verdict is Verdict.REFUSE:
            room = self._make_room(held, claim, cost)
            if not room.admitted:
                if room.over_share:
                    raise self._over_share(ep, len(replicas), arriving=True)
                raise self._refusal(ep, admission.status == 503, len(replicas))
            self._give_way(ep, held, room, len(replicas))
        at_zero = on_hold if not replicas else None
        return await self._hold(ep, exclude, deadline - now, affinity, cost, claim, at_zero)

    async def _hold(
        self,
        ep: EndpointTraffic,
        exclude: frozenset[str],
        timeout: float,
        affinity: Affinity,
        cost: int,
        claim: Claim,
        on_hold: Callable[[], None] | None = None,
    ) -> RoutableReplica:
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), exclude, affinity, cost, claim)
        held = self._state(ep)
        held.add(waiter)
        self.pump(ep)
        if not waiter.future.done():
            self._ensure_watcher(ep, held)
            if on_hold is not None:
                on_hold()
        timer = loop.call_later(max(0.0, timeout), self._expire, ep, waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away while held. If a slot was handed over in
            # the same instant, give it back.
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(ep, future.result().replica_id, claim.background)
            raise
        finally:
            timer.cancel()
            held.discard(waiter)

    def _make_room(self, held: _HeldRequests, claim: Claim, cost: int) -> Room:
        """Whose held requests give way to this one in a full queue (none
        when it is refused)."""
        settings = self._settings
        per_endpoint = settings.max_held_bytes_per_endpoint
        instance_left = settings.max_held_bytes - self._held_bytes.total
        bounds = Bounds(
            max_count=settings.max_held_requests,
            free_count=settings.max_held_requests - len(held.queue),
            max_bytes=per_endpoint,
            free_bytes=min(per_endpoint - held.bytes, instance_left),
        )
        return make_room(held.holds(), claim.client, claim.weight, cost, bounds)

    def _give_way(self, ep: EndpointTraffic, held: _HeldRequests, room: Room, ready: int) -> None:
        """Refuse the newest held requests `room` names (429, answered at
        once: their clients are over their share of the queue)."""
        assert room.evict is not None
        for client, count in room.evict.items():
            for waiter in list(held.by_client[client])[-count:]:
                held.discard(waiter)
                if not waiter.future.done():
                    waiter.future.set_exception(self._over_share(ep, ready, arriving=False))
                logger.info(
                    "endpoint %s: a held request of client %r gave way to another client's "
                    "(the hold queue is full and that client held more than its share)",
                    ep.endpoint_id, client or "owner",
                )  # fmt: skip

    def _over_share(self, ep: EndpointTraffic, ready: int, *, arriving: bool) -> InferdError:
        held = self._state(ep)
        seconds = retry_after(
            scaling=False,
            ahead=len(held.queue) + 1,
            slots=max(1, ready) * self._cap,
            mean_service_s=ep.mean_service_time(),
            cold_start_s=0.0,
            scaling_for_s=0.0,
        )
        message = (
            "This endpoint's waiting queue is full and this client token holds at least its "
            "share of it; retry later."
            if arriving
            else "This endpoint's waiting queue is full and this client token held more than "
            "its share of it: this request, its newest held one, made room for another "
            "client's; retry later."
        )
        error = TooManyRequests(message, code=OVER_SHARE, retry_after=seconds)
        ep.refused[OVER_SHARE] = ep.refused.get(OVER_SHARE, 0) + 1
        return error

    def _expire(self, ep: EndpointTraffic, waiter: Waiter) -> None:
        if waiter.future.done():
            return
        self._state(ep).discard(waiter)
        replicas = self._directory.ready_replicas(ep.endpoint_id)
        error = self._refusal(ep, not replicas, len(replicas), timed_out=True)
        waiter.future.set_exception(error)

    def claim(
        self,
        ep: EndpointTraffic,
        client: str,
        weight: float,
        batch: bool,
        body_bytes: int,
        background: bool = False,
    ) -> Claim:
        """A request's claim, with the tokens it will be charged when it gets
        its slot (an estimate; `settle` corrects it)."""
        if not self._settings.fair_queuing:
            client, weight = OWNER, 1.0  # every client one: first in, first out
        share = self._state(ep).share
        return Claim(client, weight, batch, share.estimate(client, body_bytes), background)

    def settle(self, ep: EndpointTraffic, claim: Claim, prompt: int, completion: int) -> None:
        """A request's answer reported its usage (before `release`, so that
        the slot it frees goes by the corrected counters)."""
        self._state(ep).share.settle(claim, prompt, completion)

    def release(self, ep: EndpointTraffic, replica_id: str, background: bool = False) -> None:
        ep.unreserve(replica_id, background)
        if self.held(ep.endpoint_id):
            self.pump(ep)

    def pump(self, ep: EndpointTraffic) -> None:
        """Hand free slots to held requests, in the fair order."""
        held = self._state(ep)
        queue = held.queue
        if not queue:
            return
        replicas = self._directory.ready_replicas(ep.endpoint_id)
        if not replicas:
            return
        if held.scale_requested_at is not None:
            self._cold_start_done(held)
        waiters = list(queue)
        placements, held.turn = plan_release(
            [w.exclude for w in waiters],
            replicas,
            ep.in_flight,
            max_in_flight=self._cap,
            batch_max_in_flight=self._batch_cap,
            turn=held.turn,
            affinities=[w.affinity for w in waiters],
            settings=self._settings,
            claims=[w.claim for w in waiters],
            counters=held.share.counters,
        )
        for placement in placements:
            waiter = waiters[placement.index]
            held.discard(waiter)
            if waiter.future.done():  # cancelled in this very loop turn
                continue
            held.share.charge(waiter.claim, waiter.claim.cost)
            ep.reserve(placement.replica.replica_id, waiter.claim.background)
            ep.routed_by(placement.reason)
            waiter.future.set_result(placement.replica)

    def _cold_start_done(self, held: _HeldRequests) -> None:
        assert held.scale_requested_at is not None
        held.cold_start_s = self._clock() - held.scale_requested_at
        held.scale_requested_at = None

    def _ensure_watcher(self, ep: EndpointTraffic, held: _HeldRequests) -> None:
        if held.watcher is None:
            held.watcher = asyncio.ensure_future(self._watch(ep, held))

    async def _watch(self, ep: EndpointTraffic, held: _HeldRequests) -> None:
        """While requests are held: wait for a ready replica (scale from zero)
        or re-read the directory now and then (a replica added while the
        others are busy), and pump."""
        directory = self._directory
        poll = self._settings.hold_poll_seconds
        asked = self._clock()
        try:
            while held.queue:
                gone = _gone(directory, ep.endpoint_id)
                if gone is None and not directory.ready_replicas(ep.endpoint_id):
                    gone = _nowhere(directory, ep.endpoint_id)
                if gone is not None:
                    self._fail_held(held, gone)
                    break
                if directory.ready_replicas(ep.endpoint_id):
                    self.pump(ep)
                    if not held.queue:
                        break
                    await asyncio.sleep(poll)
                    continue
                # No replica is ready (the endpoint scaled down while they
                # waited for a busy one's slot): background requests do not
                # wait for one to start, nor ask for it.
                self._fail_background(ep, held)
                if not held.queue:
                    break
                now = self._clock()
                if now - asked >= _CAPACITY_REPEAT_S:
                    asked = now
                    self._signals.capacity_wanted(ep.endpoint_id)
                await directory.wait_ready(ep.endpoint_id, poll)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Held requests still time out on their own; log the directory bug.
            logger.exception("hold watcher for endpoint %s failed", ep.endpoint_id)
        finally:
            held.watcher = None

    def _fail_background(self, ep: EndpointTraffic, held: _HeldRequests) -> None:
        for waiter in [w for w in held.queue if w.claim.background]:
            held.discard(waiter)
            if not waiter.future.done():
                waiter.future.set_exception(self._not_woken(ep))

    def _not_woken(self, ep: EndpointTraffic) -> InferdError:
        """The answer to a background request while no replica is ready."""
        code = "no_ready_replica"
        ep.refused[code] = ep.refused.get(code, 0) + 1
        return ServiceUnavailable(
            "No replica of this endpoint is ready, and this request runs only on a replica "
            "that is up for other reasons (it does not wake the endpoint); retry later.",
            code=code,
            retry_after=UNREADY_RETRY_AFTER_S,
        )

    def _fail_held(self, held: _HeldRequests, error: InferdError) -> None:
        for waiter in list(held.queue):
            if not waiter.future.done():
                waiter.future.set_exception(error)
        held.clear()

    def no_replica_could_take_it(self, ep: EndpointTraffic, attempts: int) -> InferdError:
        """The answer after every attempt failed before a byte was sent."""
        ready = len(self._directory.ready_replicas(ep.endpoint_id))
        seconds = retry_after(
            scaling=False,
            ahead=self.held(ep.endpoint_id) + 1,
            slots=max(1, ready) * self._cap,
            mean_service_s=ep.mean_service_time(),
            cold_start_s=0.0,
            scaling_for_s=0.0,
        )
        return ServiceUnavailable(
            f"No replica of this endpoint could take the request after "
            f"{attempts} attempts; retry later.",
            code="no_replica_available",
            retry_after=seconds,
        )

    def _refusal(
        self, ep: EndpointTraffic, scaling: bool, ready: int, *, timed_out: bool = False
    ) -> InferdError:
        now = self._clock()
        held = self._state(ep)
        started = held.scale_requested_at
        seconds = retry_after(
            scaling=scaling,
            ahead=len(held.queue) + 1,
            slots=max(1, ready) * self._cap,
            mean_service_s=ep.mean_service_time(),
            cold_start_s=(
                held.cold_start_s
                if held.cold_start_s is not None
                else self._settings.cold_start_estimate_seconds
            ),
            scaling_for_s=0.0 if started is None else now - started,
        )
        error = self._refusal_error(scaling, seconds, timed_out=timed_out)
        code = error.code or "refused"
        ep.refused[code] = ep.refused.get(code, 0) + 1
        return error

    @staticmethod
    def _refusal_error(scaling: bool, seconds: float, *, timed_out: bool) -> InferdError:
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

    async def close(self) -> None:
        """Refuse what is still held (503) and stop the watchers."""
        self._closed = True
        watchers = []
        for held in self._held.values():
            self._fail_held(
                held,
                ServiceUnavailable(
                    "The gateway is shutting down.", code="shutting_down", retry_after=1
                ),
            )
            if held.watcher is not None:
                held.watcher.cancel()
                watchers.append(held.watcher)
        await asyncio.gather(*watchers, return_exceptions=True)


def endpoint_gone(exists: bool, deleting: bool) -> InferdError | None:
    """The answer for requests of an endpoint that was deleted (404) or is
    being deleted (503, no Retry-After: it will not come back); else None."""
    if not exists:
        return NotFound("This endpoint does not exist.", code="endpoint_not_found")
    if deleting:
        return ServiceUnavailable("This endpoint is being deleted.", code="endpoint_deleting")
    return None


# A refused client may try again when the cluster may have grown: nodes
# join in minutes, not seconds.
UNPLACEABLE_RETRY_AFTER_S = 60


def _nowhere(directory: ReplicaDirectory, endpoint_id: str) -> InferdError | None:
    """503 at once for an endpoint whose replica fits on no node at all."""
    route = directory.endpoint(endpoint_id)
    if route is None or route.unplaceable is None:
        return None
    return ServiceUnavailable(
        f"No replica of this endpoint can be placed: {route.unplaceable}.",
        code="no_capacity",
        retry_after=UNPLACEABLE_RETRY_AFTER_S,
    )


def _gone(directory: ReplicaDirectory, endpoint_id: str) -> InferdError | None:
    route = directory.endpoint(endpoint_id)
    return endpoint_gone(route is not None, route is not None and route.deleting)
