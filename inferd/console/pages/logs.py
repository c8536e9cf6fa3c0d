"""An endpoint's replica logs: the panel's tail and the whole download,
read through each replica's launcher (this machine, or its Ray node)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.console.pages.base import Pages
from inferd.console.security import Session
from inferd.control.model import Endpoint as EndpointRow

LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 64 * 1024
LOG_DOWNLOAD_BYTES = 8 * 1024 * 1024


class Logs(Pages):
    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints/{id}/logs", page(self.logs), methods=["GET"]),
            Route("/endpoints/{id}/logs.txt", page(self.download), methods=["GET"]),
        ]

    async def _tails(self, row: EndpointRow, max_bytes: int) -> list[tuple[str, str]]:
        """Each replica's log, read through its launcher (on its node under Ray)."""
        tails = []
        for replica in self.sources.replicas(row.id):
            text = await self.sources.replica_log(replica.replica_id, max_bytes)
            if text is not None:
                tails.append((replica.replica_id, text))
        return tails

    async def last_lines(self, row: EndpointRow) -> list[tuple[str, str]]:
        """(replica id, its last lines) for each replica that wrote a log."""
        return [
            (rid, "\n".join(text.splitlines()[-LOG_TAIL_LINES:]))
            for rid, text in await self._tails(row, LOG_TAIL_BYTES)
        ]

    async def logs(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        tails = await self.last_lines(row)
        return self.web.render(request, session, "_logs.html", row=row, tails=tails)

    async def download(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        parts = [
            f"==> replica {rid} <==\n{text}"
            for rid, text in await self._tails(row, LOG_DOWNLOAD_BYTES)
        ]
        return PlainTextResponse(
            "\n".join(parts) or "No replica has written a log yet.\n",
            headers={"content-disposition": f'attachment; filename="{row.name}-logs.txt"'},
        )
