"""Signing in with a management key (or the operator key) and out."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.console.pages.base import Pages
from inferd.console.security import Session
from inferd.errors import InferdError


class SignIn(Pages):
    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/", page(self.home), methods=["GET"]),
            Route("/signin", page(self.form, signed_in=False), methods=["GET"]),
            Route("/signin", page(self.signin, signed_in=False), methods=["POST"]),
            Route("/signout", page(self.signout, signed_in=False), methods=["POST"]),
        ]

    async def home(self, request: Request, session: Session) -> Response:
        return RedirectResponse("/console/endpoints", status_code=303)

    async def form(self, request: Request, session: Session) -> Response:
        return self.web.render(request, session, "signin.html", error=None)

    async def signin(self, request: Request, session: Session) -> Response:
        form = await self.web.form(request)
        key = str(form.get("key") or "").strip()
        try:
            principal = await self.sources.resolve(f"Bearer {key}") if key else None
        except InferdError:
            principal = None
        if principal is None:
            return self.web.render(
                request, session, "signin.html", status=401, error="That key is not valid."
            )
        signed = self.web.sessions.sign_in(session, key, principal)
        self.web.switch_session(request, signed)
        return RedirectResponse("/console/endpoints", status_code=303)

    async def signout(self, request: Request, session: Session) -> Response:
        self.web.sessions.drop(session.id)
        self.web.switch_session(request, self.web.sessions.new())
        return RedirectResponse("/console/signin", status_code=303)
