"""The control plane's ports: the interfaces its parts meet at.

Stores are async and speak the domain types of `inferd.control.model`;
every adapter (`inferd.control.stores.memory`, `.sqlite`, `.postgres`)
passes the same contract suite (`tests/contract/test_store.py`). Every
write has committed durably when its coroutine returns.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Protocol, runtime_checkable

from inferd.catalog.registered import ModelStore, ProfileStore
from inferd.control.accounts.ports import AccountStore
from inferd.control.batches.ports import BatchStore
from inferd.control.model import (
    Adapter,
    AdapterUsage,
    Change,
    ClientToken,
    Endpoint,
    EndpointChanges,
    ReplicaRecord,
)
from inferd.control.paging import EndpointFilter, Page
from inferd.replica.config import ReplicaSpec

# --- stores ---------------------------------------------------------------------------


class EndpointStore(Protocol):
    async def insert_endpoint(self, endpoint: Endpoint, token_hash: bytes) -> None:
        """The endpoint and its first token, in one transaction.
        Raises `DuplicateName` if another endpoint has its name."""
        ...

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None: ...

    async def list_endpoints(self) -> list[Endpoint]:
        """Every endpoint, oldest first."""
        ...

    async def page_endpoint_ids(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[str]:
        """The ids of up to `limit` endpoints matching `where` whose position
        is past `after` (None: from the start), oldest first, read by keyset
        in the database (see `inferd.control.paging`). Ids, not rows: the
        service holds the rows already (change-fed), and decoding a thousand
        rows costs more than the query."""
        ...

    async def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> Endpoint:
        """Apply `changes`; the endpoint as stored after. `EndpointGone` if absent."""
        ...

    async def mark_deleting(self, endpoint_id: str, at: datetime) -> Endpoint:
        """Start deletion (its token stops working); idempotent. `EndpointGone` if absent."""
        ...

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        """Remove it with its tokens and replicas; False if it was not there."""
        ...


class TokenStore(Protocol):
    async def replace_token(self, endpoint_id: str, token_hash: bytes, at: datetime) -> None:
        """Revoke the active token and store the new one, in one transaction.
        `EndpointGone` if the endpoint is absent or being deleted."""
        ...

    async def active_token_hashes(self) -> dict[str, bytes]:
        """Endpoint id -> digest of its active token (endpoints not being deleted)."""
        ...

    async def active_token_hash(self, endpoint_id: str) -> bytes | None: ...

    # --- client tokens: named tokens beside the owner's (each write logs
    # `ChangeKind.TOKEN` with the endpoint's id) ---

    async def add_client_token(self, token: ClientToken, *, limit: int) -> None:
        """Raises `EndpointGone` (absent or being deleted), `DuplicateClientToken`
        (that name is taken) or `TooManyClientTokens` (it has `limit`)."""
        ...

    async def client_tokens(self, endpoint_id: str | None = None) -> list[ClientToken]:
        """Of one endpoint, or of every endpoint not being deleted, oldest first."""
        ...

    async def delete_client_token(self, endpoint_id: str, name: str) -> bool:
        """False if it was not there."""
        ...

    async def touch_client_tokens(self, last_used: Mapping[tuple[str, str], datetime]) -> None:
        """(endpoint id, name) -> when it was last used; never moved back."""
        ...


class RateLimitStore(Protocol):
    async def exchange_rate_spend(
        self, spent: Mapping[tuple[str, str], tuple[int, int]], now: float
    ) -> dict[tuple[str, str], float]:
        """Client tokens' rate-limit buckets shared by every instance: take
        what this instance admitted per (endpoint id, client) since its last
        exchange (`(admitted, requests per minute)`), refilled to `now`
        (epoch seconds), and return each bucket's level (below zero: debt)."""
        ...


class AdminKeyStore(Protocol):
    async def admin_key_hashes(self) -> list[bytes]:
        """Digests of the admin keys not revoked, oldest first."""
        ...

    async def add_admin_key(
        self, key_hash: bytes, at: datetime, *, revoke_others: bool = False
    ) -> None: ...


