"""This month's usage and cost per project."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferd.console.pages.base import Pages
from inferd.console.security import Session


class Usage(Pages):
    def routes(self) -> list[BaseRoute]:
        return [Route("/usage", self.web.page(self.usage), methods=["GET"])]

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
