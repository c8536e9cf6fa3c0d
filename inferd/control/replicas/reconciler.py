"""The reconciler: makes each endpoint's replicas match what it should have.

When woken (a request waits for capacity, an endpoint or a replica changed)
it looks at the endpoints that changed, and only those: a per-endpoint work
queue, as Kubernetes controllers keep. Every `period_s` it also looks at the
endpoints whose decisions move with the clock (those with replicas, load,
a scaling decision or a failure pending), and every `resync_s` at all of
them. Each look judges the replicas that went quiet (`liveness`: probed,
and ended only past a long grace, within bounds), asks the autoscaler how many
replicas the endpoint wants, and applies the difference through the
launcher: launch, or drain-then-stop. Replica ends arrive from
the launcher's `exits()` as they happen. The launcher, registry, load source
and store are injected (ports); the policy lives in `autoscaler`. It is the
`ScaleSignals` of the gateway and the endpoint service.

Rules it keeps:
- A replica leaves routing (status `draining`) before it is stopped.
- Scale-down stops replicas still coming up first, then the least busy.
- A GPU change (a new generation) is rolled: new replicas start, and the old
  ones are drained only once enough new ones are ready.
- A replica that fails before it was ever ready is retried with backoff;
  its failure stays visible in the record until a replica is ready again.
  One that was serving (lost with its node, its actor, its engine) is
  replaced at once, and while its replacements come the endpoint is
  `initializing`, as at scale from zero, never `failed`.
- Deletion drains every replica and waits for the processes to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferd.aio import wait_event
from inferd.api.engine_settings import EngineSettings
from inferd.control.model import Deposed, ReplicaFailure, ReplicaRecord, rfc3339, utc_now
from inferd.control.ports import (
    EndpointLoad,
    ExitReason,
    Launcher,
    LoadObservations,
    PlacementKey,
    ReplicaExit,
    ReplicaHandle,
    RequestAborter,
)
from inferd.control.replicas.autoscaler import (
    DOWNSCALE_DELAY_S,
    TARGET_CONCURRENCY,
    TARGET_ENGINE_WAITING,
    TARGET_KV_CACHE_USAGE,
    UPSCALE_DELAY_S,
    Observations,
    ScalerState,
    ScalingSettings,
    decide,
)
from inferd.control.replicas.liveness import (
    EndingBounds,
    EndingBudget,
    HealthProbe,
    HttpHealthProbe,
    Prober,
    choose_endings,
)
from inferd.control.replicas.registry import (
    Registry,
    Replica,
    secret_digest,
    unresponsive_mark,
)
from inferd.control.replicas.scale_events import ScaleCause, ScaleJournal
from inferd.control.signals import Wakeup
from inferd.replica.config import DEFAULT_DRAIN_TIMEOUT_S, ModelSource, ReplicaSpec
from inferd.vocab import ReplicaStatus

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
# Failed replicas kept visible per endpoint (the record shows why).
KEEP_FAILED = 3


class EndpointFacts(Protocol):
    """What the reconciler reads of an endpoint (`inferd.control.model.Endpoint`)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def project_id(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def location_name(self) -> str: ...
    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def retention_seconds(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def deleting_at(self) -> object | None: ...
    @property
    def engine_settings(self) -> EngineSettings: ...


# (endpoint, replicas the autoscaler wants, every endpoint of this pass) ->
# (replicas allowed, why fewer): the project's quota, applied after the
# autoscaler's decision.
ReplicaCap = Callable[[EndpointFacts, int, Sequence[EndpointFacts]], tuple[int, str | None]]


@dataclass(frozen=True)
class ReconcilerSettings:
    period_s: float = 1.0
    # Every endpoint is looked at this often even if nothing rang for it.
    resync_s: float = 30.0
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    target_concurrency: float = TARGET_CONCURRENCY
    upscale_delay_s: float = UPSCALE_DELAY_S
    downscale_delay_s: float = DOWNSCALE_DELAY_S
    target_kv_cache_usage: float | None = TARGET_KV_CACHE_USAGE
    target_engine_waiting: float | None = TARGET_ENGINE_WAITING
    # Replicas silent past the registry's grace are ended at most this share
    # of an endpoint's (at least one) per window, never the last ready one.
    silent_end_max_share: float = EndingBounds.max_share
    silent_end_window_s: float = EndingBounds.window_s


def _mean_kv_cache_usage(ready: Sequence[Replica]) -> float | None:
    """Over the replicas whose engine reports one (vLLM does)."""
    usages = [r.load.kv_cache_usage for r in ready if r.load.kv_cache_usage is not None]
    return sum(usages) / len(usages) if usages else None


@dataclass
class _Plan:
    """Per-endpoint memory between ticks."""

    scaler: ScalerState = field(default_factory=ScalerState)
    failures: int = 0  # consecutive failures without a ready replica
    next_launch_at: float = 0.0
    capacity_reason: str | None = None
    # Activity the gateway cannot know about (adopted replicas after a
    # restart): counts as a request for the retention rule.
    activity_at: float | None = None
    last_failure: ReplicaFailure | None = None
    # Replicas seen ready (their failure is a loss, not a crash loop).
    served: set[str] = field(default_factory=set)
    # Why replacements are on the way after serving replicas were lost.
    replacing: str | None = None
    # Why no replica can be placed anywhere, even on an idle cluster (no
    # node of the location has the GPU type or enough of it): the gateway
    # refuses at once instead of holding requests for nothing.
    unplaceable: str | None = None


class Reconciler:
    def __init__(
        self,
        *,
        registry: Registry,
        launcher: Launcher,
        load: LoadObservations,
        aborter: RequestAborter,
        endpoints: Callable[[], Awaitable[Sequence[EndpointFacts]]],
        models: Callable[[str], ModelSource],
        settings: ReconcilerSettings,
        wakeup: Wakeup | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal: ScaleJournal | None = None,
        replica_cap: ReplicaCap | None = None,
        probe: HealthProbe | None = None,
    ) -> None:
        """`endpoints`: every endpoint as stored now (read each tick, so any
        control plane's writes count); `models`: a catalog model name
        resolved for a replica; `wakeup`: rung by whatever should make the
        reconciler act at once (the registry shares it); `probe`: how a quiet
        replica is asked whether it is alive (its `/health` by default)."""
        self.registry = registry
        self.launcher = launcher
        self.load = load
        self.aborter = aborter
        self.endpoints = endpoints
        self.models = models
        self.settings = settings
        self.clock = clock
        # Every change of desired replicas, with its cause (the console's timeline).
        self.journal = journal or ScaleJournal()
        self.replica_cap = replica_cap
        self.prober = Prober(registry, probe or HttpHealthProbe())
        self._budget = EndingBudget(
            EndingBounds(settings.silent_end_max_share, settings.silent_end_window_s), clock
        )
        # Replicas silent past the grace: replaced (not counted as the
        # endpoint's), and ended as the bounds allow; with why each was kept.
        self._overdue: set[str] = set()
        self._kept: dict[str, str] = {}
        self._plans: dict[str, _Plan] = {}
        self._wake = wakeup or Wakeup()
        self._task: asyncio.Task[None] | None = None
        self._exit_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tick_lock = asyncio.Lock()
        # Replicas whose process has not ended, by id: what to stop or kill.
        self._handles: dict[str, ReplicaHandle] = {}
        # Replicas drained because their endpoint is gone (see _stop_orphans).
        self._orphans: set[str] = set()
        # Set when a replica of the endpoint ends (deletion waits on it).
        self._ended: dict[str, asyncio.Event] = {}
        # Endpoints whose deletion this reconciler was asked to carry out,
        # and those whose drain is still under way. The copy of the
        # endpoints follows the store's change feed, so for a moment after
        # DELETE it still shows the row live while its replicas drain: a
        # pass then would see a live endpoint short of replicas and launch
        # one. Kept until the copy shows the row deleting, or (the drain
        # done) not at all.
        self._deleted: set[str] = set()
        self._draining: set[str] = set()

    # -- lifecycle --------------------------------------------------------------

    def start(self, term: int | None = None) -> None:
        """Start ticking; again after `stop` as well (a leader that lost its
        leadership and won it back). `term`: the leader term the store
        writes are fenced with (the registry writes them)."""
        self.registry.lead(term)
        self.registry.start_judging()
        self._stopping = False
        self._exit_task = asyncio.ensure_future(self._follow_exits())
        self._task = asyncio.ensure_future(self._run())

    def wake(self, endpoint_id: str = "") -> None:
        self._wake.ring(endpoint_id)

    # ScaleSignals: both only wake the loop; the tick reads what changed.
    def capacity_wanted(self, endpoint_id: str) -> None:
        self.wake(endpoint_id)

    def endpoint_changed(self, endpoint_id: str) -> None:
        self.wake(endpoint_id)

    async def stop(self) -> None:
        self._stopping = True
        self.registry.lead(None)
        self.registry.stop_judging()
        self._wake.ring()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._exit_task is not None:
            self._exit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._exit_task
        await self.prober.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sweep_at = resync_at = loop.time()
        while not self._stopping:
            changed, everything = self._wake.take()
            now = loop.time()
            only: set[str] | None = None
            if not everything and now < resync_at:
                only = changed
                if now >= sweep_at:
                    only |= self._clocked()
            try:
                await self.tick(only)
            except Deposed as exc:
                self._deposed(exc)
            except Exception:  # one bad tick must not stop reconciling
                logger.exception("reconcile tick failed")
            if only is None:
                resync_at = now + self.settings.resync_s
            if only is None or now >= sweep_at:
                sweep_at = now + self.settings.period_s
            await self._wake.wait(max(0.0, min(sweep_at, resync_at) - loop.time()))

    def _clocked(self) -> set[str]:
        """Endpoints whose decisions move with the clock alone: replicas to
        watch or scale down, a launch to retry, a decision under way."""
        now = self.clock()
        ids = {replica.endpoint_id for replica in self.registry.all()}
        for endpoint_id, plan in self._plans.items():
            if (
                plan.scaler != ScalerState()
                or plan.capacity_reason is not None
                or plan.unplaceable is not None
                or plan.replacing is not None
                or plan.failures
                or plan.next_launch_at > now
            ):
                ids.add(endpoint_id)
        return ids

    async def _follow_exits(self) -> None:
        async for exited in self.launcher.exits():
            try:
                await self.replica_exited(exited)
            except Deposed as exc:
                self._deposed(exc)
                return
            except Exception:
                logger.exception("handling the end of replica %s failed", exited.replica_id)

    def _deposed(self, exc: Deposed) -> None:
        """Another instance leads now: stop acting at once (the election
        stops the duties for good when its own check notices)."""
        if not self._stopping:
            logger.warning("reconciler stops: %s", exc)
        self._stopping = True
        self._wake.ring()

    def plan(self, endpoint_id: str) -> _Plan:
        return self._plans.setdefault(endpoint_id, _Plan())

    def capacity_reason(self, endpoint_id: str) -> str | None:
        plan = self._plans.get(endpoint_id)
        return plan.capacity_reason if plan else None

    def last_failure(self, endpoint_id: str) -> ReplicaFailure | None:
        plan = self._plans.get(endpoint_id)
        return plan.last_failure if plan else None

    def replacing(self, endpoint_id: str) -> str | None:
        plan = self._plans.get(endpoint_id)
        return plan.replacing if plan else None

    def unplaceable(self, endpoint_id: str) -> str | None:
        plan = self._plans.get(endpoint_id)
        return plan.unplaceable if plan else None

    async def _never_fits(self, row: EndpointFacts, reason: str | None) -> str | None:
        """`reason` when not even an idle cluster could place the endpoint's
        replica (fewer units of its type in its location than one replica
        needs), else None."""
        if reason is None:
            return None
        capacity = await self.launcher.capacity()
        need = 1 if row.gpu_type == "cpu" else row.gpu_count
        total = capacity.total.get(PlacementKey(row.location_name, row.gpu_type), 0)
        return reason if total < need else None

    def running(self) -> list[str]:
        """Replica ids whose process has not ended."""
        return list(self._handles)

    # -- one pass -------------------------------------------------------------------

    async def tick(self, only: set[str] | None = None) -> None:
        """One pass over the endpoints `only` (None: every endpoint)."""
        async with self._tick_lock:
            findings = self.registry.check_liveness()
            self.prober.probe_quiet()
            end, kept = choose_endings(findings.overdue, self.registry, self._budget)
            self._overdue = {r.replica_id for r in findings.overdue}
            for replica, why in kept:
                if self._kept.get(replica.replica_id) != why:
                    logger.warning(
                        "replica %s of endpoint %s has been silent %.0fs; kept (%s) and "
                        "replaced beside it",
                        replica.replica_id,
                        replica.endpoint_id,
                        self.registry.silence(replica),
                        why,
                    )
                self._kept[replica.replica_id] = why
            for replica_id in list(self._kept):
                if replica_id not in self._overdue:
                    del self._kept[replica_id]
            ended = [self.registry.end_silent(r.replica_id) for r in end]
            for replica in [*findings.failed, *(r for r in ended if r is not None)]:
                logger.warning("replica %s failed: %s", replica.replica_id, replica.reason)
                await self._kill(replica.replica_id)
                self.aborter.abort_replica(replica.replica_id, replica.reason or "replica failed")
                if only is not None:
                    only.add(replica.endpoint_id)
            rows = list(await self.endpoints())
            known = {row.id for row in rows}
            self._catch_up_deletions(rows)
            for row in rows:
                if only is not None and row.id not in only:
                    continue
                if self._deleting(row):
                    await self._stop_all(row.id)
                else:
                    await self._reconcile(row, rows)
            await self._stop_orphans(known)
            looked_at = self._plans.keys() if only is None else self._plans.keys() & only
            for endpoint_id in list(looked_at):
                if endpoint_id not in known:
                    self._forget(endpoint_id)
            await self._sync_records()

    def _deleting(self, row: EndpointFacts) -> bool:
        return row.deleting_at is not None or row.id in self._deleted

    def _catch_up_deletions(self, rows: Sequence[EndpointFacts]) -> None:
        """Forget the deletions the copy of the endpoints now shows."""
        if not self._deleted:  # the common case: no index of every row
            return
        by_id = {row.id: row for row in rows}
        for endpoint_id in list(self._deleted):
            row = by_id.get(endpoint_id)
            if row is None and endpoint_id in self._draining:
                continue  # the copy may not have had the row yet
            if row is None or row.deleting_at is not None:
                self._deleted.discard(endpoint_id)

    async def _stop_orphans(self, known: set[str]) -> None:
        """Drain the replicas this instance runs whose endpoint is gone. The
        endpoint copy can lag behind a delete: a pass that still saw the row
        may launch a replica after the delete's drain found none to stop, and
        nothing else would ever stop it (it would hold its GPUs for good)."""
        for replica_id in list(self._handles):
            replica = self.registry.get(replica_id)
            if replica is None or replica.endpoint_id in known:
                continue
            if replica.live and replica.status is not ReplicaStatus.DRAINING:
                self._orphans.add(replica_id)
                await self._drain(replica, "its endpoint was deleted")
        # Ended ones that did not exit cleanly stay as failed rows otherwise.
        for replica_id in list(self._orphans):
            replica = self.registry.get(replica_id)
            if replica is None:
                self._orphans.discard(replica_id)
            elif not replica.live and replica_id not in self._handles:
                self.registry.remove(replica_id)
                self._orphans.discard(replica_id)

    async def _sync_records(self) -> None:
        """Every transition of this pass in the store, fenced with the term
        (the registry writes them)."""
        await self.registry.flush()

    async def adopt(
        self, records: Sequence[ReplicaRecord], endpoints: Sequence[EndpointFacts]
    ) -> list[str]:
        """After a restart: take over the replicas that are still running.
        Returns the ids adopted; the rest are forgotten (and replaced as the
        endpoints need)."""
        by_id = {row.id: row for row in endpoints}
        adopted = []
        now = self.clock()
        for record in records:
            handle = ReplicaHandle(record.id, record.node, dict(record.placement))
            endpoint = by_id.get(record.endpoint_id)
            alive = endpoint is not None and await self.launcher.adopt(handle)
            if not alive or record.status in ("stopped", "failed"):
                if alive:
                    await self.launcher.kill(handle)
                continue
            self._handles[record.id] = handle
            self.registry.add(
                Replica(
                    replica_id=record.id,
                    endpoint_id=record.endpoint_id,
                    generation=record.generation,
                    gpu_type=record.gpu_type,
                    gpu_count=record.gpu_count,
                    secret_digest=record.secret_hash,
                    handle=handle,
                    status=ReplicaStatus(record.status),
                    url=record.url,
                    created_wall=record.created_at.isoformat(),
                    # The last leader's routing verdict stands until the
                    # replica is heard; its silence counts from now.
                    unresponsive_since_wall=unresponsive_mark(record),
                )
            )
            adopted.append(record.id)
        # Adopted replicas count as recent activity (the gateway's memory of
        # requests is gone) and as what each endpoint currently wants.
        for endpoint_id in {self.registry.get(rid).endpoint_id for rid in adopted}:  # type: ignore[union-attr]
            plan = self.plan(endpoint_id)
            plan.activity_at = now
            live = [r for r in self.registry.of_endpoint(endpoint_id) if r.live]
            plan.scaler = ScalerState(desired=len(live))
        return adopted

    async def replica_exited(self, exited: ReplicaExit) -> None:
        """A replica's process ended (from the launcher's `exits()`)."""
        async with self._tick_lock:
            self._handles.pop(exited.replica_id, None)
            replica = self.registry.get(exited.replica_id)
            if replica is None:
                return
            event = self._ended.get(replica.endpoint_id)
            if event is not None:
                event.set()
            self.aborter.abort_replica(replica.replica_id, "the replica exited")
            clean = (
                exited.reason is ExitReason.STOPPED
                and exited.returncode == 0
                and replica.status in (ReplicaStatus.DRAINING, ReplicaStatus.STOPPED)
            )
            if clean or replica.status is ReplicaStatus.STOPPED:
                self.registry.remove(replica.replica_id)
            elif replica.status is ReplicaStatus.DRAINING and exited.reason is ExitReason.KILLED:
                # Stopped on purpose, past its grace period: gone, not failed.
                self.registry.remove(replica.replica_id)
            else:
                served = (
                    replica.status is ReplicaStatus.READY
                    or replica.replica_id in self.plan(replica.endpoint_id).served
                )
                if replica.status is not ReplicaStatus.FAILED:
                    last_line = _last_line(exited.detail)
                    code = exited.returncode
                    if exited.reason is ExitReason.LOST:
                        why = "the replica's process was lost"
                    elif code is None:
                        why = "the replica did not start"  # the detail says why
                    else:
                        why = f"process exited with code {code}"
                    self.registry.set_status(
                        replica.replica_id,
                        ReplicaStatus.FAILED,
                        why + (f": {last_line}" if last_line else ""),
                    )
                failed = self.registry.get(replica.replica_id)
                assert failed is not None
                self._note_failure(failed, served)
            await self._sync_records()
        # Its endpoint, and those waiting for capacity: some is free now.
        self.wake(replica.endpoint_id)
        for endpoint_id, plan in self._plans.items():
            if plan.capacity_reason is not None:
                self.wake(endpoint_id)

    def _note_failure(self, replica: Replica, served: bool) -> None:
        """A crash loop (a replica that never became ready) backs off; a
        replica lost while serving is replaced at once."""
        plan = self.plan(replica.endpoint_id)
        why = replica.reason or "no reason given"
        if served:
            backoff = 0.0
            plan.next_launch_at = self.clock()
            plan.replacing = f"replacing lost replica {replica.replica_id}: {why}"
        else:
            plan.failures += 1
            backoff = min(MAX_BACKOFF_S, 2.0 ** (plan.failures - 1))
            plan.next_launch_at = self.clock() + backoff
            plan.replacing = None  # its replacement failed too: say so
        wanted = plan.scaler.desired
        self.journal.record(
            replica.endpoint_id,
            wanted,
            wanted,
            f"replica {replica.replica_id} failed ({why}); "
            + (f"replacing it in {backoff:.0f}s" if backoff else "replacing it now"),
            ScaleCause.FAILURE,
        )
        plan.last_failure = ReplicaFailure(
            replica.replica_id, replica.reason or "replica failed", rfc3339(utc_now())
        )
        logger.warning(
            "replica %s of endpoint %s failed (%s); next attempt in %.0fs",
            replica.replica_id,
            replica.endpoint_id,
            replica.reason,
            backoff,
        )

    async def _reconcile(self, row: EndpointFacts, rows: Sequence[EndpointFacts]) -> None:
        now = self.clock()
        plan = self.plan(row.id)
        if plan.unplaceable is not None:  # nodes may have joined since
            plan.unplaceable = await self._never_fits(
                row,
                await self.launcher.cannot_place(row.location_name, row.gpu_type, row.gpu_count),
            )
        replicas = self.registry.of_endpoint(row.id)
        # One silent past the grace but kept is not counted: its replacement
        # comes beside it.
        active = [
            r
            for r in replicas
            if r.live
            and r.status is not ReplicaStatus.DRAINING
            and r.replica_id not in self._overdue
        ]
        ready = [r for r in active if r.status is ReplicaStatus.READY]
        plan.served.intersection_update(r.replica_id for r in replicas)
        plan.served.update(r.replica_id for r in ready)
        if ready:
            plan.failures = 0
            plan.replacing = None
            self._prune_failed(replicas, keep=0)
        else:
            self._prune_failed(replicas, keep=KEEP_FAILED)

        traffic = self.load.load(row.id)
        last = traffic.last_request_at
        if plan.activity_at is not None and (last is None or plan.activity_at > last):
            last = plan.activity_at
        observations = Observations(
            in_flight=traffic.in_flight,
            held=traffic.held,
            ready=len(ready),
            coming_up=len(active) - len(ready),
            last_request_at=last,
            kv_cache_usage=_mean_kv_cache_usage(ready),
            engine_waiting=sum(r.load.waiting for r in ready),
        )
        decision = decide(self._scaling(row), observations, plan.scaler, now)
        if decision.desired != plan.scaler.desired:
            self.journal.record(row.id, plan.scaler.desired, decision.desired, decision.reason)
        plan.scaler = decision.state
        desired = decision.desired
        quota_reason = None
        if self.replica_cap is not None:
            desired, quota_reason = self.replica_cap(row, desired, rows)

        current = [r for r in active if r.generation == row.generation]
        old = [r for r in active if r.generation != row.generation]
        missing = desired - len(current)
        if desired == 0:
            plan.replacing = None  # nothing is coming: scaled to zero
        if missing > 0:
            await self._launch(row, plan, missing, now)
            plan.capacity_reason = plan.capacity_reason or quota_reason
        else:
            plan.capacity_reason = quota_reason
        if missing < 0:
            for victim in _victims(current, -missing, traffic):
                await self._drain(victim, "scaled down")
        # Rolling replacement: old replicas go once the new ones carry the load.
        ready_current = sum(r.status is ReplicaStatus.READY for r in current)
        if old and (ready_current >= desired or desired == 0):
            for replica in old:
                await self._drain(replica, "replaced by a replica with the new settings")

    def _scaling(self, row: EndpointFacts) -> ScalingSettings:
        s = self.settings
        return ScalingSettings(
            min_replicas=row.min_replicas,
            max_replicas=row.max_replicas,
            retention_s=row.retention_seconds,
            target_concurrency=s.target_concurrency,
            upscale_delay_s=s.upscale_delay_s,
            downscale_delay_s=s.downscale_delay_s,
            target_kv_cache_usage=s.target_kv_cache_usage,
            target_engine_waiting=s.target_engine_waiting,
        )

    async def _launch(self, row: EndpointFacts, plan: _Plan, count: int, now: float) -> None:
        if now < plan.next_launch_at:
            return
        for _ in range(count):
            reason = await self.launcher.cannot_place(
                row.location_name, row.gpu_type, row.gpu_count
            )
            plan.capacity_reason = reason
            plan.unplaceable = await self._never_fits(row, reason)
            if reason is not None:
                return
            if self._deleting(row):  # DELETE came while this pass awaited
                return
            replica_id = f"r-{uuid.uuid4().hex[:12]}"
            secret = secrets.token_urlsafe(32)
            try:
                model = self.models(row.model_name)
                speculative = row.engine_settings.speculativeDecoding
                draft = None if speculative is None else self.models(speculative.draftModel)
            except Exception as exc:  # not in the catalog any more
                plan.capacity_reason = f"model unavailable: {exc}"
                return
            spec = ReplicaSpec(
                replica_id=replica_id,
                endpoint_id=row.id,
                model=model,
                gpu_type=row.gpu_type,
                gpu_count=row.gpu_count,
                secret=secret,
                location=row.location_name,
                served_names=(row.model_name,),
                generation=row.generation,
                engine_settings=row.engine_settings,
                draft_model=draft,
            )
            try:
                handle = await self.launcher.launch(spec)
            except Exception as exc:  # the machine refused (fork failed, ...)
                plan.capacity_reason = f"launch failed: {exc}"
                logger.exception("launching a replica for %s failed", row.id)
                return
            self._handles[replica_id] = handle
            at = utc_now()
            digest = secret_digest(secret)
            await self.registry.add_launched(
                Replica(
                    replica_id=replica_id,
                    endpoint_id=row.id,
                    generation=row.generation,
                    gpu_type=row.gpu_type,
                    gpu_count=row.gpu_count,
                    secret_digest=digest,
                    handle=handle,
                    created_wall=at.isoformat(),
                ),
                ReplicaRecord(
                    id=replica_id,
                    endpoint_id=row.id,
                    generation=row.generation,
                    gpu_type=row.gpu_type,
                    gpu_count=row.gpu_count,
                    secret_hash=digest,
                    status=ReplicaStatus.STARTING.value,
                    created_at=at,
                    updated_at=at,
                    node=handle.node,
                    placement=dict(handle.placement),
                ),
            )

    async def _drain(self, replica: Replica, why: str) -> None:
        logger.info("draining replica %s of %s: %s", replica.replica_id, replica.endpoint_id, why)
        self.registry.set_status(replica.replica_id, ReplicaStatus.DRAINING, why)
        handle = self._handles.get(replica.replica_id)
        if handle is not None:
            await self.launcher.stop(handle, self.settings.drain_timeout_s)

    async def _kill(self, replica_id: str) -> None:
        handle = self._handles.get(replica_id)
        if handle is not None:
            await self.launcher.kill(handle)

    async def _stop_all(self, endpoint_id: str) -> None:
        for replica in self.registry.of_endpoint(endpoint_id):
            if replica.live and replica.status is not ReplicaStatus.DRAINING:
                await self._drain(replica, "endpoint deleted")
            elif not replica.live and replica.replica_id not in self._handles:
                self.registry.remove(replica.replica_id)

    def _prune_failed(self, replicas: Sequence[Replica], keep: int) -> None:
        failed = [
            r
            for r in replicas
            if r.status is ReplicaStatus.FAILED and r.replica_id not in self._handles
        ]
        for replica in sorted(failed, key=lambda r: r.status_since)[: max(0, len(failed) - keep)]:
            self.registry.remove(replica.replica_id)

    def _forget(self, endpoint_id: str) -> None:
        self._plans.pop(endpoint_id, None)
        self._budget.forget(endpoint_id)
        self.journal.forget(endpoint_id)
        self._ended.pop(endpoint_id, None)
        self.load.forget(endpoint_id)
        self.aborter.forget_endpoint(endpoint_id)

    # -- deletion -------------------------------------------------------------------

    async def drain_endpoint(self, endpoint_id: str, timeout_s: float | None = None) -> None:
        """Stop every replica of a deleted endpoint and wait until their
        processes have ended (DELETE answers only then); past `timeout_s`,
        kill what is left. Woken by each replica end, never by polling."""
        # Before anything awaits: a pass under way must not launch for it.
        self._deleted.add(endpoint_id)
        self._draining.add(endpoint_id)
        try:
            await self._drain_endpoint(endpoint_id, timeout_s)
        finally:
            self._draining.discard(endpoint_id)

    async def _drain_endpoint(self, endpoint_id: str, timeout_s: float | None) -> None:
        timeout = timeout_s if timeout_s is not None else self.settings.drain_timeout_s + 10
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        killed = False
        while True:
            async with self._tick_lock:
                await self._stop_all(endpoint_id)
                remaining = [
                    r.replica_id
                    for r in self.registry.of_endpoint(endpoint_id)
                    if r.replica_id in self._handles
                ]
                ended = self._ended.setdefault(endpoint_id, asyncio.Event())
                ended.clear()
            if not remaining:
                break
            left = deadline - loop.time()
            if left <= 0 and not killed:
                killed = True
                for replica_id in remaining:
                    await self._kill(replica_id)
            await wait_event(ended, max(left, 0) if not killed else None)
        # Under the lock: a tick's store writes in progress must not see
        # the same replicas go (each would delete them, the second fails).
        async with self._tick_lock:
            for replica in self.registry.of_endpoint(endpoint_id):
                self.registry.remove(replica.replica_id)
            self._forget(endpoint_id)
            await self._sync_records()


def _victims(replicas: Sequence[Replica], count: int, traffic: EndpointLoad) -> list[Replica]:
    """Replicas to remove: still coming up first (no traffic yet), then the
    ones with the least in flight, newest first among equals."""

    def cost(replica: Replica) -> tuple[int, int, float]:
        coming_up = replica.status is not ReplicaStatus.READY
        in_flight = traffic.in_flight_by_replica.get(replica.replica_id, 0)
        return (0 if coming_up else 1, in_flight, -replica.created_at)

    return sorted(replicas, key=cost)[:count]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
