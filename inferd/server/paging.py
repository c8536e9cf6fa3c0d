"""Pages on the wire: `limit` and an opaque `continue` cursor, as Kubernetes
lists do. A list answers `{"data": [...], "continue": <cursor>}`, with
`continue` only when more items follow (so a list that fits one page reads
exactly as before pages existed); a client repeats the same query with
`continue=<cursor>` until an answer has none.

The cursor carries the position to resume from and a digest of the query
that issued it (the list, its scope and filters). It is not a secret and
grants nothing: the caller's access is checked on every page, so a forged
position can only land inside what the caller may list anyway. Its check
digest catches a cursor that was edited or cut; one issued for another list
or other filters (or by an older format) is refused as stale, since
resuming it would skip or repeat items. Both are a 400 in the one error
shape. Cursors do not expire: keyset positions stay meaningful however the
list changes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from inferd.catalog.models import KINDS as MODEL_KINDS
from inferd.control.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from inferd.errors import BadRequest
from inferd.server.docs import Param
from inferd.vocab import EndpointStatus

PAGE_PARAMS = ("limit", "continue")
# Filters of the endpoint list (each an exact match but `namePrefix`).
ENDPOINT_FILTERS = ("projectId", "status", "modelName", "locationName", "namePrefix")
MODEL_FILTERS = ("projectId", "kind", "namePrefix")

# What each list query parameter means, for the API's document (an
# operation's `Doc.query` gives those of its own).
QUERY_DOCS: dict[str, Param] = {
    "limit": Param(
        f"Items per page, 1 to {MAX_PAGE_SIZE} (default {DEFAULT_PAGE_SIZE}). A page may hold "
        "fewer and still not be the last: follow `continue` until an answer has none.",
        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
    ),
    "continue": Param(
        "The `continue` value of the previous page, with the query otherwise unchanged.",
        {"type": "string", "minLength": 1},
    ),
    "projectId": Param("Only this project's items.", {"type": "string", "minLength": 1}),
    "role": Param(
        "Only members with this role.",
        {"type": "string", "enum": ["admin", "developer", "viewer"]},
    ),
    "status": Param(
        "Only endpoints in this status.",
        {"type": "string", "enum": [s.value for s in EndpointStatus]},
    ),
    "modelName": Param("Only endpoints serving this model.", {"type": "string", "minLength": 1}),
    "locationName": Param("Only endpoints in this location.", {"type": "string", "minLength": 1}),
    "kind": Param("Only models of this kind.", {"type": "string", "enum": list(MODEL_KINDS)}),
    "namePrefix": Param(
        "Only items whose name starts with this (case-sensitive).",
        {"type": "string", "minLength": 1},
    ),
}


CURSOR_VERSION = 1
_CHECK_BYTES = 8


@dataclass(frozen=True)
class PageRequest:
    limit: int
    after: int | None  # None: the first page


@dataclass(frozen=True)
class KeyPageRequest:
    """A page of a list ordered by a text key (a user id, a model name)."""

    limit: int
    after: str | None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check(payload: bytes) -> bytes:
    return hashlib.sha256(b"inferd-cursor\0" + payload).digest()[:_CHECK_BYTES]


def query_digest(list_name: str, query: Mapping[str, str | None]) -> str:
    """What a cursor is bound to: the list and every filter and scope value
    (absent ones included, so adding a filter changes the digest)."""
    canonical = json.dumps([list_name, sorted(query.items())], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encode_cursor(list_name: str, query: Mapping[str, str | None], after: int | str) -> str:
    payload = json.dumps(
        {"v": CURSOR_VERSION, "q": query_digest(list_name, query), "a": after},
        separators=(",", ":"),
    ).encode()
    return _b64(payload + _check(payload))


def _invalid() -> BadRequest:
    return BadRequest(
        "The 'continue' value is not a cursor this server issued (it was changed or cut "
        "short); start again without 'continue'.",
        param="continue",
        code="invalid_cursor",
    )


def _stale() -> BadRequest:
    return BadRequest(
        "The 'continue' value was issued for another list or other filters; repeat the "
        "query that issued it unchanged, or start again without 'continue'.",
        param="continue",
        code="stale_cursor",
    )


def decode_cursor(
    cursor: str, list_name: str, query: Mapping[str, str | None], kind: type = int
) -> Any:
    """The position (of type `kind`) a cursor resumes after; a 400 for an
    edited or foreign one."""
    try:
        raw = _unb64(cursor)
    except (binascii.Error, ValueError):
        raise _invalid() from None
    payload, check = raw[:-_CHECK_BYTES], raw[-_CHECK_BYTES:]
    if len(raw) <= _CHECK_BYTES or check != _check(payload):
        raise _invalid()
    try:
        fields: Any = json.loads(payload)
    except ValueError:
        raise _invalid() from None
    if not isinstance(fields, dict):
        raise _invalid()
    if fields.get("v") != CURSOR_VERSION or fields.get("q") != query_digest(list_name, query):
        raise _stale()
    after = fields.get("a")
    if kind is int and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise _invalid()
    if kind is str and not isinstance(after, str):
        raise _invalid()
    return after


def read_page(request: Request, list_name: str, query: Mapping[str, str | None]) -> PageRequest:
    """`limit` (1..MAX_PAGE_SIZE, default DEFAULT_PAGE_SIZE) and `continue`."""
    cursor = request.query_params.get("continue")
    after = None if cursor is None else decode_cursor(cursor, list_name, query)
    return PageRequest(read_limit(request), after)


def read_key_page(
    request: Request, list_name: str, query: Mapping[str, str | None]
) -> KeyPageRequest:
    """As `read_page`, for a list ordered by a text key."""
    cursor = request.query_params.get("continue")
    after = None if cursor is None else decode_cursor(cursor, list_name, query, str)
    return KeyPageRequest(read_limit(request), after)


def read_limit(request: Request) -> int:
    raw_limit = request.query_params.get("limit")
    limit = DEFAULT_PAGE_SIZE
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise BadRequest(
                f"'limit' must be an integer from 1 to {MAX_PAGE_SIZE}.",
                param="limit",
                code="invalid_value",
            )
    return limit


def next_cursor(
    list_name: str, query: Mapping[str, str | None], after: int | str | None
) -> str | None:
    return None if after is None else encode_cursor(list_name, query, after)


def paged_body(
    data: list[Any], list_name: str, query: Mapping[str, str | None], after: int | str | None
) -> dict[str, Any]:
    """A list's answer: `data`, and `continue` only when more follow."""
    cursor = next_cursor(list_name, query, after)
    return {"data": data} if cursor is None else {"data": data, "continue": cursor}


def filter_value(request: Request, name: str) -> str | None:
    """A filter's value; an empty one is a 400 (it would select nothing or
    everything, and either is more likely a client's slip)."""
    value = request.query_params.get(name)
    if value is not None and not value:
        raise BadRequest(f"'{name}' must not be empty.", param=name, code="invalid_value")
    return value
