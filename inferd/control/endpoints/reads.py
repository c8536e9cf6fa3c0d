"""The endpoint reads: this instance's copy of the endpoints, who may see
which, and their records and pages as the API and the console show them.

Reads are served from this instance's copy (`EndpointCache`), kept fresh by
the store's change feed. The record, with its project and cost so far, is
built once per change and rendered once. Another project's endpoint is
answered exactly like one that does not exist (404, same message); a role
that may not act gets 403. While the database is away, reads go on from
memory. The writes are `EndpointCommands` (`inferd.control.endpoints.service`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from inferd.catalog import Catalog
from inferd.control.accounts.metering import UsageMeter
from inferd.control.accounts.model import DEFAULT_PROJECT
from inferd.control.accounts.roles import Action, Principal, authorize
from inferd.control.endpoints.cache import EndpointCache
from inferd.control.endpoints.checks import not_found
from inferd.control.endpoints.records import (
    DEFAULT_IMAGE_SIZE,
    EndpointRuntime,
    build_record,
    derive_status,
)
from inferd.control.model import Change, Endpoint, StoreUnavailable
from inferd.control.paging import EndpointFilter, Page
from inferd.control.ports import EndpointStore
from inferd.vocab import ModelKind

# What the reads learn from the serving side, given at construction: the
# replicas of an endpoint (for its record).
RuntimeOf = Callable[[str], EndpointRuntime]

# A status filter is applied to records, not in the store (status is derived
# from the replicas): one page reads at most this many store rows per item
# asked for before it answers, possibly short, with a cursor to go on from.
STATUS_SCAN_FACTOR = 10


def no_runtime(endpoint_id: str) -> EndpointRuntime:
    """A control plane that runs no replicas (the management API alone)."""
    return EndpointRuntime()


def render_json(value: Any) -> bytes:
    """The bytes Starlette's JSONResponse would send for `value`."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class EndpointReads:
    def __init__(
        self,
        store: EndpointStore,
        cache: EndpointCache,
        catalog: Catalog,
        meter: UsageMeter,
        *,
        public_url: str,
        runtime_of: RuntimeOf = no_runtime,
    ) -> None:
        """`runtime_of`: an endpoint's replicas as the registry and the
        reconciler know them (left out: none)."""
        self._store = store
        self._cache = cache
        self._catalog = catalog
        self._meter = meter
        self._public_url = public_url
        self.runtime_of = runtime_of

    # --- the copy ------------------------------------------------------------------------

    async def load(self) -> None:
        await self._cache.load()

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        await self._cache.follow(feed)

    def rows(self) -> list[Endpoint]:
        return self._cache.rows()

    def endpoint_ids(self) -> list[str]:
        return self._cache.endpoint_ids()

    def find(self, endpoint_id: str) -> Endpoint | None:
        return self._cache.find(endpoint_id)

    def find_by_name(self, name: str, project_id: str = DEFAULT_PROJECT) -> Endpoint | None:
        return self._cache.find_by_name(project_id, name)

    def row(self, endpoint_id: str) -> Endpoint:
        row = self._cache.find(endpoint_id)
        if row is None:
            raise not_found(endpoint_id)
        return row

    # --- access ----------------------------------------------------------------------------

    def endpoint(self, principal: Principal, endpoint_id: str, action: Action) -> Endpoint:
        """The endpoint, if `principal` may do `action` on it."""
        row = self.row(endpoint_id)
        authorize(principal, row.project_id, action, hidden=not_found(endpoint_id))
        return row

    def visible(self, principal: Principal, project_id: str | None = None) -> list[Endpoint]:
        return [
            r
            for r in self._cache.rows()
            if principal.sees(r.project_id) and (project_id is None or r.project_id == project_id)
        ]

    # --- records ---------------------------------------------------------------------------

    def _image_size(self, row: Endpoint) -> str:
        # The model's own default size, so the example works as pasted; a
        # model gone from the catalog since creation falls back to 1024x1024.
        if row.model_kind == ModelKind.IMAGE and row.model_name in self._catalog.models:
            size = self._catalog.models.get(row.model_name).default_size
            if size is not None:
                return f"{size[0]}x{size[1]}"
        return DEFAULT_IMAGE_SIZE

    def _cost(self, row: Endpoint) -> float:
        return round(self._meter.cost_so_far(row.id), 6)

    def _build(self, row: Endpoint, runtime: EndpointRuntime, cost: float) -> dict[str, Any]:
        return build_record(
            row,
            self._public_url,
            runtime.replicas,
            image_size=self._image_size(row),
            waiting_for=runtime.waiting_for,
            last_failure=runtime.last_failure,
            replacing=runtime.replacing,
            cost_so_far=cost,
        )

    def record_of(self, row: Endpoint) -> dict[str, Any]:
        return self._build(row, self.runtime_of(row.id), self._cost(row))

    def record(self, endpoint_id: str) -> dict[str, Any]:
        return self.record_of(self.row(endpoint_id))

    def record_json(self, row: Endpoint) -> bytes:
        """The record of `row` as JSON bytes, rendered once for everything it
        is computed from: the row object (frozen, replaced on every change),
        the replicas' views (frozen, compared by value) and the cost so far."""
        runtime, cost = self.runtime_of(row.id), self._cost(row)
        key = (row, runtime, cost)
        data = self._cache.rendered(row.id, key)
        if data is None:
            data = render_json(self._build(row, runtime, cost))
            self._cache.keep_rendered(row.id, key, data)
        return data

    def status_of(self, row: Endpoint) -> str:
        """The record's `status` (the list's status filter), without building it."""
        runtime = self.runtime_of(row.id)
        derived = derive_status(row, runtime.replicas, runtime.waiting_for, runtime.replacing)
        return derived.status.value

    # --- reads -----------------------------------------------------------------------------

    def get_json(self, principal: Principal, endpoint_id: str) -> bytes:
        return self.record_json(self.endpoint(principal, endpoint_id, Action.READ))

    async def visible_page(
        self,
        principal: Principal,
        where: EndpointFilter,
        after: int | None,
        limit: int,
        keep: Callable[[Endpoint], bool] | None = None,
    ) -> Page[Endpoint]:
        """One page of the endpoints `principal` sees, in the store's keyset
        order, and where the next page starts (None: the end). `where` selects
        in the store, narrowed to the principal's projects; `keep`, a condition
        the store cannot apply (the derived status), is applied to the rows
        read, reading at most STATUS_SCAN_FACTOR pages' worth: a page may then
        hold fewer than `limit` and still not be the last."""
        if not principal.operator:
            seen = frozenset(principal.roles)
            scope = seen if where.project_ids is None else seen & where.project_ids
            where = replace(where, project_ids=scope)
        rows: list[Endpoint] = []
        budget = limit * STATUS_SCAN_FACTOR
        while True:
            page = await self.page(where, after, limit - len(rows))
            budget -= len(page.items)
            rows.extend(row for row in page.items if keep is None or keep(row))
            after = page.after
            if after is None or len(rows) >= limit or budget <= 0:
                return Page(rows, after)

    async def page_json(
        self,
        principal: Principal,
        where: EndpointFilter,
        status: str | None,
        after: int | None,
        limit: int,
    ) -> tuple[bytes, int | None]:
        """One page of the endpoints `principal` sees (JSON records, without
        the list's envelope) and where the next page starts (None: the end)."""

        def in_status(row: Endpoint) -> bool:
            return self.status_of(row) == status

        page = await self.visible_page(
            principal, where, after, limit, None if status is None else in_status
        )
        return b",".join(self.record_json(row) for row in page.items), page.after

    async def page(self, where: EndpointFilter, after: int | None, limit: int) -> Page[Endpoint]:
        """A page of endpoints: which ones, from the store's keyset; their
        rows from this copy (as `record` answers them), or from the store for
        one this copy has not heard of yet (another instance's create)."""
        try:
            page = await self._store.page_endpoint_ids(where, after, limit)
        except StoreUnavailable:
            return self._page_from_copy(where, after, limit)
        rows: list[Endpoint] = []
        for endpoint_id in page.items:
            row = self._cache.find(endpoint_id) or await self._store.get_endpoint(endpoint_id)
            if row is not None:  # None: deleted since the page was read
                rows.append(row)
        return Page(rows, page.after)

    def _page_from_copy(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[Endpoint]:
        """While the store is down, reads go on from this instance's copy (as
        `record` does), as long as the answer is one whole list: a cursor is
        a store position, which the copy does not know."""
        matching = [row for row in self._cache.rows() if where.matches(row)]
        if after is not None or len(matching) > limit:
            raise StoreUnavailable(
                "The database is unreachable: only a list that fits one page can be answered "
                "from this instance's copy meanwhile."
            )
        return Page(matching, None)
