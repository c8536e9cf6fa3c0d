"""Domain types and domain errors of the control plane's stored state.

What the stores hold and hand out, independent of any database: every
store adapter (in-memory, SQLite, PostgreSQL) speaks these types, and the
service, reconciler and server speak only these. Times are timezone-aware
`datetime`s in UTC, truncated to milliseconds so that every store gives back
exactly the value it was given (SQLite keeps RFC 3339 text, PostgreSQL
`timestamptz` microseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum

from inferd.api.engine_settings import NO_ENGINE_SETTINGS, EngineSettings
from inferd.errors import ServiceUnavailable

# Every endpoint belongs to a project; until accounts exist there is one.
DEFAULT_PROJECT = "default"


def utc_now() -> datetime:
    """Now in UTC, truncated to the milliseconds every store keeps."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def rfc3339(at: datetime) -> str:
    """`2025-01-01T00:00:00.000Z`: the form times are served in."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    if at.tzinfo is None:
        # Written by a version that stored naive UTC: it is UTC.
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC)


def utc_now_text() -> str:
    """RFC 3339 UTC timestamp with milliseconds, as served."""
    return rfc3339(utc_now())


@dataclass(frozen=True)
class Endpoint:
    """One endpoint's settings (its replicas live elsewhere)."""

    id: str
    name: str
    model_name: str
    model_kind: str
    gpu_type: str
    gpu_count: int
    location_name: str
    min_replicas: int
    max_replicas: int
    retention_seconds: int
    hourly_price: float
    currency: str
    created_at: datetime
    updated_at: datetime
    # Set when deletion starts; replicas drain while it is set.
    deleting_at: datetime | None = None
    # Bumped when the GPU or engine settings change, so older replicas get replaced.
    generation: int = 1
    project_id: str = DEFAULT_PROJECT
    # How its replicas run their engine (context, dtype, quantization, ...).
    engine_settings: EngineSettings = NO_ENGINE_SETTINGS

    @property
    def max_loras(self) -> int:
        """LoRA adapters one replica serves in a batch; 0: LoRA is off."""
        return self.engine_settings.maxLoras or 0

    @property
    def max_lora_rank(self) -> int:
        return self.engine_settings.lora_rank


@dataclass(frozen=True)
class EndpointChanges:
    """What an update may change; None leaves a setting as it is."""

    updated_at: datetime
    min_replicas: int | None = None
    max_replicas: int | None = None
    retention_seconds: int | None = None
    gpu_type: str | None = None
    gpu_count: int | None = None
    hourly_price: float | None = None
    currency: str | None = None
    generation: int | None = None
    engine_settings: EngineSettings | None = None

    def settings(self) -> dict[str, object]:
        """The changed settings by `Endpoint` field name (None ones left out)."""
        values = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "retention_seconds": self.retention_seconds,
            "gpu_type": self.gpu_type,
            "gpu_count": self.gpu_count,
            "hourly_price": self.hourly_price,
            "currency": self.currency,
            "generation": self.generation,
            "engine_settings": self.engine_settings,
        }
        return {k: v for k, v in values.items() if v is not None}

    def apply(self, endpoint: Endpoint) -> Endpoint:
        return replace(endpoint, updated_at=self.updated_at, **self.settings())  # type: ignore[arg-type]


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica as stored: enough for a restarted control plane to adopt it.

    `node` names where it runs and `placement` is the launcher's own data
    (the local launcher keeps its process id and GPU indices there); nothing
    outside the launcher reads either.
    """

    id: str
    endpoint_id: str
    generation: int
    gpu_type: str
    gpu_count: int
    secret_hash: bytes
    status: str
    created_at: datetime
    updated_at: datetime
    node: str = "local"
    placement: Mapping[str, str] = field(default_factory=dict)
    reason: str | None = None
    url: str | None = None
    # Since when the leader has not heard it serve (None: heard lately).
    # Carried on the row so that every instance routes around it.
    unresponsive_since: datetime | None = None


@dataclass(frozen=True)
class ClientToken:
    """A named token that opens one endpoint beside its owner's token: one
    application or person calling it, with its own share of the endpoint
    when it is at capacity (`weight`), an optional rate limit, and its own
    usage. Only the digest of the token is stored."""

    endpoint_id: str
    name: str
    token_hash: bytes
    hint: str  # the token's prefix and last 4 characters, for listings
    created_at: datetime
    weight: float = 1.0
    requests_per_minute: int | None = None
    last_used_at: datetime | None = None


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter registered on an endpoint: requests whose `model` is
    `name` are served by the endpoint's base model with this adapter."""

    endpoint_id: str
    name: str
    # What the replica loads: a directory on its machine or a Hugging Face
    # repository id (as given at registration, directories made absolute).
    source: str
    rank: int
    created_at: datetime
    # PEFT's base_model_name_or_path, as the adapter's trainer wrote it.
    base_model: str | None = None


