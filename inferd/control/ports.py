"""The control plane's ports: the interfaces its parts meet at.

Stores are async and speak the domain types of `inferd.control.model`;
every adapter (`inferd.control.stores.memory`, `.sqlite`, `.postgres`)
passes the same contract suite (`tests/contract/test_store.py`). Every
write has committed durably when its coroutine returns.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Protocol, runtime_checkable

from inferd.control.model import Change, Endpoint, EndpointChanges, ReplicaRecord

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


class AdminKeyStore(Protocol):
    async def admin_key_hashes(self) -> list[bytes]:
        """Digests of the admin keys not revoked, oldest first."""
        ...

    async def add_admin_key(
        self, key_hash: bytes, at: datetime, *, revoke_others: bool = False
    ) -> None: ...


class ReplicaStore(Protocol):
    async def insert_replica(self, record: ReplicaRecord) -> None: ...

    async def update_replica(
        self, replica_id: str, *, status: str, reason: str | None, url: str | None, at: datetime
    ) -> None:
        """No-op if the replica is not stored."""
        ...

    async def delete_replica(self, replica_id: str) -> None:
        """No-op if the replica is not stored."""
        ...

    async def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica, oldest first."""
        ...


class ChangeFeed(Protocol):
    def changes(self) -> AsyncIterator[Change]:
        """Changes committed by anyone (this process or another one) from the
        moment of this call: subscribe first, then load, and no change is
        missed. Delivery is at least once; a `ChangeKind.RESYNC` means some
        may have been lost (reload everything). Ends when the store closes."""
        ...


@runtime_checkable
class Store(EndpointStore, TokenStore, AdminKeyStore, ReplicaStore, ChangeFeed, Protocol):
    """Everything the control plane keeps, in one database."""

    def describe(self) -> str:
        """Where the state lives, for people (no password)."""
        ...

    async def schema_version(self) -> int: ...

    async def close(self) -> None: ...


# --- end of the store ports ---------------------------------------------------------
