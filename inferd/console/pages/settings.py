"""An endpoint's scaling and GPU settings: the cost change of the values
typed, shown before saving, and the save."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.api.management import UpdateEndpointRequest
from inferd.console.costs import Envelope, SettingsChange
from inferd.console.messages import human_errors
from inferd.console.pages.base import Pages, form_int, written
from inferd.console.security import Session
from inferd.console.web import ConsoleError, Web
from inferd.control.model import Endpoint as EndpointRow


def settings_from(row: EndpointRow, form: Any) -> tuple[dict[str, Any], str, int]:
    """The update body of a settings form, and the GPU type and count chosen
    (the endpoint's own where the form leaves them out)."""
    gpu_type, _, count = str(form.get("option") or "").partition(":")
    body = {
        "minReplicas": form_int(form.get("minReplicas"), row.min_replicas),
        "maxReplicas": form_int(form.get("maxReplicas"), row.max_replicas),
        "scaleToZeroRetentionPeriodSeconds": form_int(form.get("retention"), row.retention_seconds),
    }
    return body, gpu_type or row.gpu_type, form_int(count, row.gpu_count)


class Settings(Pages):
    def __init__(self, web: Web, mark: Callable[[str], None]) -> None:
        """`mark(id)`: tells the board that an endpoint was just changed."""
        super().__init__(web)
        self._mark = mark

    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints/{id}/settings", page(self.preview), methods=["GET"]),
            Route("/endpoints/{id}/settings", page(self.save), methods=["POST"]),
        ]

    async def preview(self, request: Request, session: Session) -> Response:
        """The cost change of the settings in the form, before saving."""
        row = self.web.endpoint(session, request.path_params["id"])
        body, gpu_type, gpu_count = settings_from(row, request.query_params)
        price = row.hourly_price
        if (gpu_type, gpu_count) != (row.gpu_type, row.gpu_count):
            rec = self.sources.recommendation(
                row.model_name, row.location_name, row.engine_settings
            )
            for opt in rec.options:
                if (opt.gpu_type, opt.gpu_count) == (gpu_type, gpu_count):
                    price = opt.hourly_price
        change = SettingsChange(
            Envelope(row.hourly_price, row.min_replicas, row.max_replicas),
            Envelope(price, body["minReplicas"], max(body["minReplicas"], body["maxReplicas"])),
        )
        return self.web.render(
            request, session, "_settings_change.html", change=change, currency=row.currency
        )

    async def save(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        form = await self.web.form(request)
        body, gpu_type, gpu_count = settings_from(row, form)
        if (gpu_type, gpu_count) != (row.gpu_type, row.gpu_count):
            body.update(gpuType=gpu_type, gpuCount=gpu_count)
        try:
            req = UpdateEndpointRequest.model_validate(body)
        except ValidationError as exc:
            raise ConsoleError(400, human_errors(exc.errors())) from None
        assert session.principal is not None
        await written(self.sources.commands().update(session.principal, row.id, req))
        self._mark(row.id)
        return RedirectResponse(f"/console/endpoints/{row.id}#settings", status_code=303)
