"""What the endpoints board shows: its filters and which page, as read from
and written into its address, so that a page, a filter and the previous and
next links work the same with htmx and without scripts.

Pages are the store's keyset pages (`inferd.control.paging`): a page is
"the next N endpoints after position p". Keyset pages only go forward, so
the address keeps the trail of positions where each page so far started
(`page=120.245`: the third page, after positions 120 then 245); "previous"
drops the last one. A position grants nothing (every page is read in the
principal's own scope), so the trail is plain; one that does not parse is
refused, one that names positions since deleted still pages correctly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import pairwise
from urllib.parse import urlencode

from inferd.vocab import EndpointStatus

STATUSES = tuple(s.value for s in EndpointStatus)
MAX_TRAIL_CHARS = 8192  # about 800 pages deep
MAX_NAME_CHARS = 256


class BadBoardQuery(ValueError):
    """An address the board cannot read (the message says why, in words)."""


@dataclass(frozen=True)
class BoardQuery:
    name: str = ""  # a name prefix ('': any name)
    status: str = ""  # an endpoint status ('': any status)
    # Where each page after the first started; this page's start last.
    starts: tuple[int, ...] = ()
    model: str = ""  # a model name, exactly ('': any model)
    location: str = ""  # a location name, exactly ('': anywhere)

    @classmethod
    def read(cls, params: Mapping[str, str]) -> BoardQuery:
        # Endpoint names are lower case: typing "Chat" finds "chat-1".
        name = params.get("name", "").strip().lower()
        status = params.get("status", "").strip()
        if status and status not in STATUSES:
            raise BadBoardQuery(f"There is no endpoint status '{status}'.")
        model = params.get("model", "").strip()
        location = params.get("location", "").strip()
        # Names only select (a model or location nobody sees selects
        # nothing); the bound keeps a crafted address from being stored.
        if len(model) > MAX_NAME_CHARS or len(location) > MAX_NAME_CHARS:
            raise BadBoardQuery("That filter is longer than any model or location name.")
        return cls(name, status, _trail(params.get("page", "")), model, location)

    @property
    def after(self) -> int | None:
        """The store position this page starts after (None: the first page)."""
        return self.starts[-1] if self.starts else None

    @property
    def number(self) -> int:
        return len(self.starts) + 1

    @property
    def filtered(self) -> bool:
        return bool(self.name or self.status or self.model or self.location)

    def previous(self) -> BoardQuery | None:
        return None if not self.starts else replace(self, starts=self.starts[:-1])

    def next(self, after: int) -> BoardQuery:
        return replace(self, starts=(*self.starts, after))

    def params(self) -> dict[str, str]:
        """The address's query parameters (only those set)."""
        params = {
            "name": self.name,
            "status": self.status,
            "model": self.model,
            "location": self.location,
        }
        params["page"] = ".".join(map(str, self.starts))
        return {k: v for k, v in params.items() if v}

    def query_string(self) -> str:
        return urlencode(self.params())


def _trail(text: str) -> tuple[int, ...]:
    if not text:
        return ()
    if len(text) > MAX_TRAIL_CHARS:
        raise BadBoardQuery("That page address is too long; start again from the first page.")
    parts = text.split(".")
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise BadBoardQuery("That page address is not one the console made.")
    starts = tuple(int(p) for p in parts)
    if any(b <= a for a, b in pairwise(starts)):
        raise BadBoardQuery("That page address is not one the console made.")
    return starts
