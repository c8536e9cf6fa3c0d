"""The endpoints board: a page of the endpoints the principal sees, a
filter by name and status, previous and next, and live updates of the page
shown (its rows polled from the live board and swapped in as they change).

A page is one of the store's keyset pages, as the API's list reads them
(`visible_page`: the principal's projects and the name prefix selected in
the store, the status on the rows it returns). A poll answers
from the live board: the rows of this page changed since the browser's
version, or the whole board when the page's set of rows changed (an
endpoint created or deleted, one whose status left or entered the filter,
a next page that appeared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferd.console.board_query import STATUSES, BadBoardQuery, BoardQuery
from inferd.console.live import LiveBoard
from inferd.console.pages.base import Pages, form_int
from inferd.console.security import Session
from inferd.console.views import RowView, ViewCache, ids_signature
from inferd.console.web import ConsoleError, Web
from inferd.control.accounts.roles import Principal
from inferd.control.model import Endpoint as EndpointRow
from inferd.control.paging import EndpointFilter
from inferd.errors import InferdError

PAGE_SIZE = 50
BOARD = "/console/endpoints"


@dataclass(frozen=True)
class BoardPage:
    """The rows a page shows, where the next page starts (None: this is the
    last), and the live board's versions it was read at."""

    ids: tuple[str, ...]
    after: int | None
    signature: str
    members_version: int
    version: int


def _page_key(principal: Principal, query: BoardQuery) -> tuple[Any, ...]:
    """Who sees which rows, and which page: what a page's rows depend on."""
    return (principal.operator, tuple(sorted(principal.roles.items())), query)


class Board(Pages):
    def __init__(self, web: Web, page_size: int = PAGE_SIZE) -> None:
        super().__init__(web)
        self.page_size = page_size
        row_template = web.env.get_template("_row.html")
        self.cache = ViewCache(lambda view: row_template.render(view=view))
        self.live = LiveBoard(self.view_of, self.sources.endpoints.endpoint_ids)
        self._pages: dict[tuple[Any, ...], BoardPage] = {}

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
        return self.cache.view(
            row, self.sources.endpoints.runtime_of(row.id), self.sources.cost_so_far(row.id)
        )

    def mark(self, endpoint_id: str) -> None:
        """This endpoint was just changed here: the next poll shows it."""
        self.live.mark(endpoint_id)

    def view_of(self, endpoint_id: str) -> RowView | None:
        row = self.sources.endpoints.find(endpoint_id)
        return None if row is None else self.view(row)

    # --- a page -----------------------------------------------------------------------

    async def _page(
        self, principal: Principal, query: BoardQuery, *, fresh: bool = False
    ) -> BoardPage:
        """The page's rows. A poll reads them from the store again only when
        the live board saw rows appear or go since (or, with a status filter,
        any row change: a change can move a row in or out of the filter); a
        page load (`fresh`) always does."""
        live = self.live
        key = _page_key(principal, query)
        known = self._pages.get(key)
        if (
            not fresh
            and known is not None
            and known.members_version == live.members_version
            and (not query.status or known.version == live.version)
        ):
            return known
        status = query.status

        def keep(row: Any) -> bool:
            return self.view(row).status == status

        try:
            page = await self.sources.endpoints.visible_page(
                principal,
                EndpointFilter(
                    model_name=query.model or None,
                    location_name=query.location or None,
                    name_prefix=query.name or None,
                ),
                query.after,
                self.page_size,
                keep if status else None,
            )
        except InferdError as exc:
            # The database away: a page that fits this instance's copy is
            # answered from it, any other is this error (a poll then keeps
            # the rows shown and tries again).
            raise ConsoleError(exc.status, exc.message) from None
        views = [self.view(row) for row in page.items]
        live.update(views)
        ids = tuple(v.id for v in views)
        # The next link is part of what the page shows.
        signature = ids_signature((*ids, "" if page.after is None else "+"))
        if len(self._pages) > 256:
            self._pages.clear()
        board_page = BoardPage(ids, page.after, signature, live.members_version, live.version)
        self._pages[key] = board_page
        return board_page

    def _views(self, ids: Sequence[str]) -> list[RowView]:
        views = (self.view_of(endpoint_id) for endpoint_id in ids)
        return [v for v in views if v is not None]

    def _query(self, request: Request) -> BoardQuery:
        try:
            return BoardQuery.read(request.query_params)
        except BadBoardQuery as exc:
            raise ConsoleError(400, str(exc)) from None

    async def _board(
        self, request: Request, session: Session, template: str, *, oob: bool = False
    ) -> Response:
        """The board (the whole page, or the board alone), its rows as they are now."""
        assert session.principal is not None
        query = self._query(request)
        page = await self._page(session.principal, query, fresh=not oob)
        views = self._views(page.ids)
        previous = query.previous()
        return self.web.render(
            request,
            session,
            template,
            query=query,
            statuses=STATUSES,
            models=[m.name for m in self.sources.models_for(session.principal)],
            locations=list(self.sources.catalog.gpus.locations),
            rows_html=[Markup(self.cache.html(v)) for v in views],
            version=self.live.version,
            signature=page.signature,
            previous=None if previous is None else previous.query_string(),
            next=None if page.after is None else query.next(page.after).query_string(),
            can_create=await self.web.can_create(session),
            oob=oob,
        )

    # --- the pages --------------------------------------------------------------------

    async def endpoints(self, request: Request, session: Session) -> Response:
        return await self._board(request, session, "endpoints.html")

    async def rows(self, request: Request, session: Session) -> Response:
        """The board alone, for a filter or another page (htmx swaps it in);
        the address bar then shows the page's own address."""
        response = await self._board(request, session, "_board.html")
        query = self._query(request).query_string()
        response.headers["HX-Push-Url"] = f"{BOARD}?{query}" if query else BOARD
        return response

    async def changes(self, request: Request, session: Session) -> Response:
        """The poll of a page: only its rows changed since the version the
        browser has (swapped in out of band), or the whole board when the
        page's set of rows changed. Usually answered from the live board
        without reading the store."""
        assert session.principal is not None
        params = request.query_params
        query = self._query(request)
        since = form_int(params.get("since"), 0)
        self.live.watch()
        self.live.refresh_marked()
        changed = self.live.changed_since(since)
        page = await self._page(session.principal, query)
        if page.signature != params.get("signature"):
            return await self._board(request, session, "_board.html", oob=True)
        on_page = set(page.ids)
        if changed is None:  # the browser's version is too old to say what changed
            changed = [v for v in self._views(page.ids) if self.live.version_of(v.id) > since]
        else:
            changed = [v for v in changed if v.id in on_page]
        return self.web.render(
            request,
            session,
            "_changes.html",
            changed=changed,
            version=self.live.version,
            query=query,
            signature=page.signature,
        )

    async def row(self, request: Request, session: Session) -> Response:
        row = self.web.endpoint(session, request.path_params["id"])
        return self.web.render(request, session, "_row.html", view=self.view(row), oob=False)
