"""The console's routes, mounted at `/console` by `inferd serve`.

Route functions do HTTP only: read the form, call the service layer (the
same `EndpointService` the REST API calls), render a template. Pages that
change something check the principal's role on the server, whatever the
page showed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from markupsafe import Markup
from pydantic import ValidationError
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router
from starlette.staticfiles import StaticFiles

from inferd import COMPAT_FAMILY
from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.console.charts import endpoint_charts
from inferd.console.costs import Envelope, SettingsChange
from inferd.console.live import LiveBoard
from inferd.console.messages import human_errors
from inferd.console.security import (
    SecurityHeaders,
    Session,
    SessionStore,
    content_security_policy,
)
from inferd.console.sources import ConsoleSources
from inferd.console.views import RowView, ViewCache, ids_signature, matches
from inferd.console.web import ConsoleError, Web
from inferd.control.accounts.roles import Action, Principal
from inferd.control.model import Endpoint as EndpointRow
from inferd.errors import Forbidden, InferdError, NotFound

STATIC = Path(__file__).parent / "static"
T = TypeVar("T")
LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 64 * 1024
LOG_DOWNLOAD_BYTES = 8 * 1024 * 1024
RANGES = {"hour": (3600, 60), "day": (86400, 900)}


def _int(value: Any, default: int) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _list_key(principal: Principal, query: str) -> tuple[Any, ...]:
    """Who sees which rows, and the search: what a list's signature depends on."""
    return (principal.operator, tuple(sorted(principal.roles.items())), query)


