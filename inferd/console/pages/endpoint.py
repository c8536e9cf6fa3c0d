"""One endpoint's page: its overview, the live part (replicas, status,
scale events) polled every few seconds, its charts, and its playground."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferd import COMPAT_FAMILY
from inferd.console.charts import endpoint_charts
from inferd.console.costs import Envelope
from inferd.console.pages.base import Pages
from inferd.console.security import Session
from inferd.console.views import RowView
from inferd.console.web import Web
from inferd.control.accounts.roles import Action
from inferd.control.batches.model import Batch, estimate
from inferd.control.model import Endpoint as EndpointRow

# Chart ranges: name -> (span, bucket), in seconds.
RANGES = {"hour": (3600, 60), "day": (86400, 900)}


class EndpointPage(Pages):
    def __init__(
        self,
        web: Web,
        view: Callable[[EndpointRow], RowView],
        last_lines: Callable[[EndpointRow], Awaitable[list[tuple[str, str]]]],
    ) -> None:
        """`view(row)`: the row as the board shows it; `last_lines(row)`: the
        end of each replica's log (the page comes with its log panel filled)."""
        super().__init__(web)
        self._view = view
        self._last_lines = last_lines

    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints/{id}", page(self.endpoint), methods=["GET"]),
            Route("/endpoints/{id}/live", page(self.live), methods=["GET"]),
            Route("/endpoints/{id}/charts", page(self.charts), methods=["GET"]),
            Route("/endpoints/{id}/playground", page(self.playground), methods=["GET"]),
        ]

    def _context(self, session: Session, row: EndpointRow) -> dict[str, Any]:
        assert session.principal is not None
        record = self.sources.endpoints.record(row.id)
        gpu_choices = []
        if row.model_name in self.sources.catalog.models:
            rec = self.sources.recommendation(
                row.model_name, row.location_name, row.engine_settings
            )
            gpu_choices = list(rec.options)
        return {
            "row": row,
            "record": record,
            "view": self._view(row),
            "option": self.sources.option(row),
            "envelope": Envelope(row.hourly_price, row.min_replicas, row.max_replicas),
            "gpu_choices": gpu_choices,
            "can_change": session.principal.may(Action.WRITE, row.project_id),
            "replicas": self.sources.replicas(row.id),
            "adapters": self.sources.adapters(row.id),
            "events": list(reversed(self.sources.scale_events(row.id)))[:50],
            "compat": COMPAT_FAMILY,
        }

    async def endpoint(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        token = session.take_reveal(row.id)
        # A client token just created: its name and the token, shown once.
        client_token = session.take_reveal(f"client:{row.id}")
        service = self.sources.client_tokens
        assert session.principal is not None
        tokens = None if service is None else await service.list(session.principal, row.id)
        return self.web.render(
            request,
            session,
            "endpoint.html",
            token=token,
            new_client_token=client_token.split("\n", 1) if client_token else None,
            client_tokens=tokens,
            batches=await self._batches(row),
            charts=self._charts(row, "hour"),
            range="hour",
            # The log panel comes filled, then follows the replicas' logs.
            tails=await self._last_lines(row),
            **self._context(session, row),
        )

    async def _batches(self, row: EndpointRow) -> list[dict[str, Any]] | None:
        """The endpoint's newest batches with their progress and estimated
        end, as the API shows them (None: no Batch API here)."""
        read = self.sources.batches
        if read is None:
            return None
        now = datetime.now(UTC)
        return [_batch_line(b, now) for b in await read(row.id)]

    async def live(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        return self.web.render(
            request,
            session,
            "_endpoint_live.html",
            badge_oob=True,
            **self._context(session, row),
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

    async def playground(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        context = self._context(session, row)
        model = (
            self.sources.catalog.models.get(row.model_name)
            if row.model_name in self.sources.catalog.models
            else None
        )
        return self.web.render(request, session, "playground.html", model=model, **context)


def _batch_line(batch: Batch, now: datetime) -> dict[str, Any]:
    counts = batch.counts
    done_at = estimate(batch, now).done_at
    return {
        "id": batch.id,
        "status": batch.status.value,
        "client": batch.client or "access token",
        "created": batch.created_at.strftime("%Y-%m-%d %H:%M"),
        "total": counts.total,
        "completed": counts.completed,
        "failed": counts.failed,
        "finished": counts.finished,
        "percent": 100 * counts.finished // counts.total if counts.total else 100,
        "ends": None if done_at is None else done_at.strftime("%Y-%m-%d %H:%M"),
        "final": batch.status.final,
    }
