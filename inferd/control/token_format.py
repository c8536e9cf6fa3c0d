"""Token format: endpoint tokens, client tokens and admin keys.

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

A leaf: the standard library only, so that every package of the control
plane (endpoints, accounts, the server) can name the format without
importing another's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import zlib

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


def checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode("ascii")), CHECKSUM_LEN)


def _new(prefix: str) -> str:
    body = "".join(secrets.choice(_ALPHABET) for _ in range(BODY_LEN))
    return prefix + body + checksum(body)


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
    return checksum(body) == check


def hash_token(token: str) -> bytes:
    """SHA-256 digest (32 bytes), the only form a token is ever stored in."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def digest_matches(token: str, digest: bytes) -> bool:
    return hmac.compare_digest(hash_token(token), digest)


def client_token_hint(token: str) -> str:
    """What listings show of a client token: its prefix and last 4 characters."""
    return f"{ENDPOINT_TOKEN_PREFIX}...{token[-4:]}"
