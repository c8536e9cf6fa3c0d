"""Keyset pages of the stores' lists: what to select, where to resume.

A list is read a page at a time in a fixed order of a stored, never-reused
position (SQLite's rowid, PostgreSQL's identity `seq`, the memory store's
insertion counter). A page is "up to `limit` items after position `after`";
the next page starts after the last item's position. Paging through a list
while others insert and delete therefore returns every item that exists for
the whole walk exactly once, in order; items added or removed meanwhile may
or may not appear. No offset, no count, no full list read and sliced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from inferd.control.model import Endpoint

T = TypeVar("T")

# Without `limit` a list answers this many items: a page as large as the
# biggest list answered whole before pages existed (the audit log's cap),
# so existing clients of small lists see the same items as before.
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True)
class Page(Generic[T]):
    """`items` in list order; `after`: the position to resume from, or None
    at the end of the list. A page may hold fewer than `limit` items and
    still not be the last (a filter the store cannot apply skipped some)."""

    items: Sequence[T]
    after: int | None


@dataclass(frozen=True)
class EndpointFilter:
    """Which endpoints a page holds; None: no condition on that field.
    `project_ids`: the projects the caller may see (None: every project, the
    operator's view); an empty set selects nothing."""

    project_ids: frozenset[str] | None = None
    model_name: str | None = None
    location_name: str | None = None
    name_prefix: str | None = None

    def matches(self, endpoint: Endpoint) -> bool:
        return (
            (self.project_ids is None or endpoint.project_id in self.project_ids)
            and (self.model_name is None or endpoint.model_name == self.model_name)
            and (self.location_name is None or endpoint.location_name == self.location_name)
            and (self.name_prefix is None or endpoint.name.startswith(self.name_prefix))
        )

    def selects_nothing(self) -> bool:
        return self.project_ids is not None and not self.project_ids


def page_of(rows: Sequence[tuple[int, T]], limit: int) -> Page[T]:
    """A page from up to `limit + 1` rows (position, item) read in order: the
    extra row only says that more follow."""
    if len(rows) > limit:
        kept = rows[:limit]
        return Page([item for _, item in kept], kept[-1][0])
    return Page([item for _, item in rows], None)
