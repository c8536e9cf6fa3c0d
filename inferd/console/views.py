"""What the console's pages show, as frozen values built from the records
the service layer returns (the same dicts the REST API sends).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inferd.control.endpoints.records import EndpointRuntime, ReplicaStatus, derive_status
from inferd.control.model import Endpoint as EndpointRow


@dataclass(frozen=True)
class RowView:
    id: str
    name: str
    project: str
    model: str
    gpu_type: str
    gpu_count: int
    location: str
    status: str
    reason: str | None
    replicas_now: int
    replicas_min: int
    replicas_max: int
    hourly_price: float
    price_now: float  # $/h of the replicas up now
    cost_so_far: float
    currency: str

    @property
    def gpu(self) -> str:
        return "CPU" if self.gpu_type == "cpu" else f"{self.gpu_type} x {self.gpu_count}"


def row_view_of(row: EndpointRow, runtime: EndpointRuntime, cost: float) -> RowView:
    """A row of the list, from the stored row and its replicas directly (not
    the full record): the list's poll builds one per endpoint."""
    derived = derive_status(row, runtime.replicas, runtime.waiting_for, runtime.replacing)
    now = sum(1 for r in runtime.replicas if r.status not in ReplicaStatus.gone())
    return RowView(
        id=row.id,
        name=row.name,
        project=row.project_id,
        model=row.model_name,
        gpu_type=row.gpu_type,
        gpu_count=row.gpu_count,
        location=row.location_name,
        status=derived.status.value,
        reason=derived.reason,
        replicas_now=now,
        replicas_min=row.min_replicas,
        replicas_max=row.max_replicas,
        hourly_price=row.hourly_price,
        price_now=now * row.hourly_price,
        # Rounded to the cent shown, so the row changes when the figure does.
        cost_so_far=round(cost, 2),
        currency=row.currency,
    )


def ids_signature(ids: Iterable[str]) -> str:
    """A short digest of which rows a list shows, in order."""
    digest = hashlib.blake2b(digest_size=8)
    for endpoint_id in ids:
        digest.update(endpoint_id.encode())
        digest.update(b"\0")
    return digest.hexdigest()


class ViewCache:
    """Each row's view and its rendered HTML, rebuilt only when what it is
    made of changed: the stored row (frozen, replaced on every change, so
    identity is its version), the replicas (frozen, compared by value) and
    the cost in cents. A list of a thousand endpoints then costs a thousand
    comparisons and a join, not a thousand renders."""

    def __init__(self, render_row: Callable[[RowView], str]) -> None:
        self._render_row = render_row
        self._views: dict[str, tuple[EndpointRow, EndpointRuntime, float, RowView]] = {}
        self._html: dict[RowView, str] = {}

    def view(self, row: EndpointRow, runtime: EndpointRuntime, cost: float) -> RowView:
        cents = round(cost, 2)
        known = self._views.get(row.id)
        if known is not None and known[0] is row and known[2] == cents and known[1] == runtime:
            return known[3]
        view = row_view_of(row, runtime, cents)
        self._views[row.id] = (row, runtime, cents, view)
        return view

    def html(self, view: RowView) -> str:
        html = self._html.get(view)
        if html is None:
            if len(self._html) > 4 * max(len(self._views), 256):
                self._html.clear()  # views of rows long changed
            html = self._html[view] = self._render_row(view)
        return html

    def forget_missing(self, ids: set[str]) -> None:
        for endpoint_id in [k for k in self._views if k not in ids]:
            del self._views[endpoint_id]
