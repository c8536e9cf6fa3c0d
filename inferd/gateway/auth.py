"""Bearer tokens on the inference path.

Every way of not holding this endpoint's token (none, not a bearer, a wrong
one, another endpoint's, an id that does not exist) gets the same 401, so a
caller without a token learns nothing about which endpoints exist. The token
itself is never logged or echoed.
"""

from __future__ import annotations

from typing import Protocol

from inferd.errors import Unauthorized

# Far above a real token; longer headers are refused without hashing.
_MAX_TOKEN_BYTES = 512
UNAUTHORIZED_MESSAGE = (
    "Missing or invalid access token for this endpoint. Send 'Authorization: Bearer "
    "<ACCESS_TOKEN>' with the token of this endpoint."
)
WWW_AUTHENTICATE = (b"www-authenticate", b"Bearer")


class TokenCheck(Protocol):
    def verify(self, endpoint_id: str, token: str) -> bool: ...


def bearer_token(authorization: bytes | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, else None."""
    if authorization is None or len(authorization) > _MAX_TOKEN_BYTES + 7:
        return None
    if authorization[:7].lower() != b"bearer ":
        return None
    token = authorization[7:].strip()
    return token.decode("latin-1") if token else None


def authorized(verifier: TokenCheck, endpoint_id: str, authorization: bytes | None) -> bool:
    token = bearer_token(authorization)
    return token is not None and verifier.verify(endpoint_id, token)


def unauthorized() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED_MESSAGE)
