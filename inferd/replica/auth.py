"""Only the gateway may call a replica.

A replica listens on its node's address; without a check, anyone who
reaches that port would bypass endpoint tokens, quotas and usage metering.
Every request must carry the replica's call key as a bearer token, compared
in constant time; paths the operator leaves open (`/health`, `/metrics` by
default, for probes and scrapers) are exempt.

The call key is the SHA-256 of the replica's secret, in hex: the control
plane stores exactly that digest with the replica's record, so every
gateway instance can send it, while only the secret itself (which stays with
the replica and travels by environment) authenticates the replica's reports
to the registry. Knowing the key lets one call the replica, never speak for
it.

A plain ASGI middleware: it must not buffer streamed answers.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from inferd.errors import Unauthorized
from inferd.http_errors import error_response
from inferd.replica.config import DEFAULT_OPEN_PATHS

_WWW_AUTHENTICATE = (b"www-authenticate", b'Bearer realm="inferd-replica"')


def call_key(secret: str) -> str:
    """What the gateway sends to the replica whose secret this is."""
    return hashlib.sha256(secret.encode()).hexdigest()


class RequireCallKey:
    def __init__(self, app: ASGIApp, key: str, open_paths: Iterable[str] = DEFAULT_OPEN_PATHS):
        self._app = app
        self._expected = b"Bearer " + key.encode()
        self._open = frozenset(p for p in open_paths if p)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            await self._app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if hmac.compare_digest(given, self._expected):
            await self._app(scope, receive, send)
            return
        response = error_response(
            Unauthorized(
                "This replica answers only its control plane's gateway; call the endpoint's URL.",
                code="replica_key_required",
            )
        )
        response.raw_headers.append(_WWW_AUTHENTICATE)
        await response(scope, receive, send)
