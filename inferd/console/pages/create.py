"""Creating an endpoint: the form, the recommendation table for the model
and location picked, the cost envelope of the option and bounds chosen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.api.management import CreateEndpointRequest
from inferd.console.costs import Envelope
from inferd.console.messages import human_errors
from inferd.console.pages.base import Pages, form_int
from inferd.console.security import Session
from inferd.console.sources import AnyRecommendation, rejected_groups
from inferd.console.web import ConsoleError, Web
from inferd.errors import Forbidden, InferdError, NotFound


class Create(Pages):
    def __init__(self, web: Web, mark: Callable[[str], None]) -> None:
        """`mark(id)`: tells the board that an endpoint was just created."""
        super().__init__(web)
        self._mark = mark

    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints", page(self.create), methods=["POST"]),
            Route("/endpoints/new", page(self.new), methods=["GET"]),
            Route("/endpoints/new/options", page(self.options), methods=["GET"]),
            Route("/endpoints/new/envelope", page(self.envelope), methods=["GET"]),
        ]

    async def _context(
        self, session: Session, model: str, location: str, form: dict[str, Any]
    ) -> dict[str, Any]:
        assert session.principal is not None
        projects = await self.sources.writable_projects(session.principal)
        catalog = self.sources.catalog
        models = self.sources.models_for(session.principal)
        if location not in catalog.gpus.locations:
            location = self.sources.default_location
        totals = await self.sources.capacity()
        if model not in {m.name for m in models}:
            # The first model that fits somewhere here, not one that cannot run.
            fitting = [
                m.name for m in models if self.sources.placeable(m.name, location, totals).options
            ]
            model = (fitting or [m.name for m in models] or [""])[0]
        rec = self.sources.placeable(model, location, totals) if model else None
        best = rec.best() if rec else None
        chosen = str(form.get("option") or (f"{best.gpu_type}:{best.gpu_count}" if best else ""))
        return {
            "projects": projects,
            "project": str(form.get("project") or (projects[0] if projects else "")),
            "models": models,
            "locations": list(catalog.gpus.locations.values()),
            "model": model,
            "model_kind": catalog.models.get(model).kind if model else "chat",
            "location": location,
            "rec": rec,
            "rejected": rejected_groups(rec.rejected) if rec else [],
            "chosen": chosen,
            "form": form,
            "envelope": _envelope_for(rec, chosen, form),
        }

    async def new(self, request: Request, session: Session) -> Response:
        if not await self.web.can_create(session):
            raise ConsoleError(403, "Your role can only read endpoints.")
        params = request.query_params
        form = {"minReplicas": "0", "maxReplicas": "1", "retention": "900", **params}
        context = await self._context(
            session, params.get("model", ""), params.get("location", ""), form
        )
        return self.web.render(request, session, "create.html", error=None, **context)

    async def options(self, request: Request, session: Session) -> Response:
        """The recommendation table for the model and location picked."""
        params = request.query_params
        form = {k: params.get(k) for k in ("minReplicas", "maxReplicas", "retention")}
        context = await self._context(
            session, params.get("model", ""), params.get("location", ""), form
        )
        return self.web.render(request, session, "_options.html", **context)

    async def envelope(self, request: Request, session: Session) -> Response:
        params = request.query_params
        context = await self._context(
            session, params.get("model", ""), params.get("location", ""), dict(params)
        )
        return self.web.render(request, session, "_envelope.html", **context)

    async def create(self, request: Request, session: Session) -> Response:
        assert session.principal is not None
        form = dict((await self.web.form(request)).items())
        gpu_type, _, count = str(form.get("option") or "").partition(":")
        body = {
            "name": str(form.get("name") or "").strip(),
            "modelName": form.get("model"),
            "locationName": form.get("location") or None,
            "gpuType": gpu_type or None,
            "gpuCount": form_int(count, 0) or None,
            "minReplicas": form_int(form.get("minReplicas"), 0),
            "maxReplicas": form_int(form.get("maxReplicas"), 1),
            "scaleToZeroRetentionPeriodSeconds": form_int(form.get("retention"), 900),
        }
        try:
            req = CreateEndpointRequest.model_validate(body)
            project = str(form.get("project") or "") or None
            record, token = await self.sources.commands().create(session.principal, req, project)
        except ValidationError as exc:
            error = human_errors(exc.errors())
            return await self._failed(request, session, form, error)
        except (NotFound, Forbidden) as exc:
            raise ConsoleError(exc.status, exc.message) from None
        except InferdError as exc:
            return await self._failed(request, session, form, exc.message)
        session.reveal[record["id"]] = token
        self._mark(record["id"])
        return RedirectResponse(f"/console/endpoints/{record['id']}", status_code=303)

    async def _failed(
        self, request: Request, session: Session, form: dict[str, Any], error: str
    ) -> Response:
        context = await self._context(
            session, str(form.get("model") or ""), str(form.get("location") or ""), form
        )
        return self.web.render(request, session, "create.html", status=400, error=error, **context)


def _envelope_for(
    rec: AnyRecommendation | None, chosen: str, form: dict[str, Any]
) -> Envelope | None:
    """What the option chosen costs between the bounds typed."""
    if rec is None:
        return None
    gpu_type, _, count = chosen.partition(":")
    for opt in rec.options:
        if opt.gpu_type == gpu_type and str(opt.gpu_count) == count:
            min_r = form_int(form.get("minReplicas"), 0)
            max_r = form_int(form.get("maxReplicas"), 1)
            return Envelope(opt.hourly_price, min_r, max(max_r, min_r))
    return None
