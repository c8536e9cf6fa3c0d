"""Endpoint access tokens: verification from memory, kept fresh from the
store's change feed. The format (prefixes, checksum, digest) lives in
`inferd.control.token_format` and is re-exported here for its callers."""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind, ClientToken
from inferd.control.ports import TokenStore
from inferd.control.token_format import (
    ADMIN_KEY_PREFIX,
    BODY_LEN,
    CHECKSUM_LEN,
    ENDPOINT_TOKEN_PREFIX,
    client_token_hint,
    digest_matches,
    hash_token,
    is_well_formed,
    new_admin_key,
    new_endpoint_token,
)
from inferd.gateway.auth import OWNER_CALLER, Caller

__all__ = [
    "ADMIN_KEY_PREFIX",
    "BODY_LEN",
    "CHECKSUM_LEN",
    "ENDPOINT_TOKEN_PREFIX",
    "TokenVerifier",
    "caller_of",
    "client_token_hint",
    "digest_matches",
    "hash_token",
    "is_well_formed",
    "new_admin_key",
    "new_endpoint_token",
]


def caller_of(token: ClientToken) -> Caller:
    return Caller(token.name, token.weight, token.requests_per_minute)


class TokenVerifier:
    """Answers "does this token open this endpoint, and whose is it?" from memory.

    Loaded from the store at start (`load`). The service that writes tokens
    in this process updates it right after each commit (`set_active`,
    `forget`, `set_clients`), so a re-issued or deleted endpoint's old token
    or a revoked client token fails before the HTTP answer is sent;
    `follow` applies every other writer's changes from the store's change
    feed (one `ChangeKind.TOKEN` per endpoint covers its owner token and its
    client tokens). An endpoint id that is not cached has no active token here:
    `identify` never reaches the store; the gateway may `refresh` one id it
    does not know (see `inferd.control.endpoints.catch_up`).
    """

    def __init__(self, source: TokenStore, wall: Callable[[], float] = time.time) -> None:
        self._source = source
        self._wall = wall
        self._active: dict[str, bytes] = {}
        # Endpoint id -> digest of a client token -> whose it is. Each inner
        # mapping is replaced, never changed.
        self._clients: dict[str, Mapping[bytes, Caller]] = {}
        # Bumped by each local update: a digest read from the store before
        # one must not overwrite it (that read may predate the commit).
        self._local: dict[str, int] = {}
        # (endpoint id, client token name) -> epoch seconds of its last use,
        # written to the store in batches (`flush_last_used`).
        self._last_used: dict[tuple[str, str], float] = {}

    async def load(self) -> None:
        local = dict(self._local)
        loaded = await self._source.active_token_hashes()
        clients = _by_endpoint(await self._source.client_tokens())
        for endpoint_id, count in self._local.items():
            if local.get(endpoint_id) != count:  # updated locally meanwhile: keep that
                if endpoint_id in self._active:
                    loaded[endpoint_id] = self._active[endpoint_id]
                else:
                    loaded.pop(endpoint_id, None)
                if endpoint_id in self._clients:
                    clients[endpoint_id] = self._clients[endpoint_id]
                else:
                    clients.pop(endpoint_id, None)
        self._active = loaded
        self._clients = clients

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Keep the cache fresh from `feed` (subscribed before `load`)."""
        await follow(feed, self._apply, self.load, what="token cache")

    async def _apply(self, change: Change) -> None:
        if change.kind is not ChangeKind.TOKEN:
            return
        endpoint_id = change.id
        before = self._local.get(endpoint_id, 0)
        digest = await self._source.active_token_hash(endpoint_id)
        clients = await self._source.client_tokens(endpoint_id)
        if self._local.get(endpoint_id, 0) != before:
            return
        if digest is None:
            self._active.pop(endpoint_id, None)
        else:
            self._active[endpoint_id] = digest
        self._store_clients(endpoint_id, clients)

    async def refresh(self, endpoint_id: str) -> None:
        """Read this endpoint's tokens from the store now, as its next change
        from the feed would."""
        await self._apply(Change(ChangeKind.TOKEN, endpoint_id))

    def set_active(self, endpoint_id: str, digest: bytes) -> None:
        self._local[endpoint_id] = self._local.get(endpoint_id, 0) + 1
        self._active[endpoint_id] = digest

    def set_clients(self, endpoint_id: str, tokens: Iterable[ClientToken]) -> None:
        """The endpoint's client tokens as just committed by this process."""
        self._local[endpoint_id] = self._local.get(endpoint_id, 0) + 1
        self._store_clients(endpoint_id, tokens)

    def _store_clients(self, endpoint_id: str, tokens: Iterable[ClientToken]) -> None:
        mapping = {t.token_hash: caller_of(t) for t in tokens}
        if mapping:
            self._clients[endpoint_id] = MappingProxyType(mapping)
        else:
            self._clients.pop(endpoint_id, None)

    def forget(self, endpoint_id: str) -> None:
        self._local[endpoint_id] = self._local.get(endpoint_id, 0) + 1
        self._active.pop(endpoint_id, None)
        self._clients.pop(endpoint_id, None)

    def identify(self, endpoint_id: str, token: str) -> Caller | None:
        """Whose token this is on this endpoint (the owner's: `OWNER_CALLER`),
        or None when it opens nothing here. Every miss costs one hash and one
        comparison, as a hit does."""
        if not is_well_formed(token, ENDPOINT_TOKEN_PREFIX):
            return None
        digest = hash_token(token)
        owner = self._active.get(endpoint_id)
        # Compared even when absent, so a valid-looking token for an unknown
        # endpoint takes the same time as a wrong one for a known endpoint.
        if hmac.compare_digest(digest, owner if owner is not None else bytes(32)):
            return OWNER_CALLER if owner is not None else None
        clients = self._clients.get(endpoint_id)
        # A dict lookup by the digest: it tells nothing of the token itself.
        caller = clients.get(digest) if clients is not None else None
        if caller is not None:
            self._last_used[(endpoint_id, caller.client)] = self._wall()
        return caller

    def named(self, endpoint_id: str, client: str) -> Caller | None:
        """Work created with a token of this endpoint (a batch) runs as its
        client: that client's share and rate limit as they are now, or None
        once its token was revoked. The owner's work stays the owner's (a
        new owner token replaces the old one; the endpoint's deletion ends
        its batches)."""
        if client == OWNER_CALLER.client:
            return OWNER_CALLER
        clients = self._clients.get(endpoint_id) or {}
        return next((c for c in clients.values() if c.client == client), None)

    def verify(self, endpoint_id: str, token: str) -> bool:
        return self.identify(endpoint_id, token) is not None

    def client_count(self, endpoint_id: str) -> int:
        clients = self._clients.get(endpoint_id)
        return 0 if clients is None else len(clients)

    # --- last use of client tokens ----------------------------------------------------

    def pending_last_used(self, endpoint_id: str, name: str) -> datetime | None:
        at = self._last_used.get((endpoint_id, name))
        return None if at is None else _utc(at)

    async def flush_last_used(self) -> None:
        if self._last_used:
            batch, self._last_used = self._last_used, {}
            await self._source.touch_client_tokens({k: _utc(t) for k, t in batch.items()})

    def __len__(self) -> int:
        return len(self._active)


def _by_endpoint(tokens: Iterable[ClientToken]) -> dict[str, Mapping[bytes, Caller]]:
    grouped: dict[str, dict[bytes, Caller]] = {}
    for token in tokens:
        grouped.setdefault(token.endpoint_id, {})[token.token_hash] = caller_of(token)
    return {k: MappingProxyType(v) for k, v in grouped.items()}


def _utc(epoch: float) -> datetime:
    # Milliseconds, as every store keeps times.
    return datetime.fromtimestamp(round(epoch, 3), UTC)
