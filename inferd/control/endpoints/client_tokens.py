"""Named client tokens of an endpoint, beside its owner's token.

Each is shown once, when created; only its SHA-256 digest and a hint (its
prefix and last 4 characters) are stored. Creating or revoking one updates
this instance's token cache right after the commit, before the answer, and
every other instance's from the store's change feed (`ChangeKind.TOKEN`, as
a re-issued owner token): a revoked token fails everywhere at once. The
owner's token is untouched by all of this (the contract's "Request Access
Token" still issues a new one and revokes the old).

Each operation takes the principal: listing is a read of the endpoint,
creating and revoking are writes (as re-issuing the owner's token is), and
both are audited here.

A token carries a weight (its share of the endpoint at capacity, see
`inferd.gateway.fairness`) and an optional rate limit (`inferd.gateway.ratelimit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from inferd.api.management import CreateClientTokenRequest
from inferd.control.accounts.model import AuditAction
from inferd.control.accounts.roles import Action, Principal
from inferd.control.endpoints.adapters import Audit
from inferd.control.endpoints.checks import not_found
from inferd.control.endpoints.tokens import (
    TokenVerifier,
    client_token_hint,
    hash_token,
    new_endpoint_token,
)
from inferd.control.model import (
    ClientToken,
    DuplicateClientToken,
    Endpoint,
    EndpointGone,
    TooManyClientTokens,
    rfc3339,
    utc_now,
)
from inferd.control.ports import TokenStore
from inferd.errors import BadRequest, Conflict, NotFound

logger = logging.getLogger(__name__)

# Client tokens one endpoint may have: each is a metrics label value and a
# counter of the fair share, so the number is kept well bounded.
MAX_CLIENT_TOKENS_PER_ENDPOINT = 100
# The metrics' name for the endpoint owner's token.
RESERVED_NAMES = frozenset({"owner"})


class EndpointRows(Protocol):
    def find(self, endpoint_id: str) -> Endpoint | None: ...

    def endpoint(self, principal: Principal, endpoint_id: str, action: Action) -> Endpoint:
        """The endpoint, if `principal` may do `action` on it (404, 403)."""
        ...


def client_token_record(token: ClientToken, last_used: datetime | None = None) -> dict[str, Any]:
    used = token.last_used_at
    if last_used is not None and (used is None or last_used > used):
        used = last_used
    return {
        "name": token.name,
        "hint": token.hint,
        "weight": token.weight,
        "requestsPerMinute": token.requests_per_minute,
        "createdAt": rfc3339(token.created_at),
        "lastUsedAt": rfc3339(used) if used else None,
    }


class ClientTokenService:
    def __init__(
        self,
        store: TokenStore,
        endpoints: EndpointRows,
        verifier: TokenVerifier,
        audit: Audit,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._store = store
        self._endpoints = endpoints
        self._verifier = verifier
        self._audit = audit
        self._clock = clock

    async def create(
        self, principal: Principal, endpoint_id: str, req: CreateClientTokenRequest
    ) -> tuple[ClientToken, str]:
        """The token as stored and the token itself (shown once)."""
        self._endpoints.endpoint(principal, endpoint_id, Action.WRITE)
        if req.name in RESERVED_NAMES:
            raise BadRequest(
                f"'{req.name}' names the endpoint's own token; choose another name.",
                param="name",
                code="invalid_value",
            )
        self._writable(endpoint_id)
        token = new_endpoint_token()
        record = ClientToken(
            endpoint_id=endpoint_id,
            name=req.name,
            token_hash=hash_token(token),
            hint=client_token_hint(token),
            created_at=self._clock(),
            weight=req.weight,
            requests_per_minute=req.requestsPerMinute,
        )
        try:
            await self._store.add_client_token(record, limit=MAX_CLIENT_TOKENS_PER_ENDPOINT)
        except EndpointGone:
            raise not_found(endpoint_id) from None
        except DuplicateClientToken:
            raise Conflict(
                f"Endpoint '{endpoint_id}' has a client token named '{req.name}' already; "
                "revoke it first or choose another name.",
                param="name",
                code="client_token_exists",
            ) from None
        except TooManyClientTokens:
            raise Conflict(
                f"Endpoint '{endpoint_id}' has {MAX_CLIENT_TOKENS_PER_ENDPOINT} client tokens, "
                "as many as it may; revoke one first.",
                code="too_many_client_tokens",
            ) from None
        await self._refresh(endpoint_id)
        logger.info("created client token %r of endpoint %s", req.name, endpoint_id)
        await self._audited(principal, AuditAction.CLIENT_TOKEN_CREATE, endpoint_id, req.name)
        return record, token

    async def list(self, principal: Principal, endpoint_id: str) -> list[dict[str, Any]]:
        self._endpoints.endpoint(principal, endpoint_id, Action.READ)
        tokens = await self._store.client_tokens(endpoint_id)
        return [
            client_token_record(t, self._verifier.pending_last_used(endpoint_id, t.name))
            for t in tokens
        ]

    async def get(self, principal: Principal, endpoint_id: str, name: str) -> dict[str, Any]:
        for token in await self.list(principal, endpoint_id):
            if token["name"] == name:
                return token
        raise _no_token(endpoint_id, name)

    async def revoke(self, principal: Principal, endpoint_id: str, name: str) -> None:
        self._endpoints.endpoint(principal, endpoint_id, Action.WRITE)
        if not await self._store.delete_client_token(endpoint_id, name):
            raise _no_token(endpoint_id, name)
        # After the commit and before the answer: it fails here from now on.
        await self._refresh(endpoint_id)
        logger.info("revoked client token %r of endpoint %s", name, endpoint_id)
        await self._audited(principal, AuditAction.CLIENT_TOKEN_REVOKE, endpoint_id, name)

    async def _audited(
        self, principal: Principal, action: AuditAction, endpoint_id: str, name: str
    ) -> None:
        # The row as it is now: an endpoint deleted meanwhile has no project to audit in.
        row = self._endpoints.find(endpoint_id)
        if row is not None:
            await self._audit.audit_event(
                principal, action, row.project_id, f"endpoint:{endpoint_id}", token=name
            )

    async def _refresh(self, endpoint_id: str) -> None:
        self._verifier.set_clients(endpoint_id, await self._store.client_tokens(endpoint_id))

    def _writable(self, endpoint_id: str) -> Endpoint:
        row = self._endpoints.find(endpoint_id)
        if row is None:
            raise not_found(endpoint_id)
        if row.deleting_at is not None:
            raise Conflict(
                f"Endpoint '{endpoint_id}' is being deleted.", param="id", code="endpoint_deleting"
            )
        return row


def _no_token(endpoint_id: str, name: str) -> NotFound:
    return NotFound(
        f"Endpoint '{endpoint_id}' has no client token named '{name}'.",
        param="name",
        code="client_token_not_found",
    )
