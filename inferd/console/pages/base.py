"""What every page module shares: the request plumbing (`Web`: session,
sign-in and CSRF checks, rendering, the endpoint a principal may open) and
the reading of a form's numbers."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.routing import BaseRoute

from inferd.console.web import ConsoleError, Web
from inferd.errors import InferdError

T = TypeVar("T")


def form_int(value: Any, default: int) -> int:
    """A number typed in a form, or `default` when it is not one (the
    service's own validation then says what is wrong with the value)."""
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


async def written(call: Awaitable[T]) -> T:
    """A write through the accounts layer; its refusals become pages."""
    try:
        return await call
    except InferdError as exc:
        raise ConsoleError(exc.status, exc.message) from None


class Pages:
    """One feature's pages: `routes()` lists them, each wrapped by
    `web.page` (session, sign-in, CSRF, error pages)."""

    def __init__(self, web: Web) -> None:
        self.web = web
        self.sources = web.sources

    def routes(self) -> list[BaseRoute]:
        raise NotImplementedError
