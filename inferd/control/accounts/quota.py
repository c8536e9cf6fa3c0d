"""Per-project quotas: GPUs by type, endpoints, replicas in total.

Two levels: the operator sets a project's limit (what the server lends the
team); the project's admins set their own quota within it (what they let
their developers spend). The project is held to the lower of the two.

A pure policy over frozen dataclasses. Settings changes (create, PATCH) are
checked against what the project has promised: every endpoint's floor
(minReplicas) must fit together, and one endpoint's ceiling (maxReplicas)
may not exceed the quota on its own. Ceilings may oversubscribe the quota
together; the autoscaler then stops at the quota (`cap_replicas`) and the
endpoint's status says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from inferd.errors import Conflict


@dataclass(frozen=True)
class Quota:
    """Limits of one project; None: unlimited."""

    endpoints: int | None = None
    replicas: int | None = None
    gpus: Mapping[str, int] = field(default_factory=dict)  # GPU type -> GPUs

    def to_dict(self) -> dict[str, object]:
        return {"endpoints": self.endpoints, "replicas": self.replicas, "gpus": dict(self.gpus)}


UNLIMITED = Quota()


def _lower(own: int | None, limit: int | None) -> int | None:
    return own if limit is None else limit if own is None else min(own, limit)


def in_force(own: Quota, limit: Quota) -> Quota:
    """What a project is held to: its admins' own quota under the operator's
    limit, the lower of the two on each count."""
    gpus = {t: _lower(own.gpus.get(t), limit.gpus.get(t)) for t in {*own.gpus, *limit.gpus}}
    return Quota(
        endpoints=_lower(own.endpoints, limit.endpoints),
        replicas=_lower(own.replicas, limit.replicas),
        gpus={t: n for t, n in sorted(gpus.items()) if n is not None},
    )


@dataclass(frozen=True)
class AboveLimit:
    quota: str  # "endpoints", "replicas" or "gpus:<type>"
    asked: int | None  # None: unlimited
    limit: int

    def message(self, project_id: str) -> str:
        asked = "unlimited" if self.asked is None else str(self.asked)
        return (
            f"Project '{project_id}' quota '{self.quota}' can be at most the operator's "
            f"limit {self.limit}, not {asked}; ask the operator to raise the limit."
        )


def above_limit(own: Quota, limit: Quota) -> AboveLimit | None:
    """First count of `own` that the operator's `limit` does not allow
    (unlimited where the operator set a limit counts as above it)."""
    pairs = [
        ("endpoints", own.endpoints, limit.endpoints),
        ("replicas", own.replicas, limit.replicas),
    ]
    pairs += [(f"gpus:{t}", own.gpus.get(t), n) for t, n in sorted(limit.gpus.items())]
    for name, asked, most in pairs:
        if most is not None and (asked is None or asked > most):
            return AboveLimit(name, asked, most)
    return None


@dataclass(frozen=True)
class EndpointShape:
    """What of one endpoint counts against a quota."""

    id: str
    gpu_type: str
    gpu_count: int  # per replica; 0 for CPU types is fine too
    replicas: int  # the floor (settings check) or the live count (autoscaling)


@dataclass(frozen=True)
class QuotaExceeded:
    quota: str  # "endpoints", "replicas" or "gpus:<type>"
    limit: int
    in_use: int
    requested: int

    def message(self, project_id: str) -> str:
        return (
            f"Project '{project_id}' quota '{self.quota}' would be exceeded: limit {self.limit}, "
            f"in use {self.in_use}, this change needs {self.requested}."
        )

    def error(self, project_id: str) -> Conflict:
        return Conflict(self.message(project_id), param=self.quota, code="quota_exceeded")


def _gpu_use(shapes: Iterable[EndpointShape]) -> dict[str, int]:
    use: dict[str, int] = {}
    for s in shapes:
        use[s.gpu_type] = use.get(s.gpu_type, 0) + s.gpu_count * s.replicas
    return use


def check_settings(
    quota: Quota,
    others: Iterable[EndpointShape],
    changed: EndpointShape,
    max_replicas: int,
    *,
    new_endpoint: bool,
) -> QuotaExceeded | None:
    """First quota a create (`new_endpoint`) or a change of `changed` would
    break, given the project's other endpoints at their floors; None: fits."""
    others = [o for o in others if o.id != changed.id]
    if new_endpoint and quota.endpoints is not None and len(others) + 1 > quota.endpoints:
        return QuotaExceeded("endpoints", quota.endpoints, len(others), 1)
    if quota.replicas is not None:
        in_use = sum(o.replicas for o in others)
        if in_use + changed.replicas > quota.replicas:
            return QuotaExceeded("replicas", quota.replicas, in_use, changed.replicas)
        if max_replicas > quota.replicas:
            return QuotaExceeded("replicas", quota.replicas, in_use, max_replicas)
    limit = quota.gpus.get(changed.gpu_type)
    if limit is not None:
        in_use = _gpu_use(others).get(changed.gpu_type, 0)
        needed = changed.gpu_count * changed.replicas
        if in_use + needed > limit:
            return QuotaExceeded(f"gpus:{changed.gpu_type}", limit, in_use, needed)
        if changed.gpu_count * max_replicas > limit:
            return QuotaExceeded(
                f"gpus:{changed.gpu_type}", limit, in_use, changed.gpu_count * max_replicas
            )
    return None


@dataclass(frozen=True)
class ReplicaCap:
    allowed: int
    # Set when the quota, not the autoscaler, decided the count.
    limited_by: QuotaExceeded | None = None


def cap_replicas(
    quota: Quota, others_live: Iterable[EndpointShape], endpoint: EndpointShape, desired: int
) -> ReplicaCap:
    """How many of `desired` replicas `endpoint` may run, given the replicas
    the project's other endpoints run now. Never below what it runs already
    (a quota lowered under current use stops growth; it does not evict)."""
    others = [o for o in others_live if o.id != endpoint.id]
    allowed = desired
    worst: QuotaExceeded | None = None
    if quota.replicas is not None:
        in_use = sum(o.replicas for o in others)
        room = max(0, quota.replicas - in_use)
        if room < allowed:
            allowed = room
            worst = QuotaExceeded("replicas", quota.replicas, in_use + endpoint.replicas, desired)
    limit = quota.gpus.get(endpoint.gpu_type)
    if limit is not None and endpoint.gpu_count > 0:
        in_use = _gpu_use(others).get(endpoint.gpu_type, 0)
        room = max(0, (limit - in_use) // endpoint.gpu_count)
        if room < allowed:
            allowed = room
            worst = QuotaExceeded(
                f"gpus:{endpoint.gpu_type}",
                limit,
                in_use + endpoint.gpu_count * endpoint.replicas,
                endpoint.gpu_count * desired,
            )
    allowed = max(allowed, min(desired, endpoint.replicas))
    return ReplicaCap(allowed, worst if allowed < desired else None)


def capped_reason(project_id: str, cap: ReplicaCap) -> str | None:
    if cap.limited_by is None:
        return None
    q = cap.limited_by
    return (
        f"autoscaling stopped at project '{project_id}' quota '{q.quota}' "
        f"(limit {q.limit}, in use {q.in_use})"
    )
