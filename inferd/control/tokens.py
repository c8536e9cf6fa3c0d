"""Endpoint access tokens and admin keys: format, hashing, verification.

A token reads ``infd_ep_<32 base62 random><6 base62 CRC32>`` (admin keys use
``infd_admin_``). 32 base62 characters carry ~190 bits from `secrets`. The
prefix makes a leaked token recognisable to people and secret scanners; the
CRC32 checksum (as in GitHub's token format) lets a typo or a made-up string
be refused without touching the store or the cache.

Only SHA-256 digests are stored. A slow password hash (bcrypt, argon2) exists
to make guessing *low-entropy* secrets expensive; these tokens have ≥128 bits
of randomness, so a preimage search is infeasible already, and a fast hash
keeps verification within the gateway's per-request budget (well under a
millisecond). Digests are compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import zlib
from typing import Protocol

ENDPOINT_TOKEN_PREFIX = "infd_ep_"
ADMIN_KEY_PREFIX = "infd_admin_"

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ALPHABET_SET = frozenset(_ALPHABET)
BODY_LEN = 32
CHECKSUM_LEN = 6  # 62**6 > 2**32: any CRC32 fits.


def _base62(n: int, width: int) -> str:
    chars = []
    for _ in range(width):
        n, rem = divmod(n, 62)
        chars.append(_ALPHABET[rem])
    return "".join(reversed(chars))


def _checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode("ascii")), CHECKSUM_LEN)


def _new(prefix: str) -> str:
    body = "".join(secrets.choice(_ALPHABET) for _ in range(BODY_LEN))
    return prefix + body + _checksum(body)


def new_endpoint_token() -> str:
    return _new(ENDPOINT_TOKEN_PREFIX)


def new_admin_key() -> str:
    return _new(ADMIN_KEY_PREFIX)


def is_well_formed(token: str, prefix: str = ENDPOINT_TOKEN_PREFIX) -> bool:
    """Prefix, length, alphabet and checksum; no I/O, no secret comparison."""
    if len(token) != len(prefix) + BODY_LEN + CHECKSUM_LEN or not token.startswith(prefix):
        return False
    rest = token[len(prefix) :]
    if not _ALPHABET_SET.issuperset(rest):
        return False
    body, check = rest[:BODY_LEN], rest[BODY_LEN:]
    return _checksum(body) == check


def hash_token(token: str) -> bytes:
    """SHA-256 digest (32 bytes), the only form a token is ever stored in."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def digest_matches(token: str, digest: bytes) -> bool:
    return hmac.compare_digest(hash_token(token), digest)


class TokenHashSource(Protocol):
    """What the verifier loads from: endpoint id -> digest of its active token."""

    def active_token_hashes(self) -> dict[str, bytes]: ...


class TokenVerifier:
    """Answers "does this token open this endpoint?" from memory.

    Loaded once from the store; the service that writes tokens updates it in
    the same process right after each commit (`set_active`, `forget`), so a
    re-issued or deleted endpoint's old token fails before the HTTP answer is
    sent. An endpoint id that is not cached has no active token: a miss never
    reaches the store, so unknown ids cost nothing. (A control plane split
    across processes would need a change feed to keep this cache fresh.)
    """

    def __init__(self, source: TokenHashSource) -> None:
        self._source = source
        self._active: dict[str, bytes] = {}
        self.reload()

    def reload(self) -> None:
        self._active = dict(self._source.active_token_hashes())

    def set_active(self, endpoint_id: str, digest: bytes) -> None:
        self._active[endpoint_id] = digest

    def forget(self, endpoint_id: str) -> None:
        self._active.pop(endpoint_id, None)

    def verify(self, endpoint_id: str, token: str) -> bool:
        if not is_well_formed(token, ENDPOINT_TOKEN_PREFIX):
            return False
        digest = self._active.get(endpoint_id)
        if digest is None:
            # Still hash and compare, so a valid-looking token for an unknown
            # endpoint takes the same time as a wrong one for a known endpoint.
            hmac.compare_digest(hash_token(token), bytes(32))
            return False
        return hmac.compare_digest(hash_token(token), digest)

    def __len__(self) -> int:
        return len(self._active)