class Console:
    def __init__(self, sources: ConsoleSources, sessions: SessionStore | None = None) -> None:
        self.sources = sources
        self.web = Web(sources, sessions or SessionStore())
        row_template = self.web.env.get_template("_row.html")
        self.cache = ViewCache(lambda view: row_template.render(view=view))
        self.live = LiveBoard(self._view_of, sources.endpoints.endpoint_ids)
        # (operator, roles, query) -> (members version, version, signature)
        self._signatures: dict[tuple[Any, ...], tuple[int, int, str]] = {}

    # --- composition -----------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        pages = [
            Route("/", page(self.home), methods=["GET"]),
            Route("/signin", page(self.signin_form, signed_in=False), methods=["GET"]),
            Route("/signin", page(self.signin, signed_in=False), methods=["POST"]),
            Route("/signout", page(self.signout, signed_in=False), methods=["POST"]),
            Route("/endpoints", page(self.endpoints), methods=["GET"]),
            Route("/endpoints", page(self.create), methods=["POST"]),
            Route("/endpoints/rows", page(self.rows), methods=["GET"]),
            Route("/endpoints/changes", page(self.changes), methods=["GET"]),
            Route("/endpoints/new", page(self.new), methods=["GET"]),
            Route("/endpoints/new/options", page(self.options), methods=["GET"]),
            Route("/endpoints/new/envelope", page(self.envelope), methods=["GET"]),
            Route("/endpoints/{id}", page(self.endpoint), methods=["GET"]),
            Route("/endpoints/{id}/row", page(self.row), methods=["GET"]),
            Route("/endpoints/{id}/live", page(self.endpoint_live), methods=["GET"]),
            Route("/endpoints/{id}/charts", page(self.charts), methods=["GET"]),
            Route("/endpoints/{id}/logs", page(self.logs), methods=["GET"]),
            Route("/endpoints/{id}/logs.txt", page(self.logs_download), methods=["GET"]),
            Route("/endpoints/{id}/token", page(self.token_confirm), methods=["GET"]),
            Route("/endpoints/{id}/token", page(self.token_reissue), methods=["POST"]),
            Route("/endpoints/{id}/settings", page(self.settings_preview), methods=["GET"]),
            Route("/endpoints/{id}/settings", page(self.settings_save), methods=["POST"]),
            Route("/endpoints/{id}/delete", page(self.delete), methods=["POST"]),
            Route("/endpoints/{id}/playground", page(self.playground), methods=["GET"]),
            Route("/usage", page(self.usage), methods=["GET"]),
        ]
        return [
            *pages,
            Mount("/static", app=StaticFiles(directory=STATIC), name="console-static"),
        ]

    async def close(self) -> None:
        await self.live.close()

    def mount(self) -> Mount:
        """`/console`, with the security headers on every answer below it."""
        origin = urlsplit(self.sources.public_url)
        endpoints_origin = f"{origin.scheme}://{origin.netloc}"
        csp = content_security_policy((endpoints_origin,))
        return Mount(
            "/console",
            app=Router(self.routes(), redirect_slashes=False),
            middleware=[Middleware(SecurityHeaders, csp=csp)],
        )

    # --- helpers ---------------------------------------------------------------------

    def _views(self, rows: Sequence[EndpointRow]) -> list[RowView]:
        runtime_of, cost, view = (
            self.sources.endpoints.runtime_of,
            self.sources.cost_so_far,
            self.cache.view,
        )
        return [view(r, runtime_of(r.id), cost(r.id)) for r in rows]

    def _view_of(self, endpoint_id: str) -> RowView | None:
        row = self.sources.endpoints.find(endpoint_id)
        if row is None:
            return None
        runtime = self.sources.endpoints.runtime_of(endpoint_id)
        return self.cache.view(row, runtime, self.sources.cost_so_far(endpoint_id))

    def _signature(self, principal: Principal, query: str) -> str:
        """The signature of the rows this principal's list shows for `query`,
        recomputed only when rows appeared or went (or, while searching,
        when any row changed: a change can move a row in or out of a search)."""
        live = self.live
        key = _list_key(principal, query)
        cached = self._signatures.get(key)
        if (
            cached is not None
            and cached[0] == live.members_version
            and (not query or cached[1] == live.version)
        ):
            return cached[2]
        views = self._listed_by(principal, query)
        live.update(views)
        return self._remember_signature(key, views)

    def _remember_signature(self, key: tuple[Any, ...], views: Sequence[RowView]) -> str:
        if len(self._signatures) > 256:
            self._signatures.clear()
        signature = ids_signature(v.id for v in views)
        self._signatures[key] = (self.live.members_version, self.live.version, signature)
        return signature

    def _rows_html(self, views: Sequence[RowView]) -> list[Markup]:
        # Each row was rendered (escaped) by the row template; joined as is.
        return [Markup(self.cache.html(v)) for v in views]

    def _listed(self, session: Session, query: str) -> list[RowView]:
        assert session.principal is not None
        return self._listed_by(session.principal, query)

    def _listed_by(self, principal: Principal, query: str) -> list[RowView]:
        views = self._views(self.sources.visible_rows(principal))
        return [v for v in views if matches(v, query)]

    def _record(self, row: EndpointRow) -> dict[str, Any]:
        return self.sources.endpoints.record(row.id)

    def _can_change(self, session: Session, row: EndpointRow) -> bool:
        assert session.principal is not None
        return session.principal.may(Action.WRITE, row.project_id)

    async def _write(self, call: Awaitable[T]) -> T:
        """A write through the accounts layer; its refusals become pages."""
        try:
            return await call
        except InferdError as exc:
            raise ConsoleError(exc.status, exc.message) from None

    # --- sign-in ---------------------------------------------------------------------

    async def home(self, request: Request, session: Session) -> Response:
        return RedirectResponse("/console/endpoints", status_code=303)

    async def signin_form(self, request: Request, session: Session) -> Response:
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

    # --- the list --------------------------------------------------------------------

    async def endpoints(self, request: Request, session: Session) -> Response:
        return await self._list(request, session, "endpoints.html")

    async def rows(self, request: Request, session: Session) -> Response:
        """The table body for a search (htmx swaps it in as one types)."""
        return await self._list(request, session, "_rows.html")

    async def _list(
        self, request: Request, session: Session, template: str, **more: Any
    ) -> Response:
        """The list (whole page, or its body), its rows as they are now."""
        assert session.principal is not None
        query = request.query_params.get("q", "")
        views = self._listed(session, query)
        self.live.update(views)
        key = _list_key(session.principal, query)
        return self.web.render(
            request,
            session,
            template,
            views=views,
            rows_html=self._rows_html(views),
            query=query,
            version=self.live.version,
            signature=self._remember_signature(key, views),
            can_create=await self.web.can_create(session),
            **more,
        )

    async def changes(self, request: Request, session: Session) -> Response:
        """The poll of a list: only the rows changed since the version the
        browser has (swapped in out of band), or the whole body when the set
        of rows changed (an endpoint created or deleted, a search's matches).
        Usually answered from the live board without looking at every row."""
        assert session.principal is not None
        principal = session.principal
        params = request.query_params
        query = params.get("q", "")
        since = _int(params.get("since"), 0)
        self.live.watch()
        self.live.refresh_marked()
        changed = self.live.changed_since(since)
        if changed is not None:
            changed = [v for v in changed if principal.sees(v.project)]
            if not (query and changed) and self._signature(principal, query) == params.get(
                "signature"
            ):
                return self._changes(request, session, changed, query, params["signature"])
        views = self._listed(session, query)
        self.live.update(views)
        key = _list_key(principal, query)
        signature = self._remember_signature(key, views)
        if signature != params.get("signature"):
            return self.web.render(
                request,
                session,
                "_rows.html",
                views=views,
                rows_html=self._rows_html(views),
                version=self.live.version,
                oob=True,
                can_create=await self.web.can_create(session),
                query=query,
                signature=signature,
            )
        changed = [v for v in views if self.live.version_of(v.id) > since]
        return self._changes(request, session, changed, query, signature)

    def _changes(
        self,
        request: Request,
        session: Session,
        changed: list[RowView],
        query: str,
        signature: str,
    ) -> Response:
        return self.web.render(
            request,
            session,
            "_changes.html",
            changed=changed,
            version=self.live.version,
            query=query,
            signature=signature,
        )

    async def row(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        (view,) = self._views([row])
        return self.web.render(request, session, "_row.html", view=view, oob=False)

    # --- create ----------------------------------------------------------------------

    async def _create_context(
        self, session: Session, model: str, location: str, form: dict[str, Any]
    ) -> dict[str, Any]:
        assert session.principal is not None
        projects = await self.sources.writable_projects(session.principal)
        catalog = self.sources.catalog
        models = self.sources.models_for(session.principal)
        if location not in catalog.gpus.locations:
            location = self.sources.endpoints.default_location
        if model not in {m.name for m in models}:
            # The first model that fits somewhere here, not one that cannot run.
            fitting = [
                m.name for m in models if self.sources.recommendation(m.name, location).options
            ]
            model = (fitting or [m.name for m in models] or [""])[0]
        rec = self.sources.recommendation(model, location) if model else None
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
            "chosen": chosen,
            "form": form,
            "envelope": self._envelope_for(rec, chosen, form),
        }

    def _envelope_for(self, rec: Any, chosen: str, form: dict[str, Any]) -> Envelope | None:
        if rec is None:
            return None
        gpu_type, _, count = chosen.partition(":")
        for opt in rec.options:
            if opt.gpu_type == gpu_type and str(opt.gpu_count) == count:
                min_r = _int(form.get("minReplicas"), 0)
                max_r = _int(form.get("maxReplicas"), 1)
                return Envelope(opt.hourly_price, min_r, max(max_r, min_r))
        return None

    async def new(self, request: Request, session: Session) -> Response:
        if not await self.web.can_create(session):
            raise ConsoleError(403, "Your role can only read endpoints.")
        params = request.query_params
        form = {"minReplicas": "0", "maxReplicas": "1", "retention": "900", **params}
        context = await self._create_context(
            session, params.get("model", ""), params.get("location", ""), form
        )
        return self.web.render(request, session, "create.html", error=None, **context)

    async def options(self, request: Request, session: Session) -> Response:
        """The recommendation table for the model and location picked."""
        params = request.query_params
        form = {k: params.get(k) for k in ("minReplicas", "maxReplicas", "retention")}
        context = await self._create_context(
            session, params.get("model", ""), params.get("location", ""), form
        )
        return self.web.render(request, session, "_options.html", **context)

    async def envelope(self, request: Request, session: Session) -> Response:
        params = request.query_params
        context = await self._create_context(
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
            "gpuCount": _int(count, 0) or None,
            "minReplicas": _int(form.get("minReplicas"), 0),
            "maxReplicas": _int(form.get("maxReplicas"), 1),
            "scaleToZeroRetentionPeriodSeconds": _int(form.get("retention"), 900),
        }
        try:
            req = CreateEndpointRequest.model_validate(body)
            project = str(form.get("project") or "") or None
            record, token = await self.sources.endpoints.create(session.principal, req, project)
        except ValidationError as exc:
            error = human_errors(exc.errors())
            return await self._create_failed(request, session, form, error)
        except (NotFound, Forbidden) as exc:
            raise ConsoleError(exc.status, exc.message) from None
        except InferdError as exc:
            return await self._create_failed(request, session, form, exc.message)
        session.reveal[record["id"]] = token
        self.live.mark(record["id"])
        return RedirectResponse(f"/console/endpoints/{record['id']}", status_code=303)

    async def _create_failed(
        self, request: Request, session: Session, form: dict[str, Any], error: str
    ) -> Response:
        context = await self._create_context(
            session, str(form.get("model") or ""), str(form.get("location") or ""), form
        )
        return self.web.render(request, session, "create.html", status=400, error=error, **context)

    # --- one endpoint ----------------------------------------------------------------

    def _endpoint_context(self, session: Session, row: EndpointRow) -> dict[str, Any]:
        record = self._record(row)
        option = self.sources.option(row)
        envelope = Envelope(row.hourly_price, row.min_replicas, row.max_replicas)
        gpu_choices = []
        if row.model_name in self.sources.catalog.models:
            rec = self.sources.recommendation(row.model_name, row.location_name)
            gpu_choices = list(rec.options)
        return {
            "row": row,
            "record": record,
            "view": self._views([row])[0],
            "option": option,
            "envelope": envelope,
            "gpu_choices": gpu_choices,
            "can_change": self._can_change(session, row),
            "replicas": self.sources.replicas(row.id),
            "events": list(reversed(self.sources.scale_events(row.id)))[:50],
            "compat": COMPAT_FAMILY,
        }

    async def endpoint(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        token = session.take_reveal(row.id)
        return self.web.render(
            request,
            session,
            "endpoint.html",
            token=token,
            charts=self._charts(row, "hour"),
            range="hour",
            # The log panel comes filled, then follows the replicas' logs.
            tails=await self._last_lines(row),
            **self._endpoint_context(session, row),
        )

    async def endpoint_live(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        return self.web.render(
            request,
            session,
            "_endpoint_live.html",
            badge_oob=True,
            **self._endpoint_context(session, row),
        )

    def _charts(self, row: EndpointRow, range_name: str) -> list[Any]:
        span, bucket = RANGES.get(range_name, RANGES["hour"])
        points = self.sources.series.points(row.id, span, bucket, time.time())
        return endpoint_charts(points, row.model_kind)

    async def charts(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        range_name = request.query_params.get("range", "hour")
        if range_name not in RANGES:
            range_name = "hour"
        return self.web.render(
            request,
            session,
            "_charts.html",
            row=row,
            charts=self._charts(row, range_name),
            range=range_name,
        )

    async def _log_tails(self, row: EndpointRow, max_bytes: int) -> list[tuple[str, str]]:
        """Each replica's log, read through its launcher (on its node under Ray)."""
        tails = []
        for replica in self.sources.replicas(row.id):
            text = await self.sources.replica_log(replica.replica_id, max_bytes)
            if text is not None:
                tails.append((replica.replica_id, text))
        return tails

    async def _last_lines(self, row: EndpointRow) -> list[tuple[str, str]]:
        return [
            (rid, "\n".join(text.splitlines()[-LOG_TAIL_LINES:]))
            for rid, text in await self._log_tails(row, LOG_TAIL_BYTES)
        ]

    async def logs(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        tails = await self._last_lines(row)
        return self.web.render(request, session, "_logs.html", row=row, tails=tails)

    async def logs_download(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        parts = [
            f"==> replica {rid} <==\n{text}"
            for rid, text in await self._log_tails(row, LOG_DOWNLOAD_BYTES)
        ]
        return PlainTextResponse(
            "\n".join(parts) or "No replica has written a log yet.\n",
            headers={"content-disposition": f'attachment; filename="{row.name}-logs.txt"'},
        )

    async def token_confirm(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        return self.web.render(request, session, "token_confirm.html", row=row)

    async def token_reissue(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        assert session.principal is not None
        token = await self._write(self.sources.endpoints.reissue_token(session.principal, row.id))
        session.reveal[row.id] = token
        return RedirectResponse(f"/console/endpoints/{row.id}", status_code=303)

    def _settings_from(self, row: EndpointRow, form: Any) -> tuple[dict[str, Any], str, int]:
        gpu_type, _, count = str(form.get("option") or "").partition(":")
        body = {
            "minReplicas": _int(form.get("minReplicas"), row.min_replicas),
            "maxReplicas": _int(form.get("maxReplicas"), row.max_replicas),
            "scaleToZeroRetentionPeriodSeconds": _int(form.get("retention"), row.retention_seconds),
        }
        return body, gpu_type or row.gpu_type, _int(count, row.gpu_count)

    async def settings_preview(self, request: Request, session: Session) -> Response:
        """The cost change of the settings in the form, before saving."""
        row = self.web.endpoint(session, request.path_params["id"])
        body, gpu_type, gpu_count = self._settings_from(row, request.query_params)
        price = row.hourly_price
        if (gpu_type, gpu_count) != (row.gpu_type, row.gpu_count):
            rec = self.sources.recommendation(row.model_name, row.location_name)
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

    async def settings_save(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        form = await self.web.form(request)
        body, gpu_type, gpu_count = self._settings_from(row, form)
        if (gpu_type, gpu_count) != (row.gpu_type, row.gpu_count):
            body.update(gpuType=gpu_type, gpuCount=gpu_count)
        try:
            req = UpdateEndpointRequest.model_validate(body)
        except ValidationError as exc:
            raise ConsoleError(400, human_errors(exc.errors())) from None
        assert session.principal is not None
        await self._write(self.sources.endpoints.update(session.principal, row.id, req))
        self.live.mark(row.id)
        return RedirectResponse(f"/console/endpoints/{row.id}#settings", status_code=303)

    async def delete(self, request: Request, session: Session) -> Response:
        row = self.web.changeable(session, request.path_params["id"])
        form = await self.web.form(request)
        if str(form.get("confirm_name") or "") != row.name:
            raise ConsoleError(
                400, f"Type the endpoint's name ({row.name}) to confirm; nothing was deleted."
            )
        assert session.principal is not None
        await self._write(self.sources.endpoints.delete(session.principal, row.id))
        self.live.mark(row.id)
        return RedirectResponse("/console/endpoints", status_code=303)

    async def playground(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        context = self._endpoint_context(session, row)
        model = (
            self.sources.catalog.models.get(row.model_name)
            if row.model_name in self.sources.catalog.models
            else None
        )
        return self.web.render(request, session, "playground.html", model=model, **context)

    # --- usage -----------------------------------------------------------------------

    async def usage(self, request: Request, session: Session) -> Response:
        """This month's usage and cost per project, from the accounts meter
        (stored hourly figures plus what is not yet written)."""
        principal = session.principal
        assert principal is not None
        month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        projects = []
        for project in await self.sources.projects(principal):
            rows = await self.sources.usage.project_usage(principal, project, month, None)
            names = {r.id: r.name for r in self.sources.endpoints.rows()}
            lines: dict[str, dict[str, Any]] = {}
            for u in rows:
                line = lines.setdefault(
                    u.endpoint_id,
                    {"id": u.endpoint_id, "name": names.get(u.endpoint_id), "deleted_name": None,
                     "replica_hours": 0.0,
                     "requests": 0, "tokens": 0, "images": 0, "cost": 0.0},
                )  # fmt: skip
                line["replica_hours"] += u.replica_seconds / 3600
                line["requests"] += u.requests
                line["tokens"] += u.completion_tokens
                line["images"] += u.images
                line["cost"] += u.cost
            gone = [i for i, line in lines.items() if line["name"] is None]
            if gone:
                deleted = await self.sources.usage.names_of_deleted(principal, project, gone)
                for endpoint_id, name in deleted.items():
                    lines[endpoint_id]["deleted_name"] = name
            projects.append(
                {
                    "name": project,
                    "lines": sorted(lines.values(), key=lambda x: -x["cost"]),
                    "cost": sum(x["cost"] for x in lines.values()),
                }
            )
        return self.web.render(
            request,
            session,
            "usage.html",
            projects=projects,
            month=month,
            currency=self.sources.catalog.gpus.currency,
        )
