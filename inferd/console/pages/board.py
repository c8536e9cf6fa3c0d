"""The endpoints board: the list, its search, and its live updates (rows
polled from the live board and swapped in as they change)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferd.console.live import LiveBoard
from inferd.console.pages.base import Pages, form_int
from inferd.console.security import Session
from inferd.console.views import RowView, ViewCache, ids_signature, matches
from inferd.console.web import Web
from inferd.control.accounts.roles import Principal
from inferd.control.model import Endpoint as EndpointRow


def _list_key(principal: Principal, query: str) -> tuple[Any, ...]:
    """Who sees which rows, and the search: what a list's signature depends on."""
    return (principal.operator, tuple(sorted(principal.roles.items())), query)


class Board(Pages):
    def __init__(self, web: Web) -> None:
        super().__init__(web)
        row_template = web.env.get_template("_row.html")
        self.cache = ViewCache(lambda view: row_template.render(view=view))
        self.live = LiveBoard(self.view_of, self.sources.endpoints.endpoint_ids)
        # (operator, roles, query) -> (members version, version, signature)
        self._signatures: dict[tuple[Any, ...], tuple[int, int, str]] = {}

    def routes(self) -> list[BaseRoute]:
        page = self.web.page
        return [
            Route("/endpoints", page(self.endpoints), methods=["GET"]),
            Route("/endpoints/rows", page(self.rows), methods=["GET"]),
            Route("/endpoints/changes", page(self.changes), methods=["GET"]),
            Route("/endpoints/{id}/row", page(self.row), methods=["GET"]),
        ]

    async def close(self) -> None:
        await self.live.close()

    # --- rows, as the other pages see them --------------------------------------------

    def view(self, row: EndpointRow) -> RowView:
        """An endpoint's row as the board shows it now."""
        return self._views([row])[0]

    def mark(self, endpoint_id: str) -> None:
        """This endpoint was just changed here: the next poll shows it."""
        self.live.mark(endpoint_id)

    def view_of(self, endpoint_id: str) -> RowView | None:
        row = self.sources.endpoints.find(endpoint_id)
        if row is None:
            return None
        runtime = self.sources.endpoints.runtime_of(endpoint_id)
        return self.cache.view(row, runtime, self.sources.cost_so_far(endpoint_id))

    def _views(self, rows: Sequence[EndpointRow]) -> list[RowView]:
        runtime_of, cost, view = (
            self.sources.endpoints.runtime_of,
            self.sources.cost_so_far,
            self.cache.view,
        )
        return [view(r, runtime_of(r.id), cost(r.id)) for r in rows]

    # --- what a list shows ------------------------------------------------------------

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

    # --- the pages --------------------------------------------------------------------

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
        since = form_int(params.get("since"), 0)
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
        return self.web.render(request, session, "_row.html", view=self.view(row), oob=False)