class ReplicaStore(Protocol):
    """`term`, on the writes: the leader's fencing term. A store shared by
    several instances (PostgreSQL) checks it in the write's own transaction
    and raises `inferd.control.leader.Deposed` when the term has moved on,
    writing nothing; a single-instance store has no other leader and
    ignores it. None: a write any instance may make (a health report)."""

    async def insert_replica(self, record: ReplicaRecord, *, term: int | None = None) -> None: ...

    async def update_replica(
        self,
        replica_id: str,
        *,
        status: str,
        reason: str | None,
        url: str | None,
        at: datetime,
        unresponsive_since: datetime | None = None,
        term: int | None = None,
    ) -> None:
        """No-op if the replica is not stored. `unresponsive_since`: the
        leader's mark (None: heard lately), which every instance routes by."""
        ...

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        """No-op if the replica is not stored."""
        ...

    async def confirm_term(self, term: int) -> None:
        """Raises `Deposed` when `term` is no longer the leader's: for a
        leader's acts that are not store writes (removing a cluster's
        unrecorded replicas). A single-instance store returns at once."""
        ...

    async def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica, oldest first."""
        ...


class AdapterStore(Protocol):
    """LoRA adapters of endpoints; an endpoint's go with it when it is deleted.
    Every write logs `ChangeKind.ADAPTER` with the endpoint's id."""

    async def add_adapter(self, adapter: Adapter) -> None:
        """Raises `DuplicateAdapter` when the endpoint has one of that name,
        `EndpointGone` when the endpoint is absent or being deleted."""
        ...

    async def list_adapters(self, endpoint_id: str | None = None) -> list[Adapter]:
        """The adapters of one endpoint (None: of every endpoint), oldest first."""
        ...

    async def delete_adapter(self, endpoint_id: str, name: str) -> bool:
        """False if it was not there."""
        ...

    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None:
        """Add each row to the stored hourly sum of its endpoint, adapter and
        hour (several instances' figures add up). Usage outlives an adapter
        and its endpoint, as the endpoint's own usage does."""
        ...

    async def adapter_usage(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        """The hourly rows of one adapter of an endpoint, oldest first."""
        ...


class ChangeFeed(Protocol):
    def changes(self) -> AsyncIterator[Change]:
        """Changes committed by anyone (this process or another one) from the
        moment of this call: subscribe first, then load, and no change is
        missed. Delivery is at least once; a `ChangeKind.RESYNC` means some
        may have been lost (reload everything). Ends when the store closes."""
        ...


# --- registered models and measured profiles -------------------------------------------
# Defined beside their records in `inferd.catalog.registered` (ModelStore:
# add/get/list/delete a RegisteredModel; ProfileStore: put/list a
# MeasuredProfile); every store below implements them. Accounts' ports
# (AccountStore) live in `inferd.control.accounts.ports`.


@runtime_checkable
class Store(
    EndpointStore,
    TokenStore,
    RateLimitStore,
    AdminKeyStore,
    ReplicaStore,
    AdapterStore,
    ModelStore,
    ProfileStore,
    AccountStore,
    BatchStore,
    ChangeFeed,
    Protocol,
):
    """Everything the control plane keeps, in one database."""

    def describe(self) -> str:
        """Where the state lives, for people (no password)."""
        ...

    async def schema_version(self) -> int: ...

    async def close(self) -> None: ...


# --- end of the store ports ---------------------------------------------------------


# --- launching and scaling replicas ---------------------------------------------------
#
# The reconciler is the only caller of `Launcher` and `Placer`; the gateway and
# the endpoint service call `ScaleSignals`; the reconciler reads
# `LoadObservations`. Types a launcher shares with the replica (`ReplicaSpec`,
# `config_for`, `to_argv`) live in `inferd.replica.config`.


@dataclass(frozen=True)
class ReplicaHandle:
    """A launched replica as its launcher knows it, opaque to everyone else.

    `node` names where it runs (for people and for `adopt`); `placement` is the
    launcher's own data (the local launcher: process id and GPU indices; a
    cluster launcher: actor and placement group), persisted as is with the
    replica record so that a restarted control plane can `adopt` it.
    """

    replica_id: str
    node: str
    placement: Mapping[str, str] = field(default_factory=dict)


class ExitReason(str, Enum):
    EXITED = "exited"  # ended by itself (crash, failed load, orphaned)
    STOPPED = "stopped"  # after `stop`: drained and ended within its grace period
    KILLED = "killed"  # `kill`, or a stop past its grace period
    LOST = "lost"  # no longer found (its node went away, an adopted one vanished)


@dataclass(frozen=True)
class ReplicaExit:
    """A replica whose process (actor, ...) has ended: its GPUs are free again."""

    replica_id: str
    reason: ExitReason
    returncode: int | None = None  # None where unknown (adopted, lost)
    detail: str = ""  # the end of its log, for the failure reason


@dataclass(frozen=True)
class PlacementKey:
    location: str
    gpu_type: str  # "cpu": replica slots rather than GPUs


@dataclass(frozen=True)
class Capacity:
    """Free and total placement units per location and GPU type."""

    free: Mapping[PlacementKey, int] = field(default_factory=dict)
    total: Mapping[PlacementKey, int] = field(default_factory=dict)


class Placer(Protocol):
    async def capacity(self) -> Capacity: ...

    async def cannot_place(self, location: str, gpu_type: str, gpu_count: int) -> str | None:
        """None when a replica of this shape can start now, else why not (for
        people: it becomes the endpoint's `statusReason`)."""
        ...


class Launcher(Placer, Protocol):
    """Starts, stops and watches replicas somewhere. Knows processes and
    GPUs, not replica status (the registry has that, from the replicas)."""

    async def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        """Start it; returns once it is started (not ready). Raises on refusal
        (no capacity left, the machine refused); nothing is left running then."""
        ...

    async def stop(self, handle: ReplicaHandle, grace_s: float) -> None:
        """Ask it to drain and exit; kill it after `grace_s` seconds. Returns
        at once; its end comes through `exits()`. Idempotent."""
        ...

    async def kill(self, handle: ReplicaHandle) -> None:
        """End it now, with everything it started. Idempotent."""
        ...

    def exits(self) -> AsyncIterator[ReplicaExit]:
        """Every replica end, each once, as it happens (for launched and adopted
        replicas alike). One consumer; ends after `shutdown`."""
        ...

    async def adopt(self, handle: ReplicaHandle) -> bool:
        """After a control-plane restart: take over a replica still running
        (True: it is watched as if launched here), or say it is gone (False)."""
        ...

    async def shutdown(self, grace_s: float) -> None:
        """Stop every replica (drain, then kill past `grace_s`) and wait for
        them to end."""
        ...

    async def log_tail(self, replica_id: str, max_bytes: int) -> str | None:
        """The end of the replica's log (at most `max_bytes`), read where it
        runs; None when there is none (never written, or gone with its node)."""
        ...


class ScaleSignals(Protocol):
    """What should make the reconciler act now rather than at its next tick.
    Implemented by the reconciler; called by the gateway and the service.
    Cheap and synchronous: a signal only wakes the reconciler."""

    def capacity_wanted(self, endpoint_id: str) -> None:
        """A request waits and no replica is ready: scale up now."""
        ...

    def endpoint_changed(self, endpoint_id: str) -> None:
        """The endpoint was created, changed or is being deleted."""
        ...


@dataclass(frozen=True)
class LoadSample:
    """One source's view of one endpoint's load (a gateway instance's traffic).
    Times are the reconciler's clock (a remote publisher converts)."""

    source: str  # which gateway instance
    endpoint_id: str
    in_flight: int
    held: int
    in_flight_by_replica: Mapping[str, int]
    last_request_at: float | None
    at: float  # when it was taken


@dataclass(frozen=True)
class EndpointLoad:
    """An endpoint's load merged over every source: all gateways, and the
    replicas' own reports (which see requests from every gateway)."""

    endpoint_id: str
    in_flight: int
    held: int
    in_flight_by_replica: Mapping[str, int]
    last_request_at: float | None


class LoadObservations(Protocol):
    def load(self, endpoint_id: str) -> EndpointLoad: ...

    def forget(self, endpoint_id: str) -> None:
        """The endpoint is gone: drop what is known about it."""
        ...


class RequestAborter(Protocol):
    """The gateway's side of a replica's end: requests it has in flight there
    fail now (an SSE error or a retry) instead of waiting for a timeout."""

    def abort_replica(self, replica_id: str, reason: str) -> int: ...

    def forget_endpoint(self, endpoint_id: str) -> None: ...


# --- end of the launch ports ----------------------------------------------------------
