"""Bearer key -> `Principal`, cheaply.

The operator key is checked against its digests in memory. A user key is
looked up by its digest once and then served from a cache until something
it depends on changes: the service that revokes a key or changes a
membership drops the affected entries right after its commit (so a revoked
key fails before the revoke call has answered), and a change feed from the
store does the same for changes made by other instances. Malformed keys are
refused without a lookup.

Last-used times are kept in memory and written in batches (`flush_last_used`),
so that a read does not become a database write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from inferd.control.accounts.keys import USER_KEY_PREFIX, is_user_key
from inferd.control.accounts.ports import AccountStore
from inferd.control.accounts.roles import OPERATOR, Principal
from inferd.control.token_format import ENDPOINT_TOKEN_PREFIX, hash_token, is_well_formed
from inferd.errors import Unauthorized

# Above this many cached keys the cache starts over, so that a stream of
# distinct valid keys cannot grow memory without bound.
MAX_CACHED_KEYS = 10_000


class ManagementUnauthorized(Unauthorized):
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="inferd-management"'}


def bearer_key(authorization: str | None) -> str:
    if not authorization:
        raise ManagementUnauthorized(
            "Missing key: send 'Authorization: Bearer <management key>'.",
            code="missing_api_key",
        )
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise ManagementUnauthorized(
            "The Authorization header must be 'Bearer <management key>'.",
            code="invalid_authorization_header",
        )
    return key


class PrincipalResolver:
    def __init__(
        self,
        store: AccountStore,
        is_operator_key: Callable[[str], bool],
    ) -> None:
        self._store = store
        self._is_operator_key = is_operator_key
        self._by_hash: dict[bytes, Principal] = {}
        # Key id -> epoch seconds of its last use (a float: this is per request).
        self._last_used: dict[str, float] = {}

    async def resolve(self, authorization: str | None) -> Principal:
        key = bearer_key(authorization)
        if key.startswith(USER_KEY_PREFIX):
            digest = hash_token(key)
            principal = self._by_hash.get(digest)
            if principal is None:
                # Only a miss checks the format: a malformed key is refused
                # without a lookup, a cached one was checked when it was loaded.
                if not is_user_key(key):
                    raise ManagementUnauthorized("Invalid management key.", code="invalid_api_key")
                principal = await self._load(digest)
            assert principal.key_id is not None
            self._last_used[principal.key_id] = time.time()
            return principal
        if is_well_formed(key, ENDPOINT_TOKEN_PREFIX):
            raise ManagementUnauthorized(
                "An endpoint access token does not open the management API; use a management key.",
                code="wrong_token_kind",
            )
        if self._is_operator_key(key):
            return OPERATOR
        raise ManagementUnauthorized("Invalid management key.", code="invalid_api_key")

    async def _load(self, digest: bytes) -> Principal:
        key = await self._store.key_by_hash(digest)
        if key is None or key.revoked_at is not None:
            raise ManagementUnauthorized(
                "Invalid or revoked management key.", code="invalid_api_key"
            )
        memberships = await self._store.memberships_of(key.user_id)
        principal = Principal(
            id=key.user_id,
            name=key.user_id,
            # A project key carries the role of that one project, no other.
            roles={
                m.project_id: m.role
                for m in memberships
                if key.project_id is None or m.project_id == key.project_id
            },
            key_id=key.id,
            scope=key.project_id,
        )
        if len(self._by_hash) >= MAX_CACHED_KEYS:
            self._by_hash.clear()
        self._by_hash[digest] = principal
        return principal

    # --- invalidation (after a commit, or from the change feed) ---------------------

    def forget_key(self, key_id: str) -> None:
        for digest, p in list(self._by_hash.items()):
            if p.key_id == key_id:
                del self._by_hash[digest]

    def forget_user(self, user_id: str) -> None:
        for digest, p in list(self._by_hash.items()):
            if p.id == user_id:
                del self._by_hash[digest]

    def forget_all(self) -> None:
        self._by_hash.clear()

    async def flush_last_used(self) -> None:
        if self._last_used:
            batch, self._last_used = self._last_used, {}
            await self._store.touch_keys({k: _utc(t) for k, t in batch.items()})

    def pending_last_used(self, key_id: str) -> datetime | None:
        at = self._last_used.get(key_id)
        return None if at is None else _utc(at)


def _utc(epoch: float) -> datetime:
    # Milliseconds, as every store keeps times.
    return datetime.fromtimestamp(round(epoch, 3), UTC)
