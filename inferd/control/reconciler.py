"""The reconciler: makes each endpoint's replicas match what it should have.

Every tick (and at once when woken: a request waits for capacity, a replica
changed) it reaps ended processes, fails replicas that went quiet, asks the
autoscaler how many replicas each endpoint wants, and applies the difference
through the launcher: launch, or drain-then-stop. The launcher, registry,
gateway traffic and store are injected; the policy lives in `autoscaler`.

Rules it keeps:
- A replica leaves routing (status `draining`) before it is stopped.
- Scale-down stops replicas still coming up first, then the least busy.
- A GPU change (a new generation) is rolled: new replicas start, and the old
  ones are drained only once enough new ones are ready.
- A replica that fails before it was ever ready is retried with backoff;
  its failure stays visible in the record until a replica is ready again.
- Deletion drains every replica and waits for the processes to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferd.control.autoscaler import Observations, ScalerState, ScalingSettings, decide
from inferd.control.launchers.base import Launcher, ReplicaSpec
from inferd.control.model import Endpoint, ReplicaRecord, rfc3339, utc_now, utc_now_text
from inferd.control.ports import ReplicaStore
from inferd.control.registry import Registry, Replica, secret_digest
from inferd.gateway.traffic import TrafficSnapshot
from inferd.vocab import ReplicaStatus

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
# Failed replicas kept visible per endpoint (the record shows why).
KEEP_FAILED = 3


class TrafficSource(Protocol):
    def traffic(self, endpoint_id: str) -> TrafficSnapshot: ...

    def abort_replica(self, replica_id: str, reason: str = ...) -> int: ...

    def forget_endpoint(self, endpoint_id: str) -> None: ...


@dataclass(frozen=True)
class ReconcilerSettings:
    period_s: float = 1.0
    drain_timeout_s: float = 30.0
    target_concurrency: float = 8.0
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 60.0


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


class Reconciler:
    def __init__(
        self,
        *,
        registry: Registry,
        launcher: Launcher,
        traffic: TrafficSource,
        records: ReplicaStore,
        endpoints: Callable[[], Sequence[Endpoint]],
        settings: ReconcilerSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.launcher = launcher
        self.traffic = traffic
        self.records = records
        self.endpoints = endpoints
        self.settings = settings
        self.clock = clock
        self._plans: dict[str, _Plan] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tick_lock = asyncio.Lock()
        # What the store holds per replica: (status, reason, url).
        self._persisted: dict[str, tuple[str, str | None, str | None]] = {}

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Start ticking; again after `stop` as well (a leader that lost its
        leadership and won it back)."""
        self._stopping = False
        self._task = asyncio.ensure_future(self._run())

    def wake(self, endpoint_id: str | None = None) -> None:
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                await self.tick()
            except Exception:  # one bad tick must not stop reconciling
                logger.exception("reconcile tick failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.period_s)

    def plan(self, endpoint_id: str) -> _Plan:
        return self._plans.setdefault(endpoint_id, _Plan())

    def capacity_reason(self, endpoint_id: str) -> str | None:
        plan = self._plans.get(endpoint_id)
        return plan.capacity_reason if plan else None

    def note_activity(self, endpoint_id: str, at: float) -> None:
        self.plan(endpoint_id).activity_at = at

    # -- one pass -------------------------------------------------------------------

    async def tick(self) -> None:
        async with self._tick_lock:
            await self._reap()
            for replica in self.registry.check_liveness():
                logger.warning("replica %s failed: %s", replica.replica_id, replica.reason)
                self.launcher.kill(replica.replica_id)
                self.traffic.abort_replica(replica.replica_id, replica.reason or "replica failed")
            rows = list(self.endpoints())
            known = {row.id for row in rows}
            for row in rows:
                if row.deleting_at is None:
                    await self._reconcile(row)
                else:
                    self._stop_all(row.id)
            for endpoint_id in list(self._plans):
                if endpoint_id not in known:
                    self._forget(endpoint_id)
            await self._sync_records()

    async def _sync_records(self) -> None:
        """Write what changed since the last tick: one place, every transition."""
        current = {r.replica_id: r for r in self.registry.all()}
        for replica_id in [rid for rid in self._persisted if rid not in current]:
            await self.records.delete_replica(replica_id)
            del self._persisted[replica_id]
        for replica_id, replica in current.items():
            state = (replica.status.value, replica.reason, replica.url)
            if replica_id in self._persisted and self._persisted[replica_id] != state:
                await self.records.update_replica(
                    replica_id, status=state[0], reason=state[1], url=state[2], at=utc_now()
                )
                self._persisted[replica_id] = state

    def adopt(self, rows: Sequence[ReplicaRecord], endpoints: Sequence[Endpoint]) -> list[str]:
        """After a restart: take over the replicas that are still running.
        Returns the ids adopted; the rest are forgotten (and replaced as the
        endpoints need)."""
        by_id = {row.id: row for row in endpoints}
        adopted = []
        now = self.clock()
        for row in rows:
            endpoint = by_id.get(row.endpoint_id)
            pid, gpu_ids = _local_placement(row)
            alive = endpoint is not None and self.launcher.adopt(row.id, pid, gpu_ids)
            if not alive or row.status in ("stopped", "failed"):
                if alive:
                    self.launcher.kill(row.id)
                continue
            status = ReplicaStatus(row.status)
            self.registry.add(
                Replica(
                    replica_id=row.id,
                    endpoint_id=row.endpoint_id,
                    generation=row.generation,
                    gpu_type=row.gpu_type,
                    gpu_ids=gpu_ids,
                    gpu_count=row.gpu_count,
                    secret_digest=row.secret_hash,
                    status=status,
                    pid=pid,
                    url=row.url,
                    created_wall=rfc3339(row.created_at),
                )
            )
            self._persisted[row.id] = (row.status, row.reason, row.url)
            adopted.append(row.id)
        # Adopted replicas count as recent activity (the gateway's memory of
        # requests is gone) and as what each endpoint currently wants.
        for endpoint_id in {self.registry.get(rid).endpoint_id for rid in adopted}:  # type: ignore[union-attr]
            plan = self.plan(endpoint_id)
            plan.activity_at = now
            live = [r for r in self.registry.of_endpoint(endpoint_id) if r.live]
            plan.scaler = ScalerState(desired=len(live))
        return adopted

    async def _reap(self) -> None:
        for exited in self.launcher.reap():
            replica = self.registry.get(exited.replica_id)
            if replica is None:
                continue
            clean = exited.returncode == 0 and replica.status in (
                ReplicaStatus.DRAINING,
                ReplicaStatus.STOPPED,
            )
            self.traffic.abort_replica(replica.replica_id, "the replica exited")
            if clean or replica.status is ReplicaStatus.STOPPED:
                self.registry.remove(replica.replica_id)
                continue
            if replica.status is not ReplicaStatus.FAILED:
                last_line = _last_line(exited.log_tail)
                self.registry.set_status(
                    replica.replica_id,
                    ReplicaStatus.FAILED,
                    f"process exited with code {exited.returncode}"
                    + (f": {last_line}" if last_line else ""),
                )
            failed = self.registry.get(replica.replica_id)
            assert failed is not None
            self._note_failure(failed)

    def _note_failure(self, replica: Replica) -> None:
        plan = self.plan(replica.endpoint_id)
        plan.failures += 1
        backoff = min(MAX_BACKOFF_S, 2.0 ** (plan.failures - 1))
        plan.next_launch_at = self.clock() + backoff
        logger.warning(
            "replica %s of endpoint %s failed (%s); next attempt in %.0fs",
            replica.replica_id,
            replica.endpoint_id,
            replica.reason,
            backoff,
        )

    async def _reconcile(self, row: Endpoint) -> None:
        now = self.clock()
        plan = self.plan(row.id)
        replicas = self.registry.of_endpoint(row.id)
        active = [r for r in replicas if r.live and r.status is not ReplicaStatus.DRAINING]
        ready = [r for r in active if r.status is ReplicaStatus.READY]
        if ready:
            plan.failures = 0
            self._prune_failed(replicas, keep=0)
        else:
            self._prune_failed(replicas, keep=KEEP_FAILED)

        traffic = self.traffic.traffic(row.id)
        last = traffic.last_request_at
        if plan.activity_at is not None and (last is None or plan.activity_at > last):
            last = plan.activity_at
        observations = Observations(
            in_flight=traffic.in_flight,
            held=traffic.held,
            ready=len(ready),
            coming_up=len(active) - len(ready),
            last_request_at=last,
        )
        decision = decide(self._scaling(row), observations, plan.scaler, now)
        plan.scaler = decision.state
        desired = decision.desired

        current = [r for r in active if r.generation == row.generation]
        old = [r for r in active if r.generation != row.generation]
        missing = desired - len(current)
        if missing > 0:
            await self._launch(row, plan, missing, now)
        else:
            plan.capacity_reason = None
        if missing < 0:
            for victim in _victims(current, -missing, traffic):
                self._drain(victim, "scaled down")
        # Rolling replacement: old replicas go once the new ones carry the load.
        ready_current = sum(r.status is ReplicaStatus.READY for r in current)
        if old and (ready_current >= desired or desired == 0):
            for replica in old:
                self._drain(replica, "replaced by a replica with the new settings")

    def _scaling(self, row: Endpoint) -> ScalingSettings:
        s = self.settings
        return ScalingSettings(
            min_replicas=row.min_replicas,
            max_replicas=row.max_replicas,
            retention_s=row.retention_seconds,
            target_concurrency=s.target_concurrency,
            upscale_delay_s=s.upscale_delay_s,
            downscale_delay_s=s.downscale_delay_s,
        )

    async def _launch(self, row: Endpoint, plan: _Plan, count: int, now: float) -> None:
        if now < plan.next_launch_at:
            return
        for _ in range(count):
            reason = self.launcher.cannot_place(row.gpu_type, row.gpu_count)
            plan.capacity_reason = reason
            if reason is not None:
                return
            replica_id = f"r-{uuid.uuid4().hex[:12]}"
            secret = secrets.token_urlsafe(32)
            spec = ReplicaSpec(
                replica_id=replica_id,
                endpoint_id=row.id,
                model_name=row.model_name,
                gpu_type=row.gpu_type,
                gpu_count=row.gpu_count,
                secret=secret,
                served_names=(row.model_name,),
            )
            try:
                launched = self.launcher.launch(spec)
            except Exception as exc:  # the machine refused (fork failed, ...)
                plan.capacity_reason = f"launch failed: {exc}"
                logger.exception("launching a replica for %s failed", row.id)
                return
            replica = self.registry.add(
                Replica(
                    replica_id=replica_id,
                    endpoint_id=row.id,
                    generation=row.generation,
                    gpu_type=row.gpu_type,
                    gpu_ids=launched.gpu_ids,
                    gpu_count=row.gpu_count,
                    secret_digest=secret_digest(secret),
                    pid=launched.pid,
                    created_wall=utc_now_text(),
                )
            )
            row_now = utc_now()
            await self.records.insert_replica(
                ReplicaRecord(
                    id=replica_id,
                    endpoint_id=row.id,
                    generation=row.generation,
                    gpu_type=row.gpu_type,
                    gpu_count=row.gpu_count,
                    node=launched.host,
                    placement={
                        "pid": str(launched.pid),
                        "gpu_ids": ",".join(str(i) for i in launched.gpu_ids),
                    },
                    secret_hash=replica.secret_digest,
                    status=replica.status.value,
                    created_at=row_now,
                    updated_at=row_now,
                ),
            )
            self._persisted[replica_id] = (replica.status.value, None, None)

    def _drain(self, replica: Replica, why: str) -> None:
        logger.info("draining replica %s of %s: %s", replica.replica_id, replica.endpoint_id, why)
        self.registry.set_status(replica.replica_id, ReplicaStatus.DRAINING, why)
        self.launcher.stop(replica.replica_id, self.settings.drain_timeout_s)

    def _stop_all(self, endpoint_id: str) -> None:
        for replica in self.registry.of_endpoint(endpoint_id):
            if replica.live and replica.status is not ReplicaStatus.DRAINING:
                self._drain(replica, "endpoint deleted")
            elif not replica.live and replica.replica_id not in self.launcher.running():
                self.registry.remove(replica.replica_id)

    def _prune_failed(self, replicas: Sequence[Replica], keep: int) -> None:
        failed = [
            r
            for r in replicas
            if r.status is ReplicaStatus.FAILED and r.replica_id not in self.launcher.running()
        ]
        for replica in sorted(failed, key=lambda r: r.status_since)[: max(0, len(failed) - keep)]:
            self.registry.remove(replica.replica_id)

    def _forget(self, endpoint_id: str) -> None:
        self._plans.pop(endpoint_id, None)
        self.traffic.forget_endpoint(endpoint_id)

    # -- deletion -------------------------------------------------------------------

    async def drain_endpoint(self, row: Endpoint, timeout_s: float | None = None) -> None:
        """Stop every replica of a deleted endpoint and wait until their
        processes have ended (DELETE answers only then)."""
        timeout = timeout_s if timeout_s is not None else self.settings.drain_timeout_s + 10
        deadline = self.clock() + timeout
        while True:
            async with self._tick_lock:
                self._stop_all(row.id)
                await self._reap()
                remaining = [
                    r.replica_id
                    for r in self.registry.of_endpoint(row.id)
                    if r.replica_id in self.launcher.running()
                ]
            if not remaining:
                break
            if self.clock() > deadline:
                for replica_id in remaining:
                    self.launcher.kill(replica_id)
            await asyncio.sleep(0.05)
        # Under the lock: a tick's store writes in progress must not see
        # the same replicas go (each would delete them, the second fails).
        async with self._tick_lock:
            for replica in self.registry.of_endpoint(row.id):
                self.registry.remove(replica.replica_id)
            self._forget(row.id)
            await self._sync_records()


def _victims(replicas: Sequence[Replica], count: int, traffic: TrafficSnapshot) -> list[Replica]:
    """Replicas to remove: still coming up first (no traffic yet), then the
    ones with the least in flight, newest first among equals."""

    def cost(replica: Replica) -> tuple[int, int, float]:
        coming_up = replica.status is not ReplicaStatus.READY
        in_flight = traffic.in_flight_by_replica.get(replica.replica_id, 0)
        return (0 if coming_up else 1, in_flight, -replica.created_at)

    return sorted(replicas, key=cost)[:count]


def _local_placement(record: ReplicaRecord) -> tuple[int, tuple[int, ...]]:
    """The process id and GPU indices the local launcher stored (0, () if none)."""
    pid = record.placement.get("pid", "0")
    gpu_ids = record.placement.get("gpu_ids", "")
    return (int(pid) if pid.isdigit() else 0), tuple(int(i) for i in gpu_ids.split(",") if i)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
