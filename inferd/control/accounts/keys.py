"""Users' management keys: format and listing hint.

Same shape and reasoning as endpoint tokens (`inferd.control.token_format`):
``infd_key_<32 base62><6 base62 CRC32>``, ~190 bits of randomness, stored
only as a SHA-256 digest, a malformed key refused before any lookup.
"""

from __future__ import annotations

import secrets

from inferd.control.token_format import BODY_LEN, checksum, is_well_formed

USER_KEY_PREFIX = "infd_key_"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def new_user_key() -> str:
    body = "".join(secrets.choice(_ALPHABET) for _ in range(BODY_LEN))
    return USER_KEY_PREFIX + body + checksum(body)


def is_user_key(key: str) -> bool:
    return is_well_formed(key, USER_KEY_PREFIX)


def key_hint(key: str) -> str:
    """What listings show of a key: its prefix and last 4 characters."""
    return f"{USER_KEY_PREFIX}...{key[-4:]}"


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)
