"""Bearer tokens on the inference path.

Every way of not holding this endpoint's token (none, not a bearer, a wrong
one, another endpoint's, an id that does not exist) gets the same 401, so a
caller without a token learns nothing about which endpoints exist. The token
itself is never logged or echoed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inferd.errors import Unauthorized
from inferd.gateway.fairness import OWNER

# Far above a real token; longer headers are refused without hashing.
_MAX_TOKEN_BYTES = 512
UNAUTHORIZED_MESSAGE = (
    "Missing or invalid access token for this endpoint. Send 'Authorization: Bearer "
    "<ACCESS_TOKEN>' with the token of this endpoint."
)
WWW_AUTHENTICATE = (b"www-authenticate", b"Bearer")


@dataclass(frozen=True)
class Caller:
    """Whose token opened the endpoint: its owner's (`client` "") or one of
    its named client tokens, with that token's share and rate limit."""

    client: str = OWNER
    weight: float = 1.0
    requests_per_minute: int | None = None


OWNER_CALLER = Caller()


class TokenCheck(Protocol):
    def identify(self, endpoint_id: str, token: str) -> Caller | None:
        """Whose token this is on this endpoint; None: it opens nothing here."""
        ...

    def named(self, endpoint_id: str, client: str) -> Caller | None:
        """The endpoint's client `client` as it stands now (OWNER: the
        owner's); None when no such token of it is live (revoked)."""
        ...


def bearer_token(authorization: bytes | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, else None."""
    if authorization is None or len(authorization) > _MAX_TOKEN_BYTES + 7:
        return None
    if authorization[:7].lower() != b"bearer ":
        return None
    token = authorization[7:].strip()
    return token.decode("latin-1") if token else None


def caller(verifier: TokenCheck, endpoint_id: str, authorization: bytes | None) -> Caller | None:
    """Whose request this is; None for every way of not holding a token of
    this endpoint (all answered with the same 401)."""
    token = bearer_token(authorization)
    return None if token is None else verifier.identify(endpoint_id, token)


def unauthorized() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED_MESSAGE)


def authorized(verifier: TokenCheck, endpoint_id: str, authorization: bytes | None) -> bool:
    """Any token of this endpoint: the owner's or a client token."""
    return caller(verifier, endpoint_id, authorization) is not None
