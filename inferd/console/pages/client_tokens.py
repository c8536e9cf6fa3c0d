"""An endpoint's client tokens on its page: listed by hint, created (the
token shown once on the page that follows) and revoked, by the roles that
may change the endpoint. The same service as the API's routes."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.api.management import CreateClientTokenRequest
from inferd.console.pages.base import Pages, written
from inferd.console.security import Session
from inferd.console.web import ConsoleError
from inferd.control.endpoints.client_tokens import ClientTokenService
from inferd.errors import InferdError
from inferd.http import validate


class ClientTokens(Pages):
    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints/{id}/client-tokens", page(self.create), methods=["POST"]),
            Route(
                "/endpoints/{id}/client-tokens/{name}/revoke", page(self.revoke), methods=["POST"]
            ),
        ]

    async def create(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        form = await self.web.form(request)
        body: dict[str, object] = {"name": str(form.get("name") or "").strip()}
        try:
            if form.get("weight"):
                body["weight"] = float(str(form["weight"]))
            if form.get("requestsPerMinute"):
                body["requestsPerMinute"] = int(str(form["requestsPerMinute"]))
            req = validate(CreateClientTokenRequest, body)
        except InferdError as exc:
            raise ConsoleError(400, f"The client token was not created: {exc.message}") from None
        except ValueError:
            raise ConsoleError(400, "The weight and the rate limit are numbers.") from None
        assert session.principal is not None
        record, token = await written(self._service().create(session.principal, row.id, req))
        session.reveal[f"client:{row.id}"] = f"{record.name}\n{token}"
        return RedirectResponse(f"/console/endpoints/{row.id}#client-tokens", status_code=303)

    async def revoke(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        name = request.path_params["name"]
        assert session.principal is not None
        await written(self._service().revoke(session.principal, row.id, name))
        return RedirectResponse(f"/console/endpoints/{row.id}#client-tokens", status_code=303)

    def _service(self) -> ClientTokenService:
        service = self.sources.client_tokens
        if service is None:
            raise ConsoleError(404, "Client tokens are not available on this server.")
        return service
