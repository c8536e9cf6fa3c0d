"""The console, mounted at `/console` by `inferd serve`: its pages, one
module per feature in `inferd.console.pages`, over the shared request
plumbing of `inferd.console.web`.

Route functions do HTTP only: read the form, call the service layer (the
same endpoint reads and commands the REST API calls), render a template. Pages that
change something check the principal's role on the server, whatever the
page showed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Router
from starlette.staticfiles import StaticFiles

from inferd.console.live import LiveBoard
from inferd.console.pages.base import Pages
from inferd.console.pages.board import Board
from inferd.console.pages.client_tokens import ClientTokens
from inferd.console.pages.create import Create
from inferd.console.pages.delete import Delete
from inferd.console.pages.endpoint import EndpointPage
from inferd.console.pages.logs import Logs
from inferd.console.pages.settings import Settings
from inferd.console.pages.signin import SignIn
from inferd.console.pages.token import Token
from inferd.console.pages.usage import Usage
from inferd.console.security import SecurityHeaders, SessionStore, content_security_policy
from inferd.console.sources import ConsoleSources
from inferd.console.web import Web

STATIC = Path(__file__).parent / "static"


class Console:
    def __init__(self, sources: ConsoleSources, sessions: SessionStore | None = None) -> None:
        self.sources = sources
        self.web = Web(sources, sessions or SessionStore())
        self.board = Board(self.web)
        logs = Logs(self.web)
        mark = self.board.mark
        # In matching order: the board's and the create form's fixed paths
        # (`/endpoints/rows`, `/endpoints/new`) before `/endpoints/{id}`.
        self.pages: list[Pages] = [
            SignIn(self.web),
            self.board,
            Create(self.web, mark),
            EndpointPage(self.web, self.board.view, logs.last_lines),
            logs,
            Settings(self.web, mark),
            Token(self.web),
            ClientTokens(self.web),
            Delete(self.web, mark),
            Usage(self.web),
        ]

    @property
    def live(self) -> LiveBoard:
        """The endpoints board's live updates."""
        return self.board.live

    def routes(self) -> list[BaseRoute]:
        return [
            *(route for pages in self.pages for route in pages.routes()),
            Mount("/static", app=StaticFiles(directory=STATIC), name="console-static"),
        ]

    async def close(self) -> None:
        await self.board.close()

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
