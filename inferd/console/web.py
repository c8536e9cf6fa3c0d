"""Request plumbing shared by the console's pages: the session of a
request, sign-in checks, CSRF checks on every unsafe method, rendering with
the page's common context, and the endpoint a principal may open."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from inferd.console import formatting
from inferd.console.security import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    Session,
    SessionStore,
    cookie_header,
    csrf_ok,
    same_origin,
)
from inferd.console.sources import ConsoleSources
from inferd.control.accounts.roles import Action
from inferd.control.endpoints.tokens import ENDPOINT_TOKEN_PREFIX
from inferd.errors import InferdError, NotFound
from inferd.vocab import ModelKind

TEMPLATES = Path(__file__).parent / "templates"
MAX_FORM_BYTES = 64 * 1024

Page = Callable[[Request, Session], Awaitable[Response]]


class ConsoleError(Exception):
    """An answer other than the page: a 403/404 page, or a redirect."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        # Every value is escaped: names typed by people are shown as text.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(formatting.FILTERS)
    # What an endpoint's access token starts with (the playground's hint).
    env.globals["token_prefix"] = ENDPOINT_TOKEN_PREFIX
    env.globals["kinds"] = ModelKind
    return env


class Web:
    def __init__(self, sources: ConsoleSources, sessions: SessionStore) -> None:
        self.sources = sources
        self.sessions = sessions
        self.env = environment()

    # --- pages -----------------------------------------------------------------------

    def page(self, handler: Page, *, signed_in: bool = True) -> Callable[[Request], Any]:
        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            session = self.sessions.get(request.cookies.get(COOKIE))
            fresh = session is None
            if session is None:
                session = self.sessions.new()
            await self._refresh_principal(session)
            try:
                if request.method not in ("GET", "HEAD"):
                    await self._check_unsafe(request, session)
                if signed_in and session.principal is None:
                    response = self._to_sign_in(request)
                else:
                    response = await handler(request, session)
            except ConsoleError as exc:
                response = self.render(
                    request, session, "error.html", status=exc.status, message=exc.message
                )
            # The handler may have signed in (a new session) or out.
            current: Session = getattr(request.state, "session", session)
            if fresh or current is not session:
                response.headers.append(
                    "set-cookie", cookie_header(current, request.url.scheme == "https")
                )
            return response

        return endpoint

    async def _refresh_principal(self, session: Session) -> None:
        """Who the session's key is now: a revoked key signs the session out,
        a changed role applies to this very request."""
        if session.key is None:
            session.principal = None
            return
        try:
            session.principal = await self.sources.resolve(f"Bearer {session.key}")
        except InferdError:
            session.key = None
            session.principal = None

    async def _check_unsafe(self, request: Request, session: Session) -> None:
        if not same_origin(request):
            raise ConsoleError(403, "This form was sent from another site and was refused.")
        supplied = request.headers.get(CSRF_HEADER)
        if supplied is None:
            supplied = str((await self.form(request)).get(CSRF_FIELD) or "") or None
        if not csrf_ok(session, supplied):
            raise ConsoleError(
                403, "The form's security token is missing or stale. Reload the page and retry."
            )

    async def form(self, request: Request) -> FormData:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_FORM_BYTES:
            raise ConsoleError(413, "The form is too large.")
        return await request.form(max_files=0, max_fields=64, max_part_size=MAX_FORM_BYTES)

    def _to_sign_in(self, request: Request) -> Response:
        target = "/console/signin"
        if request.headers.get("hx-request"):
            # htmx follows this header with a full page load.
            return Response(status_code=204, headers={"HX-Redirect": target})
        return RedirectResponse(target, status_code=303)

    def switch_session(self, request: Request, session: Session) -> None:
        request.state.session = session

    def render(
        self,
        request: Request,
        session: Session,
        template: str,
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        **context: Any,
    ) -> HTMLResponse:
        html = self.env.get_template(template).render(
            session=session,
            principal=session.principal,
            csrf=session.csrf,
            path=request.url.path,
            **context,
        )
        return HTMLResponse(html, status_code=status, headers=headers)

    # --- access ----------------------------------------------------------------------

    def endpoint(self, session: Session, endpoint_id: str, action: Action = Action.READ) -> Any:
        """The endpoint if this principal may do `action` on it: another
        project's endpoint is the same 404 as an id that does not exist, a
        role that may not act is a 403."""
        principal = session.principal
        if principal is None:
            raise ConsoleError(404, "No such endpoint.")
        try:
            return self.sources.endpoints.endpoint(principal, endpoint_id, action)
        except NotFound:
            raise ConsoleError(404, "No such endpoint.") from None
        except InferdError as exc:
            raise ConsoleError(exc.status, exc.message) from None

    def changeable(self, session: Session, endpoint_id: str) -> Any:
        return self.endpoint(session, endpoint_id, Action.WRITE)

    async def can_create(self, session: Session) -> bool:
        principal = session.principal
        return principal is not None and bool(await self.sources.writable_projects(principal))
