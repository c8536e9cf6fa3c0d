"""The console's browser security: sessions, CSRF tokens, response headers.

Sessions live on the server (a random id in an HttpOnly, SameSite=Strict
cookie scoped to `/console`), so a stolen page never exposes a key and a
sign-out ends the session at once. Every visitor gets a session before
signing in, because the sign-in form needs a CSRF token too; signing in
replaces the session id (no fixation). Every unsafe request must carry the
session's CSRF token (form field `csrf` or header `X-CSRF-Token`, which the
console's htmx requests send) and, when the browser sends one, an `Origin`
of this server.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferd.control.accounts.roles import Principal

COOKIE = "inferd_console"
COOKIE_PATH = "/console"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
IDLE_TIMEOUT_S = 12 * 3600
MAX_SESSIONS = 10_000


@dataclass
class Session:
    id: str
    csrf: str
    created: float
    seen: float
    # The key signed in with, kept on the server only: every request
    # resolves it again, so a revoked key or a changed role counts at once.
    key: str | None = field(default=None, repr=False)
    principal: Principal | None = None
    # Access tokens to show once on an endpoint's page (by endpoint id):
    # taken out when shown, so a reload no longer has them.
    reveal: dict[str, str] = field(default_factory=dict)

    def take_reveal(self, endpoint_id: str) -> str | None:
        return self.reveal.pop(endpoint_id, None)


class SessionStore:
    """Sessions in memory, least recently used evicted past `max_sessions`."""

    def __init__(
        self,
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._idle = idle_timeout_s
        self._max = max_sessions
        self._clock = clock

    def new(self) -> Session:
        now = self._clock()
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now, now)
        self._sessions[session.id] = session
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.seen > self._idle:
            del self._sessions[session_id]
            return None
        session.seen = now
        self._sessions.move_to_end(session_id)
        return session

    def sign_in(self, old: Session, key: str, principal: Principal) -> Session:
        """A fresh id and CSRF token for the signed-in session."""
        self.drop(old.id)
        session = self.new()
        session.key = key
        session.principal = principal
        return session

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


def csrf_ok(session: Session, supplied: str | None) -> bool:
    return bool(supplied) and hmac.compare_digest(session.csrf, supplied or "")


def same_origin(request: Request) -> bool:
    """False only when the browser says the request came from another origin."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    host = request.headers.get("host", "")
    return parts.netloc == host and parts.scheme == request.url.scheme


def cookie_header(session: Session, secure: bool) -> str:
    attrs = [
        f"{COOKIE}={session.id}",
        f"Path={COOKIE_PATH}",
        "HttpOnly",
        "SameSite=Strict",
        f"Max-Age={IDLE_TIMEOUT_S}",
    ]
    if secure:
        attrs.append("Secure")
    return "; ".join(attrs)


def content_security_policy(connect_origins: tuple[str, ...] = ()) -> str:
    """Everything from this origin only; no inline script or style; no framing.
    `connect_origins`: where the playground may also call (the endpoints'
    public URL, when it is not the console's own origin)."""
    connect = " ".join(("'self'", *connect_origins))
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data: blob:",
            f"connect-src {connect}",
            "font-src 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "object-src 'none'",
        ]
    )


class SecurityHeaders:
    """ASGI middleware: the console's headers on every response below it."""

    def __init__(self, app: ASGIApp, csp: str) -> None:
        self.app = app
        self.headers = {
            "content-security-policy": csp,
            "x-frame-options": "DENY",
            "x-content-type-options": "nosniff",
            # Not no-referrer: with it Chromium sends `Origin: null` on form posts,
            # and the origin check needs the real one.
            "referrer-policy": "same-origin",
            "cross-origin-opener-policy": "same-origin",
            "cross-origin-resource-policy": "same-origin",
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith(f"{COOKIE_PATH}/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    headers[name] = value
                if not static:
                    # Pages carry data of the signed-in principal.
                    headers["cache-control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)
