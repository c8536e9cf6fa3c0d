"""In-memory store: the ports' reference behaviour, for unit tests.

Holds the same rules as the databases (unique names, one active token per
endpoint, cascades on delete) so that code tested against it behaves the
same on SQLite and PostgreSQL; the contract suite holds all three to it.
Nothing survives the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from datetime import datetime

from inferd.catalog.registered import DuplicateModel, MeasuredProfile, RegisteredModel
from inferd.control.accounts.memory import MemoryAccountStore
from inferd.control.accounts.quota import EndpointShape
from inferd.control.model import (
    Adapter,
    AdapterUsage,
    Change,
    ChangeKind,
    DuplicateAdapter,
    DuplicateName,
    Endpoint,
    EndpointChanges,
    EndpointGone,
    ReplicaRecord,
    StoreUnavailable,
)
from inferd.control.paging import EndpointFilter, Page, page_of
from inferd.control.stores.feed import ChangeHub


@dataclass
class _Token:
    endpoint_id: str
    token_hash: bytes
    revoked: bool = False


class MemoryStore(MemoryAccountStore):
    def __init__(self) -> None:
        MemoryAccountStore.__init__(self)
        self._endpoints: dict[str, Endpoint] = {}
        # Each endpoint's list position: a counter never reused, as a
        # database's row sequence.
        self._positions: dict[str, int] = {}
        self._next_position = 1
        self._tokens: list[_Token] = []
        self._admin_keys: list[tuple[bytes, bool]] = []
        self._replicas: dict[str, ReplicaRecord] = {}
        self._models: dict[str, RegisteredModel] = {}
        self._adapters: dict[tuple[str, str], Adapter] = {}
        self._adapter_usage: dict[tuple[str, str, datetime], AdapterUsage] = {}
        self._profiles: dict[tuple[str, str, int], MeasuredProfile] = {}
        self._hub = ChangeHub()
        self._quota_lock = asyncio.Lock()
        # Set by a test to act as a database that went away: every call
        # raises `StoreUnavailable` until it is cleared.
        self.unavailable = False

    def describe(self) -> str:
        return "memory (nothing is kept after exit)"

    async def schema_version(self) -> int:
        return 0

    async def close(self) -> None:
        self._hub.close()

    def changes(self) -> AsyncIterator[Change]:
        return self._hub.subscribe()

    def _check(self) -> None:
        if self.unavailable:
            raise StoreUnavailable("memory store marked unavailable")

    def _account_changed(self, key: str) -> None:
        self._changed(ChangeKind.ACCOUNT, key)

    def _changed(self, kind: ChangeKind, key: str = "") -> None:
        self._hub.publish(Change(kind, key))

    # --- endpoints ----------------------------------------------------------------

    async def insert_endpoint(self, endpoint: Endpoint, token_hash: bytes) -> None:
        self._check()
        if any(
            (e.project_id, e.name) == (endpoint.project_id, endpoint.name)
            for e in self._endpoints.values()
        ):
            raise DuplicateName(endpoint.name)
        if endpoint.id in self._endpoints:
            raise ValueError(f"endpoint {endpoint.id} exists")
        self._endpoints[endpoint.id] = endpoint
        self._positions[endpoint.id] = self._next_position
        self._next_position += 1
        self._tokens.append(_Token(endpoint.id, token_hash))
        self._changed(ChangeKind.ENDPOINT, endpoint.id)
        self._changed(ChangeKind.TOKEN, endpoint.id)

    async def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        self._check()
        return self._endpoints.get(endpoint_id)

    async def list_endpoints(self) -> list[Endpoint]:
        self._check()
        return list(self._endpoints.values())

    async def page_endpoint_ids(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[str]:
        self._check()
        rows: list[tuple[int, str]] = []
        for endpoint in self._endpoints.values():  # insertion order: by position
            position = self._positions[endpoint.id]
            if (after is None or position > after) and where.matches(endpoint):
                rows.append((position, endpoint.id))
                if len(rows) > limit:
                    break
        return page_of(rows, limit)

    def quota_lock(self, project_id: str) -> AbstractAsyncContextManager[None]:
        # One process: a lock of this store's suffices.
        return self._quota_lock

    async def count_endpoints(self, project_id: str) -> int:
        self._check()
        return sum(1 for e in self._endpoints.values() if e.project_id == project_id)

    async def quota_shapes(self, project_id: str) -> list[EndpointShape]:
        self._check()
        return [
            EndpointShape(e.id, e.gpu_type, e.gpu_count, e.min_replicas)
            for e in self._endpoints.values()
            if e.project_id == project_id and e.deleting_at is None
        ]

    async def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> Endpoint:
        self._check()
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            raise EndpointGone(endpoint_id)
        endpoint = changes.apply(endpoint)
        self._endpoints[endpoint_id] = endpoint
        self._changed(ChangeKind.ENDPOINT, endpoint_id)
        return endpoint

    async def mark_deleting(self, endpoint_id: str, at: datetime) -> Endpoint:
        self._check()
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            raise EndpointGone(endpoint_id)
        endpoint = replace(endpoint, deleting_at=endpoint.deleting_at or at, updated_at=at)
        self._endpoints[endpoint_id] = endpoint
        self._changed(ChangeKind.ENDPOINT, endpoint_id)
        self._changed(ChangeKind.TOKEN, endpoint_id)
        return endpoint

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        self._check()
        self._positions.pop(endpoint_id, None)
        if self._endpoints.pop(endpoint_id, None) is None:
            return False
        self._tokens = [t for t in self._tokens if t.endpoint_id != endpoint_id]
        for key in [k for k in self._adapters if k[0] == endpoint_id]:
            del self._adapters[key]
        for replica_id in [r.id for r in self._replicas.values() if r.endpoint_id == endpoint_id]:
            del self._replicas[replica_id]
            self._changed(ChangeKind.REPLICA, replica_id)
        self._changed(ChangeKind.ENDPOINT, endpoint_id)
        self._changed(ChangeKind.TOKEN, endpoint_id)
        return True

    # --- tokens -------------------------------------------------------------------

    async def replace_token(self, endpoint_id: str, token_hash: bytes, at: datetime) -> None:
        self._check()
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None or endpoint.deleting_at is not None:
            raise EndpointGone(endpoint_id)
        if any(t.token_hash == token_hash for t in self._tokens):
            raise ValueError("token digest already stored")
        for token in self._tokens:
            if token.endpoint_id == endpoint_id:
                token.revoked = True
        self._tokens.append(_Token(endpoint_id, token_hash))
        self._changed(ChangeKind.TOKEN, endpoint_id)

    async def active_token_hashes(self) -> dict[str, bytes]:
        self._check()
        return {
            t.endpoint_id: t.token_hash
            for t in self._tokens
            if not t.revoked and self._endpoints[t.endpoint_id].deleting_at is None
        }

    async def active_token_hash(self, endpoint_id: str) -> bytes | None:
        return (await self.active_token_hashes()).get(endpoint_id)

    # --- admin keys ---------------------------------------------------------------

    async def admin_key_hashes(self) -> list[bytes]:
        self._check()
        return [digest for digest, revoked in self._admin_keys if not revoked]

    async def add_admin_key(
        self, key_hash: bytes, at: datetime, *, revoke_others: bool = False
    ) -> None:
        self._check()
        if revoke_others:
            self._admin_keys = [(digest, True) for digest, _ in self._admin_keys]
        self._admin_keys.append((key_hash, False))
        self._changed(ChangeKind.ADMIN_KEY)

    # --- LoRA adapters ----------------------------------------------------------------

    async def add_adapter(self, adapter: Adapter) -> None:
        self._check()
        endpoint = self._endpoints.get(adapter.endpoint_id)
        if endpoint is None or endpoint.deleting_at is not None:
            raise EndpointGone(adapter.endpoint_id)
        key = (adapter.endpoint_id, adapter.name)
        if key in self._adapters:
            raise DuplicateAdapter(adapter.name)
        self._adapters[key] = adapter
        self._changed(ChangeKind.ADAPTER, adapter.endpoint_id)

    async def list_adapters(self, endpoint_id: str | None = None) -> list[Adapter]:
        self._check()
        return [a for a in self._adapters.values() if endpoint_id in (None, a.endpoint_id)]

    async def delete_adapter(self, endpoint_id: str, name: str) -> bool:
        self._check()
        if self._adapters.pop((endpoint_id, name), None) is None:
            return False
        self._changed(ChangeKind.ADAPTER, endpoint_id)
        return True

    async def add_adapter_usage(self, rows: Sequence[AdapterUsage]) -> None:
        self._check()
        for row in rows:
            stored = self._adapter_usage.get(row.key())
            self._adapter_usage[row.key()] = row if stored is None else stored.plus(row)

    async def adapter_usage(self, endpoint_id: str, adapter: str) -> list[AdapterUsage]:
        self._check()
        return sorted(
            (u for u in self._adapter_usage.values()
             if (u.endpoint_id, u.adapter) == (endpoint_id, adapter)),
            key=lambda u: u.hour,
        )  # fmt: skip

    # --- registered models and measured profiles -------------------------------------

    async def add_model(self, model: RegisteredModel) -> None:
        self._check()
        if model.name in self._models:
            raise DuplicateModel(model.name)
        self._models[model.name] = model
        self._changed(ChangeKind.MODEL, model.name)

    async def get_model(self, name: str) -> RegisteredModel | None:
        self._check()
        return self._models.get(name)

    async def list_models(self) -> list[RegisteredModel]:
        self._check()
        return list(self._models.values())

    async def delete_model(self, name: str) -> bool:
        self._check()
        gone = self._models.pop(name, None) is not None
        if gone:
            self._changed(ChangeKind.MODEL, name)
        return gone

    async def put_profile(self, profile: MeasuredProfile) -> None:
        self._check()
        self._profiles[profile.key] = profile
        self._changed(ChangeKind.MODEL, "")

    async def list_profiles(self) -> list[MeasuredProfile]:
        self._check()
        return list(self._profiles.values())

    # --- replicas -----------------------------------------------------------------

    # `term` is ignored: one instance, so no other leader to fence out.
    async def insert_replica(self, record: ReplicaRecord, *, term: int | None = None) -> None:
        self._check()
        if record.endpoint_id not in self._endpoints:
            raise EndpointGone(record.endpoint_id)
        if record.id in self._replicas:
            raise ValueError(f"replica {record.id} exists")
        self._replicas[record.id] = replace(record, placement=dict(record.placement))
        self._changed(ChangeKind.REPLICA, record.id)

    async def update_replica(
        self,
        replica_id: str,
        *,
        status: str,
        reason: str | None,
        url: str | None,
        at: datetime,
        term: int | None = None,
    ) -> None:
        self._check()
        record = self._replicas.get(replica_id)
        if record is None:
            return
        self._replicas[replica_id] = replace(
            record, status=status, reason=reason, url=url, updated_at=at
        )
        self._changed(ChangeKind.REPLICA, replica_id)

    async def delete_replica(self, replica_id: str, *, term: int | None = None) -> None:
        self._check()
        if self._replicas.pop(replica_id, None) is not None:
            self._changed(ChangeKind.REPLICA, replica_id)

    async def confirm_term(self, term: int) -> None:
        return None  # one instance: no other leader

    async def list_replicas(self) -> list[ReplicaRecord]:
        self._check()
        return list(self._replicas.values())
