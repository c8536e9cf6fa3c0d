"""Batch records and their state machine, in OpenAI's vocabulary.

A batch moves validating -> in_progress -> finalizing -> completed, or to
failed (nothing runnable), expired (its completion window passed) or, asked
to, cancelling -> cancelled. Its requests are each pending until their
result is recorded, then done (a 2xx answer, in the output file) or failed
(any other answer or none, in the error file). A result is written in the
same statement that marks the request finished, so a request is never done
without its result, and a leader that dies mid-request leaves it pending:
the next leader runs it again (at-least-once execution, exactly-once
results).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from inferd.control.model import StoreError

COMPLETION_WINDOW = "24h"
WINDOW = timedelta(hours=24)

# The endpoints a batch may target: the gateway route each maps to, below
# the endpoint URL, and the model kinds it is for.
BATCH_URLS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "chat",
    "/v1/embeddings": "embedding",
}


@dataclass(frozen=True)
class BatchSettings:
    max_file_bytes: int = 64 << 20
    max_requests: int = 50_000
    project_quota_bytes: int = 1 << 30
    # Requests of one batch in flight at once (each waits in the gateway's
    # queue behind every interactive request).
    concurrency: int = 8
    poll_seconds: float = 1.0
    # A request answered 429/502/503/504 (or not at all) is tried again,
    # after `retry_seconds` doubling, this many times in all.
    max_attempts: int = 5
    retry_seconds: float = 1.0
    price_per_million_tokens: float = 0.0
    discount: float = 0.5


class BatchStatus(str, Enum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @classmethod
    def running(cls) -> tuple[BatchStatus, ...]:
        """What the leader still has to work on."""
        return (cls.VALIDATING, cls.IN_PROGRESS, cls.FINALIZING, cls.CANCELLING)

    @property
    def final(self) -> bool:
        return self not in BatchStatus.running()


class Capacity(str, Enum):
    """What a batch may do to its endpoint's replicas (inferd's `capacity`
    field of a batch). Either way it stays within the endpoint's bounds
    (`maxReplicas`) and takes only the capacity interactive traffic leaves."""

    # Like any request: it wakes an endpoint at zero, and its requests are
    # the endpoint's load (they keep a replica up while they run, and may
    # ask for more).
    WAKE = "wake"
    # Only on replicas that are up for other reasons: it wakes none, and its
    # requests are no load to the autoscaler (they keep no replica up); while
    # none is ready its requests wait, pending, within the batch's window.
    RUNNING = "running"


class RequestState(str, Enum):
    PENDING = "pending"
    DONE = "done"  # a 2xx answer: the output file
    FAILED = "failed"  # another answer, or none: the error file


# Which transitions a batch may make; anything else is a bug or a race lost.
_NEXT: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset(
        {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING}
    ),
    BatchStatus.IN_PROGRESS: frozenset(
        {BatchStatus.FINALIZING, BatchStatus.CANCELLING, BatchStatus.EXPIRED}
    ),
    BatchStatus.FINALIZING: frozenset({BatchStatus.COMPLETED}),
    BatchStatus.CANCELLING: frozenset({BatchStatus.CANCELLED}),
}


def may_move(current: BatchStatus, to: BatchStatus) -> bool:
    return to in _NEXT.get(current, frozenset())


# The timestamp each status sets (OpenAI's field names, without `_at`).
STAMPS = {
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


@dataclass(frozen=True)
class BatchFile:
    """An uploaded input file, or a batch's output or error file (whose
    lines are read from the batch's requests: `batch_id` set)."""

    id: str
    endpoint_id: str
    project_id: str
    purpose: str  # batch | batch_output
    filename: str
    bytes: int
    created_at: datetime
    lines: int = 0
    batch_id: str | None = None
    # For a batch's own files: which requests' lines it holds.
    holds: str | None = None  # done | failed

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": _epoch(self.created_at),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass(frozen=True)
class Counts:
    total: int = 0
    completed: int = 0
    failed: int = 0

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    def to_openai(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}


@dataclass(frozen=True)
class Usage:
    """What a batch's requests used (from each answer's `usage`), and its
    cost at the batch price (the token price less the batch discount)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Batch:
    id: str
    endpoint_id: str
    project_id: str
    url: str
    input_file_id: str
    status: BatchStatus
    created_at: datetime
    expires_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    times: dict[str, datetime] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    counts: Counts = Counts()
    usage: Usage = Usage()
    # Whose token created it (`inferd.gateway.fairness.OWNER`, "": the
    # endpoint owner's; else a client token's name): its requests run as
    # that client, with its share, rate limit and usage.
    client: str = ""
    capacity: Capacity = Capacity.WAKE

    def to_openai(self, estimate: Estimate | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.url,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": COMPLETION_WINDOW,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": _epoch(self.created_at),
            "expires_at": _epoch(self.expires_at),
            "request_counts": self.counts.to_openai(),
            "metadata": self.metadata or None,
            "usage": {
                "input_tokens": self.usage.prompt_tokens,
                "output_tokens": self.usage.completion_tokens,
                "total_tokens": self.usage.total_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        for stamp in STAMPS.values():
            at = self.times.get(stamp)
            body[stamp] = None if at is None else _epoch(at)
        # inferd's own: what it may do to the endpoint's replicas, the cost
        # at the batch price, and when it should end.
        body["capacity"] = self.capacity.value
        body["cost"] = round(self.usage.cost, 6)
        body["estimated_completion_at"] = (
            None if estimate is None or estimate.done_at is None else _epoch(estimate.done_at)
        )
        return body


@dataclass(frozen=True)
class Estimate:
    """When a running batch should finish, at the rate it finished
    requests so far (None until it has finished some)."""

    done_at: datetime | None
    per_second: float


def estimate(batch: Batch, now: datetime) -> Estimate:
    """From the requests finished since the batch began running: a pure
    function of the batch and the time, for the API and the CLI."""
    started = batch.times.get("in_progress_at")
    counts = batch.counts
    if batch.status.final:
        return Estimate(batch.times.get(STAMPS.get(batch.status, ""), None), 0.0)
    if started is None or counts.finished == 0:
        return Estimate(None, 0.0)
    elapsed = max((now - started).total_seconds(), 1e-3)
    rate = counts.finished / elapsed
    left = counts.total - counts.finished
    return Estimate(now + timedelta(seconds=math.ceil(left / rate)), rate)


def batch_cost(usage_tokens: int, price_per_million: float, discount: float) -> float:
    """The batch price: the token price less the discount (0.5: half price)."""
    return usage_tokens * price_per_million / 1e6 * (1.0 - discount)


def _epoch(at: datetime) -> int:
    return int(at.timestamp())


class StorageQuotaExceeded(StoreError):
    def __init__(self, project_id: str, used: int, quota: int, adding: int) -> None:
        super().__init__(
            f"project {project_id!r} keeps {used} bytes of batch files; {adding} more would "
            f"pass its quota of {quota} bytes"
        )
        self.used, self.quota, self.adding = used, quota, adding


@dataclass(frozen=True)
class PendingRequest:
    idx: int
    custom_id: str
    body: bytes


@dataclass(frozen=True)
class Result:
    """One request's result: its line of the output (done) or error file."""

    idx: int
    state: RequestState
    line: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    # When it was answered: its usage is added to the endpoint's usage of
    # that hour with the result (None: not metered, as for an expired one).
    at: datetime | None = None
