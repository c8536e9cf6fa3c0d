"""The registry: what the control plane knows about every replica.

Replicas push status and load (`report`); the reconciler adds replicas it
launched, marks the ones it stops, and removes the ones whose process ended.
The gateway reads it through `ReplicaDirectory` (with the endpoints, see
`inferd.control.endpoints.views.EndpointDirectory`).

Slow is not dead. A replica heard from neither by report, nor by an answer
the gateway relayed, nor by a health probe for `failure_periods` health
periods is marked `unresponsive`: out of routing while another replica of
its endpoint is ready (still routed to when it is the only one), and back
the moment it is heard again. The mark is the leader's (only it sweeps for
silence) and travels on the replica's row, so that every instance of a
cluster routes around the replica and shows it; whichever instance hears
the replica serve again clears it. Only silence past `dead_after_s` (longer
while it loads) makes it `overdue`: a candidate for the reconciler to end,
within the bounds of `inferd.control.replicas.liveness`. A replica whose
process ended, or whose engine says it is dead, is failed at once by other
paths (the launcher's exits, the replica's own report).

Statuses set by the control plane are sticky: once a replica is `draining`
or `failed` here, a late report that says `ready` does not bring it back
into routing.

The registry is the only writer of replica rows (`ReplicaStore`): a launch
is inserted at once, and every later transition (a status, reason or URL
set here or reported, a removal) is written by `flush`, fenced with the
leader term of the instance that writes. Replicas read back from the store
(adopted, or followed from another instance's writes) are not written
again. An instance that does not lead also writes a heartbeat, about once
a health period, for each replica that reports to it: the leader's
liveness sweep hears it through the store.

Silence is judged only from what this instance observed while judging: a
leader counts a replica's silence from the moment it began to lead (or
adopted the replica), never from a last report that went to another
instance while it did not lead.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from inferd.aio import wait_event
from inferd.api.replica import ReplicaReport
from inferd.control.model import (
    Deposed,
    ReplicaRecord,
    StoreUnavailable,
    parse_rfc3339,
    rfc3339,
    utc_now,
    utc_now_text,
)
from inferd.control.ports import ReplicaHandle, ReplicaStore
from inferd.control.replicas.load import ReplicaCount
from inferd.gateway.directory import RoutableReplica
from inferd.vocab import REPLICA_STAGES, ReplicaStatus, replica_stage

logger = logging.getLogger(__name__)

_FORWARD = {
    ReplicaStatus.STARTING: 0,
    ReplicaStatus.LOADING: 1,
    ReplicaStatus.READY: 2,
    ReplicaStatus.DRAINING: 3,
    ReplicaStatus.STOPPED: 4,
    ReplicaStatus.FAILED: 4,
}
# A replica still coming up is taken for dead only after this many times
# the silence that would end a ready one: loading an engine on a busy CPU
# can hold a replica's event loop for seconds whatever the health period,
# and a loading replica takes no traffic, so waiting longer costs nothing
# but the time to notice a hang.
LOADING_SILENCE_FACTOR = 3
# Statuses the control plane sets that a replica's own report cannot undo.
_STICKY = frozenset({ReplicaStatus.DRAINING, ReplicaStatus.STOPPED, ReplicaStatus.FAILED})


def _by_id(item: tuple[str, int | None]) -> str:
    return item[0]


def unresponsive_mark(record: ReplicaRecord) -> str | None:
    """The leader's unresponsive mark on a replica's row, as served (None:
    heard lately)."""
    return None if record.unresponsive_since is None else rfc3339(record.unresponsive_since)


def secret_digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


@dataclass(frozen=True)
class ReplicaLoad:
    in_flight: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float | None = None
    kv_cache_tokens: int | None = None
    # Prefix cache: prompt tokens looked up and found, since the replica started.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    adapters: frozenset[str] = frozenset()
    # Running totals since the replica started (for tokens/s and images/s).
    generated_tokens: int = 0
    images: int = 0


@dataclass(frozen=True)
class Replica:
    """One replica as the registry knows it (a frozen snapshot)."""

    replica_id: str
    endpoint_id: str
    generation: int
    gpu_type: str
    gpu_count: int
    secret_digest: bytes = field(repr=False)
    # Where it runs, as its launcher knows it (opaque here).
    handle: ReplicaHandle | None = None
    status: ReplicaStatus = ReplicaStatus.STARTING
    reason: str | None = None
    url: str | None = None
    engine: str | None = None  # as the replica reports it
    load: ReplicaLoad = ReplicaLoad()
    created_at: float = 0.0  # clock
    status_since: float = 0.0  # clock
    last_report_at: float | None = None  # clock
    last_seq: int = -1  # of the last report applied
    # The gateway could not connect: out of routing until the next report.
    unreachable: bool = False
    # When it was last heard to serve (a report from a loop that is not
    # stalled, or a probe answer; answers the gateway relays are kept apart,
    # on the request path), and since when it has not been (clock; None
    # while it is heard).
    heard_at: float | None = None
    unresponsive_since: float | None = None
    unresponsive_since_wall: str | None = None
    # Wall-clock times for the API (RFC 3339 text).
    created_wall: str = ""
    status_since_wall: str = ""

    @property
    def live(self) -> bool:
        return self.status not in ReplicaStatus.gone()

    @property
    def routable(self) -> bool:
        """Ready and reachable. An unresponsive one still is: it is routed
        to when no other routable replica of its endpoint is responsive."""
        return self.status is ReplicaStatus.READY and not self.unreachable and bool(self.url)

    @property
    def unresponsive(self) -> bool:
        return self.unresponsive_since is not None


@dataclass(frozen=True)
class RegistrySettings:
    # Replicas report this often; silence for `failure_periods` of them
    # makes a replica `unresponsive` (out of routing while another is ready).
    health_period_s: float = 2.0
    # 2: a hung replica is out of routing within two periods of its last
    # report, and one late report is still tolerated.
    failure_periods: int = 2
    # Not ready this long after its launch: failed, however it reports.
    start_timeout_s: float = 900.0
    # Silence (no report, answer or probe answer) this long, or
    # LOADING_SILENCE_FACTOR times as long while loading, and a replica is
    # taken for dead. Long: an overloaded replica answers late, not never,
    # and ending it would turn a peak into an outage.
    dead_after_s: float = 60.0


@dataclass(frozen=True)
class LivenessFindings:
    """What one liveness sweep found."""

    # Failed here now (not ready within the start timeout).
    failed: list[Replica]
    # Silent past the grace: dead unless the reconciler keeps them (the last
    # ready one, or past the share it may end at a time).
    overdue: list[Replica]


class ReportRejected(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Registry:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = utc_now_text,
        health_period_s: float = RegistrySettings.health_period_s,
        failure_periods: int = RegistrySettings.failure_periods,
        start_timeout_s: float = RegistrySettings.start_timeout_s,
        dead_after_s: float = RegistrySettings.dead_after_s,
        on_change: Callable[[str], None] | None = None,
        rows: ReplicaStore | None = None,
    ) -> None:
        """`on_change`: called with an endpoint id when one of its replicas
        changed (a `Wakeup`'s `ring`: the reconciler acts on it)."""
        self._clock = clock
        self._wall = wall
        self._health_period = health_period_s
        self._failure_periods = failure_periods
        self._start_timeout = start_timeout_s
        self._dead_after = dead_after_s
        self._replicas: dict[str, Replica] = {}
        # When the gateway last relayed a 2xx from each replica: liveness
        # counts it like a report (a replica whose engine starves its report
        # loop of CPU still serves, and ending it would cost a restart).
        self._answered_at: dict[str, float] = {}
        self._ready_events: dict[str, asyncio.Event] = {}
        # Called with an endpoint id when one of its replicas changed (the
        # reconciler persists and re-derives).
        self._on_change = on_change or (lambda endpoint_id: None)
        # Where replica rows are written (None: nowhere, a registry alone).
        self._rows = rows
        # Replicas whose row is behind: changed or removed here since the
        # last write.
        self._dirty: dict[str, int | None] = {}
        # The leader term transitions happen under (None: not leading).
        self._term: int | None = None
        # Replicas that reported here since the last heartbeat written, and
        # when that heartbeat was written.
        self._heard: set[str] = set()
        self._beat_at: dict[str, float] = {}
        self._write_lock = asyncio.Lock()
        self._behind = asyncio.Event()
        # Replicas seen failed, and how many failed per endpoint since this
        # instance started (`inferd_replica_failures` on /metrics).
        self._seen_failed: set[str] = set()
        self.failures: dict[str, int] = {}
        # Since when this instance judges silence (the reconciler runs
        # here: it leads); None while it does not. Silence before it was
        # not observed here, so it counts for nothing.
        self._judging_since: float | None = None

    # -- replicas (fed by the reconciler) ---------------------------------------

    def add(self, replica: Replica) -> Replica:
        """Known from now. A mark it carries (read from the store: wall time
        only) counts from now on this instance's clock."""
        now = self._clock()
        replica = replace(
            replica,
            created_at=now,
            status_since=now,
            status_since_wall=self._wall(),
            unresponsive_since=now if replica.unresponsive_since_wall else None,
        )
        self._replicas[replica.replica_id] = replica
        self._changed(replica)
        return replica

    def get(self, replica_id: str) -> Replica | None:
        return self._replicas.get(replica_id)

    def all(self) -> list[Replica]:
        return list(self._replicas.values())

    def of_endpoint(self, endpoint_id: str) -> list[Replica]:
        return [r for r in self._replicas.values() if r.endpoint_id == endpoint_id]

    def set_status(self, replica_id: str, status: ReplicaStatus, reason: str | None = None) -> None:
        replica = self._replicas.get(replica_id)
        if replica is None or replica.status == status:
            return
        if replica.status in ReplicaStatus.gone():
            return  # terminal
        self._replicas[replica_id] = replace(
            replica,
            status=status,
            reason=reason,
            status_since=self._clock(),
            status_since_wall=self._wall(),
        )
        self._mark(replica_id)
        self._changed(self._replicas[replica_id])

    def remove(self, replica_id: str) -> Replica | None:
        """Forget it; its row is deleted at the next `flush`."""
        replica = self.forget(replica_id)
        if replica is not None:
            self._mark(replica_id)
        return replica

    def forget(self, replica_id: str) -> Replica | None:
        """Forget a replica the store no longer holds (nothing to write)."""
        self._answered_at.pop(replica_id, None)
        self._seen_failed.discard(replica_id)
        self._heard.discard(replica_id)
        self._beat_at.pop(replica_id, None)
        replica = self._replicas.pop(replica_id, None)
        if replica is not None:
            self._on_change(replica.endpoint_id)
        return replica

    def start_judging(self) -> None:
        """This instance judges liveness from now (the reconciler started:
        it leads). Every replica's silence counts from now at the earliest."""
        self._judging_since = self._clock()

    def stop_judging(self) -> None:
        self._judging_since = None

    # -- replica rows ------------------------------------------------------------------

    def lead(self, term: int | None) -> None:
        """This instance leads under `term` from now (None: it does not).
        Every transition is written fenced with the term it happened under,
        so a deposed leader's late write is refused however late it runs."""
        self._term = term

    async def add_launched(self, replica: Replica, record: ReplicaRecord) -> Replica:
        """A replica just launched: known here, and its row inserted now."""
        added = self.add(replica)
        if self._rows is not None:
            await self._rows.insert_replica(record, term=self._term)
        return added

    def drop_rows(self, replica_ids: Sequence[str]) -> None:
        """Rows of replicas not known here (not adopted): deleted at the next `flush`."""
        for replica_id in replica_ids:
            if replica_id not in self._replicas:
                self._mark(replica_id)

    async def flush(self) -> None:
        """Write every row that is behind, each fenced with the term it
        changed under, and, while this instance does not lead, heartbeats of
        the replicas that report to it. Raises `Deposed` (that write is
        dropped: the new leader writes now) or `StoreUnavailable` (what was
        not written stays behind)."""
        if self._rows is None:
            self._dirty.clear()
            self._heard.clear()
            return
        async with self._write_lock:
            dirty, self._dirty = self._dirty, {}
            heard, self._heard = self._heard, set()
            left = dict(dirty)
            try:
                for replica_id, term in sorted(dirty.items(), key=_by_id):
                    try:
                        await self._write(replica_id, term)
                    except Deposed:
                        # Whatever changed under that term is the new
                        # leader's to write now.
                        left = {r: t for r, t in left.items() if t != term}
                        raise
                    del left[replica_id]
                if self._term is None:
                    now = self._clock()
                    for replica_id in sorted(heard - dirty.keys()):
                        beat_at = self._beat_at.get(replica_id)
                        if beat_at is None or now - beat_at >= self._health_period:
                            await self._write(replica_id, None)
                        else:
                            self._heard.add(replica_id)
            except StoreUnavailable:
                self._dirty = {**left, **self._dirty}
                self._heard |= heard
                raise
            except Deposed:
                self._dirty = {**left, **self._dirty}
                raise

    async def _write(self, replica_id: str, term: int | None) -> None:
        assert self._rows is not None
        replica = self._replicas.get(replica_id)
        if replica is None:
            await self._rows.delete_replica(replica_id, term=term)
            return
        marked = replica.unresponsive_since_wall if replica.unresponsive else None
        await self._rows.update_replica(
            replica_id,
            status=replica.status.value,
            reason=replica.reason,
            url=replica.url,
            at=utc_now(),
            unresponsive_since=parse_rfc3339(marked) if marked else None,
            term=term,
        )
        self._beat_at[replica_id] = self._clock()

    async def write_rows(self) -> None:
        """Runs until cancelled: writes rows soon after they fall behind
        (reports to an instance that does not lead have no other writer)."""
        delay = 0.2
        while True:
            await self._behind.wait()
            self._behind.clear()
            try:
                await self.flush()
                delay = 0.2
            except StoreUnavailable as exc:
                logger.warning("could not write replica rows: %s; retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self._behind.set()
            except Exception as exc:  # Deposed: the new leader writes now
                logger.warning("a replica row was not written: %s", exc)

    def _mark(self, replica_id: str) -> None:
        self._dirty[replica_id] = self._term
        self._behind.set()

    # -- reports from replicas ------------------------------------------------------

    def authenticate(self, replica_id: str, secret: str | None) -> Replica:
        """The replica whose secret this is; raises ReportRejected(404|401).
        Checked before a report's body is even parsed, so a caller without
        the secret learns nothing from validation errors."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            # Not ours (any more): the replica drains and exits on 404.
            raise ReportRejected(404, "unknown replica")
        if secret is None or not hmac.compare_digest(secret_digest(secret), replica.secret_digest):
            raise ReportRejected(401, "bad replica secret")
        return replica

    def report(self, replica_id: str, secret: str | None, report: ReplicaReport) -> bool:
        """Apply one status report; False when it was older than one already
        applied (dropped). Raises ReportRejected(400|401|404|410)."""
        replica = self.authenticate(replica_id, secret)
        if report.replica_id != replica_id:
            raise ReportRejected(400, "the report names another replica")
        if replica.status is ReplicaStatus.FAILED:
            raise ReportRejected(410, "replica was failed by the control plane")
        if report.seq <= replica.last_seq:
            return False  # crossed on the wire with a newer one
        reported = report.status
        now = self._clock()
        stalled = report.loop_stalled_s
        serving = stalled is None or stalled < self.silent_limit
        status: ReplicaStatus = replica.status
        reason = replica.reason
        # Forward only, and the control plane's own verdicts stand.
        if replica.status not in _STICKY and _FORWARD[reported] >= _FORWARD[replica.status]:
            status, reason = reported, report.reason
        elif reported in ReplicaStatus.gone():
            status, reason = reported, report.reason or replica.reason
        load, usage = report.load, report.usage
        updated = replace(
            replica,
            status=status,
            reason=reason,
            url=report.url or replica.url,
            engine=report.engine or replica.engine,
            load=ReplicaLoad(
                in_flight=load.in_flight,
                running=load.running,
                waiting=load.waiting,
                kv_cache_usage=load.kv_cache_usage,
                kv_cache_tokens=load.kv_cache_tokens,
                prefix_cache_queries=load.prefix_cache_queries,
                prefix_cache_hits=min(load.prefix_cache_hits, load.prefix_cache_queries),
                adapters=frozenset(load.adapters),
                # A report without usage keeps the last totals (not a reset).
                generated_tokens=usage.completion_tokens
                if usage
                else replica.load.generated_tokens,
                images=usage.images if usage else replica.load.images,
            ),
            last_seq=report.seq,
            last_report_at=now,
            unreachable=False,
            # Sent from a thread of its own, a report says the process lives;
            # it says the replica serves only if its serving loop answered.
            heard_at=now if serving else replica.heard_at,
            unresponsive_since=None if serving else replica.unresponsive_since,
            unresponsive_since_wall=None if serving else replica.unresponsive_since_wall,
            status_since=replica.status_since if status == replica.status else now,
            status_since_wall=(
                replica.status_since_wall if status == replica.status else self._wall()
            ),
        )
        self._replicas[replica_id] = updated
        back = replica.unresponsive != updated.unresponsive
        if back or (status, reason, updated.url) != (replica.status, replica.reason, replica.url):
            self._mark(replica_id)
        elif serving:
            # A heartbeat says it serves: one from a stalled loop would keep
            # the leader from ever finding it silent.
            self._heard.add(replica_id)
            self._behind.set()
        if status != replica.status:
            # The operator's terminal follows each replica's life here (the
            # report requests themselves are not access-logged).
            logger.info(
                "replica %s of endpoint %s: %s%s",
                replica_id,
                replica.endpoint_id,
                f"ready at {updated.url}" if status is ReplicaStatus.READY else status.value,
                f" ({reason})" if reason else "",
            )
        if back:
            logger.info("replica %s of endpoint %s reports again", replica_id, replica.endpoint_id)
        if status != replica.status or replica.unreachable or back:
            self._changed(updated)
        return True

    def reported_in_flight(self, endpoint_id: str) -> list[ReplicaCount]:
        """What each live replica of the endpoint last said it has in flight
        (requests from every gateway)."""
        return [
            ReplicaCount(r.replica_id, r.load.in_flight)
            for r in self._replicas.values()
            if r.endpoint_id == endpoint_id and r.live and r.last_report_at is not None
        ]

    def observe(
        self,
        replica_id: str,
        status: ReplicaStatus,
        reason: str | None,
        url: str | None,
        *,
        newer: bool,
        unresponsive_since: str | None = None,
    ) -> None:
        """A replica's state as another control-plane instance recorded it
        (read back from the shared store). The same forward-only rules as a
        report. `newer`: the record changed since the last one seen; one
        without the unresponsive mark counts as a report for the liveness
        sweep (the replica reported to another instance). A newer one with
        the mark (`unresponsive_since`, wall time) is the leader's verdict:
        taken here unless this instance judges for itself (it leads)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        now = self._clock()
        heard = newer and unresponsive_since is None
        marked_since, marked_wall = replica.unresponsive_since, replica.unresponsive_since_wall
        verdict = newer and unresponsive_since is not None and self._judging_since is None
        if verdict and not replica.unresponsive:
            marked_since, marked_wall = now, unresponsive_since
        new_status, new_reason = replica.status, replica.reason
        if replica.status not in _STICKY and _FORWARD[status] >= _FORWARD[replica.status]:
            new_status, new_reason = status, reason
        elif status in ReplicaStatus.gone() and replica.status not in ReplicaStatus.gone():
            new_status, new_reason = status, reason or replica.reason
        changed = new_status != replica.status or (url is not None and url != replica.url)
        changed = changed or (heard and replica.unresponsive)
        changed = changed or (marked_since is not None and not replica.unresponsive)
        updated = replace(
            replica,
            status=new_status,
            reason=new_reason,
            url=url or replica.url,
            last_report_at=now if heard else replica.last_report_at,
            heard_at=now if heard else replica.heard_at,
            unresponsive_since=None if heard else marked_since,
            unresponsive_since_wall=None if heard else marked_wall,
            status_since=replica.status_since if new_status == replica.status else now,
            status_since_wall=(
                replica.status_since_wall if new_status == replica.status else self._wall()
            ),
        )
        self._replicas[replica_id] = updated
        if changed:
            self._changed(updated)

    @property
    def silent_limit(self) -> float:
        """Silence after which a ready replica is `unresponsive`."""
        return self._health_period * self._failure_periods

    def last_heard(self, replica: Replica) -> float | None:
        """When it was last heard to serve; None: a replica coming up that
        was never heard (only the start timeout applies to it)."""
        answered = self._answered_at.get(replica.replica_id, 0.0)
        if replica.heard_at is None and replica.status in ReplicaStatus.coming_up():
            return answered or None
        return max(replica.heard_at or replica.status_since, answered, self._judging_since or 0.0)

    def check_liveness(self) -> LivenessFindings:
        """Mark the replicas that went quiet `unresponsive`, fail the ones
        not ready within the start timeout, and return those silent past
        the grace (`overdue`: the reconciler decides which to end)."""
        now = self._clock()
        failed: list[Replica] = []
        overdue: list[Replica] = []
        for replica in list(self._replicas.values()):
            # A draining one is ended by its launcher past its drain grace.
            if replica.status in ReplicaStatus.gone() or replica.status is ReplicaStatus.DRAINING:
                continue
            coming_up = replica.status in ReplicaStatus.coming_up()
            if coming_up and now - replica.created_at > self._start_timeout:
                failed.append(self._fail(replica, f"not ready after {self._start_timeout:.0f}s"))
                continue
            last = self.last_heard(replica)
            if last is None:
                continue
            silent = now - last
            if not coming_up and silent > self.silent_limit and not replica.unresponsive:
                replica = self._mark_unresponsive(replica, now, silent)
            limit = self._dead_after * (LOADING_SILENCE_FACTOR if coming_up else 1)
            if silent > limit:
                overdue.append(replica)
        return LivenessFindings(failed, overdue)

    def silence(self, replica: Replica) -> float:
        """Seconds since it was last heard to serve (0 if never heard)."""
        last = self.last_heard(replica)
        return 0.0 if last is None else self._clock() - last

    def end_silent(self, replica_id: str) -> Replica | None:
        """Fail an overdue replica (the reconciler ends its process)."""
        replica = self._replicas.get(replica_id)
        if replica is None or not replica.live:
            return replica
        what = replica.status.value
        return self._fail(
            replica,
            f"no report, answer or health-probe answer for {self.silence(replica):.0f}s "
            f"while {what}",
        )

    def quiet(self, endpoint_id: str | None = None) -> list[Replica]:
        """Live replicas with a URL not heard from for over a health period:
        worth a direct health probe (a late report may only be late)."""
        now = self._clock()
        found = []
        for replica in self._replicas.values():
            if endpoint_id is not None and replica.endpoint_id != endpoint_id:
                continue
            if not replica.live or replica.status is ReplicaStatus.DRAINING or not replica.url:
                continue
            last = self.last_heard(replica)
            if last is None or now - last > self._health_period:
                found.append(replica)
        return found

    def probe_answered(self, replica_id: str) -> None:
        """The replica answered a direct health probe: it serves."""
        replica = self._replicas.get(replica_id)
        if replica is not None and replica.live:
            self._hear(replica, "answers its health probe again")

    def _hear(self, replica: Replica, how: str) -> None:
        updated = replace(
            replica,
            heard_at=self._clock(),
            unresponsive_since=None,
            unresponsive_since_wall=None,
        )
        self._replicas[replica.replica_id] = updated
        if replica.unresponsive:
            logger.info(
                "replica %s of endpoint %s %s", replica.replica_id, replica.endpoint_id, how
            )
            self._mark(replica.replica_id)  # every instance routes to it again
            self._changed(updated)

    def _mark_unresponsive(self, replica: Replica, now: float, silent: float) -> Replica:
        updated = replace(replica, unresponsive_since=now, unresponsive_since_wall=self._wall())
        self._replicas[replica.replica_id] = updated
        self._mark(replica.replica_id)  # every instance routes around it
        others = [
            r
            for r in self._replicas.values()
            if r.endpoint_id == replica.endpoint_id
            and r.replica_id != replica.replica_id
            and r.routable
            and not r.unresponsive
        ]
        logger.warning(
            "replica %s of endpoint %s unresponsive: nothing heard for %.1fs; %s, probing it",
            replica.replica_id,
            replica.endpoint_id,
            silent,
            "routing around it" if others else "still routed to (no other replica is ready)",
        )
        self._changed(updated)
        return updated

    def _fail(self, replica: Replica, reason: str) -> Replica:
        self.set_status(replica.replica_id, ReplicaStatus.FAILED, reason)
        return self._replicas[replica.replica_id]

    def _changed(self, replica: Replica) -> None:
        if replica.status is ReplicaStatus.FAILED and replica.replica_id not in self._seen_failed:
            self._seen_failed.add(replica.replica_id)
            self.failures[replica.endpoint_id] = self.failures.get(replica.endpoint_id, 0) + 1
        if replica.routable:
            event = self._ready_events.pop(replica.endpoint_id, None)
            if event is not None:
                event.set()
        self._on_change(replica.endpoint_id)

    # -- ReplicaDirectory (the gateway's view) ---------------------------------------

    def ready_replicas(self, endpoint_id: str) -> Sequence[RoutableReplica]:
        """The routable replicas, less the unresponsive ones while any other
        is responsive (an endpoint whose replicas are all unresponsive is
        still served: slow answers beat none)."""
        routable = [
            r for r in self._replicas.values() if r.endpoint_id == endpoint_id and r.routable
        ]
        responsive = [r for r in routable if not r.unresponsive]
        return [
            RoutableReplica(
                r.replica_id,
                r.url or "",
                r.load.waiting,
                r.load.adapters,
                r.load.kv_cache_tokens,
                call_key=r.secret_digest.hex(),
            )
            for r in (responsive or routable)
        ]

    def coming_stage(self, endpoint_id: str) -> str | None:
        """The stage (`REPLICA_STAGES`) of the endpoint's replica furthest on
        its way to ready; None when none is on its way."""
        coming = [
            replica_stage(r.status, r.reason)
            for r in self._replicas.values()
            if r.endpoint_id == endpoint_id and r.status in ReplicaStatus.coming_up()
        ]
        return max(coming, key=REPLICA_STAGES.index, default=None)

    def report_answered(self, replica_id: str) -> None:
        # A dict lookup and a write: this is on every request's path. A
        # replica removed while its last answer was relayed is not remembered.
        replica = self._replicas.get(replica_id)
        if replica is not None:
            self._answered_at[replica_id] = self._clock()
            if replica.unresponsive_since is not None and replica.live:
                self._hear(replica, "answers requests again")

    def report_unreachable(self, replica_id: str, reason: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is not None and not replica.unreachable:
            self._replicas[replica_id] = replace(replica, unreachable=True)
            self._on_change(replica.endpoint_id)

    async def wait_ready(self, endpoint_id: str, timeout: float) -> bool:
        if self.ready_replicas(endpoint_id):
            return True
        event = self._ready_events.setdefault(endpoint_id, asyncio.Event())
        await wait_event(event, timeout)
        return bool(self.ready_replicas(endpoint_id))