@dataclass(frozen=True)
class AdapterUsage:
    """What one LoRA adapter of an endpoint served within one hour (added to
    the stored sum; the endpoint's own usage rows count these requests too)."""

    endpoint_id: str
    adapter: str
    hour: datetime  # start of the hour, UTC
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def key(self) -> tuple[str, str, datetime]:
        return (self.endpoint_id, self.adapter, self.hour)

    def plus(self, other: AdapterUsage) -> AdapterUsage:
        return replace(
            self,
            requests=self.requests + other.requests,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class ChangeKind(str, Enum):
    ENDPOINT = "endpoint"  # id: the endpoint's id (created, changed or deleted)
    TOKEN = "token"  # id: the endpoint whose active token changed
    ADMIN_KEY = "admin_key"  # id: "" (the set of admin keys changed)
    REPLICA = "replica"  # id: the replica's id
    # id: "key:<id>", "user:<id>" (memberships) or "project:<id>" (its quota)
    ACCOUNT = "account"
    MODEL = "model"  # id: a registered model's name, or "" when a profile changed
    ADAPTER = "adapter"  # id: the endpoint whose adapters changed
    # (TOKEN also covers an endpoint's client tokens: created or revoked.)
    # Changes may have been missed (the feed fell too far behind): reload all.
    RESYNC = "resync"


@dataclass(frozen=True)
class Change:
    """A record changed: which kind, which id. Read the store for its state."""

    kind: ChangeKind
    id: str = ""


class StoreError(RuntimeError):
    """The store cannot be used as configured (bad URL, wrong journal mode)."""


class SchemaTooNew(StoreError):
    """The database was written by a newer inferd; refuse rather than guess."""


class DuplicateName(Exception):
    """Another endpoint already has this name."""


class DuplicateAdapter(Exception):
    """The endpoint already has an adapter of this name."""


class DuplicateClientToken(Exception):
    """The endpoint already has a client token of this name."""


class TooManyClientTokens(Exception):
    """The endpoint has as many client tokens as it may."""


class EndpointGone(Exception):
    """The endpoint does not exist (any more), or is being deleted."""


class Deposed(Exception):
    """A leader write under a term that is no longer current."""

    def __init__(self, writer_term: int, current_term: int) -> None:
        super().__init__(
            f"leader term {writer_term} is over (current term {current_term}): write refused"
        )
        self.writer_term = writer_term
        self.current_term = current_term


def fence_allows(writer_term: int, current_term: int) -> bool:
    """A leader write goes through only under the term it was elected with.
    An older term is a deposed leader; a newer one cannot be issued to a
    writer and means the caller is confused: refused as well."""
    return writer_term == current_term


class StoreUnavailable(ServiceUnavailable):
    """The database cannot be reached now; the write did not happen.

    An HTTP answer of its own: 503 with `Retry-After`, so a client retries
    once the database is back (the store reconnects by itself).
    """

    code = "store_unavailable"

    def __init__(self, detail: str = "", *, retry_after: float = 2.0) -> None:
        message = "The control plane's database is unavailable; retry shortly."
        super().__init__(message, retry_after=retry_after)
        self.detail = detail


class StoreClosed(StoreUnavailable):
    """This process closed its store (it is shutting down): nothing will be
    read again, so a follower stops instead of retrying."""

    def __init__(self) -> None:
        super().__init__("the store is closed")


@dataclass(frozen=True)
class ReplicaFailure:
    """The endpoint's most recent replica failure. Kept after the failed
    replica is replaced (and pruned from `replicas`), so the record still
    says why it was replaced."""

    replica_id: str
    reason: str
    at: str  # RFC 3339
