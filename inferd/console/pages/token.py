"""A new access token for an endpoint: confirmed first (the old one stops
working at once), then shown once on the endpoint's page."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.console.pages.base import Pages, written
from inferd.console.security import Session


class Token(Pages):
    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints/{id}/token", page(self.confirm), methods=["GET"]),
            Route("/endpoints/{id}/token", page(self.reissue), methods=["POST"]),
        ]

    async def confirm(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        return self.web.render(request, session, "token_confirm.html", row=row)

    async def reissue(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        assert session.principal is not None
        token = await written(self.sources.commands().reissue_token(session.principal, row.id))
        session.reveal[row.id] = token
        return RedirectResponse(f"/console/endpoints/{row.id}", status_code=303)
