"""Stored types of accounts: projects, users, memberships, management keys,
audit entries and hourly usage. Frozen, database-neutral; times are aware UTC
`datetime`s truncated to milliseconds (what every store keeps)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum

from inferd.control.accounts.quota import Quota, in_force
from inferd.control.accounts.roles import Role

# Endpoints made before projects existed, and the operator's endpoints when
# it names no project, live here.
DEFAULT_PROJECT = "default"


def utc_now() -> datetime:
    """Now in UTC, truncated to the milliseconds every store keeps."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def hour_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Project:
    id: str  # its name: lowercase slug, unique, used in URLs
    created_at: datetime
    quota: Quota = field(default_factory=Quota)  # set by its admins, within the limit
    limit: Quota = field(default_factory=Quota)  # set by the operator

    @property
    def quota_in_force(self) -> Quota:
        return in_force(self.quota, self.limit)


@dataclass(frozen=True)
class User:
    id: str  # its name: lowercase slug, unique
    created_at: datetime


@dataclass(frozen=True)
class Membership:
    project_id: str
    user_id: str
    role: Role
    created_at: datetime


@dataclass(frozen=True)
class UserKey:
    """A user's management key as stored: never the key, only its digest."""

    id: str
    user_id: str
    name: str
    key_hash: bytes
    # The key's recognisable prefix and its last 4 characters, for listings.
    hint: str
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None
    # The one project the key acts in (None: every project of its user). A
    # project admin mints keys only for their own project, so a key never
    # grants more than its minter could; only the user and the operator
    # mint keys that act everywhere the user is a member.
    project_id: str | None = None


class AuditAction(str, Enum):
    PROJECT_CREATE = "project.create"
    PROJECT_DELETE = "project.delete"
    ENDPOINT_CREATE = "endpoint.create"
    ENDPOINT_UPDATE = "endpoint.update"
    ENDPOINT_DELETE = "endpoint.delete"
    TOKEN_REISSUE = "endpoint.token.reissue"
    ADAPTER_ADD = "endpoint.adapter.add"
    ADAPTER_REMOVE = "endpoint.adapter.remove"
    CLIENT_TOKEN_CREATE = "endpoint.client_token.create"
    CLIENT_TOKEN_REVOKE = "endpoint.client_token.revoke"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    USER_CREATE = "user.create"
    MEMBER_ADD = "member.add"
    MEMBER_CHANGE = "member.change"
    MEMBER_REMOVE = "member.remove"
    QUOTA_CHANGE = "quota.change"


@dataclass(frozen=True)
class AuditEntry:
    """One thing that was done: who, what, when, to what. Never changed."""

    at: datetime
    project_id: str | None  # None: not about one project (a user's key)
    actor: str  # Principal.label
    action: AuditAction
    target: str  # "endpoint:<id>", "key:<id>", "member:<user>", "project:<id>"
    detail: Mapping[str, object] = field(default_factory=dict)
    id: int = 0  # assigned by the store, increasing


@dataclass(frozen=True)
class UsageDelta:
    """Usage of one endpoint within one hour, to be added to the stored sum."""

    endpoint_id: str
    project_id: str
    hour: datetime  # start of the hour, UTC
    gpu_type: str
    gpu_count: int
    replica_seconds: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0
    cost: float = 0.0  # replica-seconds priced at the endpoint's hourly price

    def key(self) -> tuple[str, datetime, str, int]:
        return (self.endpoint_id, self.hour, self.gpu_type, self.gpu_count)

    def is_empty(self) -> bool:
        return not (
            self.replica_seconds or self.requests or self.prompt_tokens
            or self.completion_tokens or self.images or self.cost
        )  # fmt: skip


# A stored hourly row has the same fields: the sum of every delta of its key.
UsageRow = UsageDelta

# Where a usage list is ordered, and so where a page of it resumes.
UsageKey = tuple[datetime, str, str, int]  # hour, endpoint id, GPU type, GPU count


def usage_order(row: UsageRow) -> UsageKey:
    return (row.hour, row.endpoint_id, row.gpu_type, row.gpu_count)


@dataclass(frozen=True)
class UsageTotals:
    """Sums of usage rows (over a whole window, whatever page is shown)."""

    replica_seconds: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0
    cost: float = 0.0

    def plus(self, rows: Iterable[UsageRow]) -> UsageTotals:
        totals = self
        for r in rows:
            totals = UsageTotals(
                totals.replica_seconds + r.replica_seconds, totals.requests + r.requests,
                totals.prompt_tokens + r.prompt_tokens,
                totals.completion_tokens + r.completion_tokens,
                totals.images + r.images, totals.cost + r.cost,
            )  # fmt: skip
        return totals
