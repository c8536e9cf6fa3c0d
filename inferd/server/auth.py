"""The operator key of the management API: provisioning at start, and the
check `inferd.control.accounts.principals` makes of a key that is not a
user's (the per-request middleware is `inferd.server.access.ResolvePrincipal`).

The key is either supplied by the operator (`--admin-key`, `INFERD_ADMIN_KEY`,
config file) and then never stored by inferd, or generated on first start,
printed once by `inferd serve`, and stored only as its SHA-256 digest (see
`inferd.control.endpoints.tokens` for why a fast hash is right for random keys).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from inferd.control.endpoints.tokens import (
    hash_token,
    new_admin_key,
)
from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind, utc_now
from inferd.control.ports import AdminKeyStore

MIN_OPERATOR_KEY_LEN = 16


class AdminKeyError(ValueError):
    """The operator's admin key is unusable (too short)."""


@dataclass(frozen=True)
class AdminProvisioning:
    auth: AdminAuth
    # The plaintext of a key generated just now: print it once, then drop it.
    generated_key: str | None


class AdminAuth:
    def __init__(self, digests: Sequence[bytes], store: AdminKeyStore | None = None) -> None:
        """`store`: where the keys come from (generated keys), to follow a
        rotation made by another control plane on the same database; None
        for an operator key, which no database changes."""
        self._digests = tuple(digests)
        self._store = store

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        if self._store is None:
            return
        await follow(feed, self._apply, self._reload, what="admin keys")

    async def _apply(self, change: Change) -> None:
        if change.kind is ChangeKind.ADMIN_KEY:
            await self._reload()

    async def _reload(self) -> None:
        if self._store is not None:
            self._digests = tuple(await self._store.admin_key_hashes())

    def is_valid(self, key: str) -> bool:
        digest = hash_token(key)
        ok = False
        # Compare against every key, without stopping at the first match.
        for known in self._digests:
            ok |= hmac.compare_digest(digest, known)
        return ok


async def provision_admin_key(
    store: AdminKeyStore, operator_key: str | None, *, rotate: bool = False
) -> AdminProvisioning:
    """Decide which admin keys open the API in this run.

    An operator key replaces the stored ones for as long as it is configured.
    Otherwise the stored (generated) keys are used, and one is generated when
    there is none yet or when `rotate` asks for a new one (revoking the old).
    """
    if operator_key is not None:
        if len(operator_key) < MIN_OPERATOR_KEY_LEN:
            raise AdminKeyError(f"the admin key must be at least {MIN_OPERATOR_KEY_LEN} characters")
        return AdminProvisioning(AdminAuth([hash_token(operator_key)]), None)
    stored = await store.admin_key_hashes()
    if stored and not rotate:
        return AdminProvisioning(AdminAuth(stored, store), None)
    key = new_admin_key()
    await store.add_admin_key(hash_token(key), utc_now(), revoke_others=rotate)
    return AdminProvisioning(AdminAuth(await store.admin_key_hashes(), store), key)
