"""Deleting an endpoint, only with its name typed."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.console.pages.base import Pages, written
from inferd.console.security import Session
from inferd.console.web import ConsoleError, Web


class Delete(Pages):
    def __init__(self, web: Web, mark: Callable[[str], None]) -> None:
        """`mark(id)`: tells the board that an endpoint is going."""
        super().__init__(web)
        self._mark = mark

    def routes(self) -> list[BaseRoute]:
        return [Route("/endpoints/{id}/delete", self.web.page(self.delete), methods=["POST"])]

    async def delete(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        form = await self.web.form(request)
        if str(form.get("confirm_name") or "") != row.name:
            raise ConsoleError(
                400, f"Type the endpoint's name ({row.name}) to confirm; nothing was deleted."
            )
        assert session.principal is not None
        await written(self.sources.commands().delete(session.principal, row.id))
        self._mark(row.id)
        return RedirectResponse("/console/endpoints", status_code=303)
