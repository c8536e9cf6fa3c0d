"""What the console reads and calls: the same service layer as the REST API.

`ConsoleSources` is filled in by the composition of `inferd serve` (see
`inferd.server.app`); the console never calls its own JSON API over HTTP.
The parts of the runtime (scale journal, series, replicas, logs) are
optional, so the console also runs over a bare control plane in tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferd.catalog import Catalog, recommend
from inferd.catalog.recommend import GpuOption, Recommendation
from inferd.console.principal import DEFAULT_PROJECT, ConsolePrincipal
from inferd.control.scale_events import ScaleEvent
from inferd.control.service import EndpointService
from inferd.control.store import EndpointRow
from inferd.control.timeseries import EndpointSeries


@dataclass(frozen=True)
class ReplicaLine:
    """A replica as the endpoint page lists it."""

    replica_id: str
    status: str
    since: str
    reason: str | None


def _no_replicas(endpoint_id: str) -> Sequence[ReplicaLine]:
    return ()


def _no_events(endpoint_id: str) -> Sequence[ScaleEvent]:
    return ()


def _held(endpoint_id: str) -> int:
    return 0


@dataclass
class ConsoleSources:
    service: EndpointService
    catalog: Catalog
    # A key typed at sign-in -> who it is, or None.
    authenticate: Callable[[str], ConsolePrincipal | None]
    public_url: str
    series: EndpointSeries = field(default_factory=EndpointSeries)
    scale_events: Callable[[str], Sequence[ScaleEvent]] = _no_events
    replicas: Callable[[str], Sequence[ReplicaLine]] = _no_replicas
    held: Callable[[str], int] = _held
    log_dir: Path | None = None
    project_of: Callable[[EndpointRow], str] = lambda row: DEFAULT_PROJECT
    projects: Callable[[], list[str]] = lambda: [DEFAULT_PROJECT]
    _recommendations: dict[tuple[str, str], Recommendation] = field(default_factory=dict)

    def recommendation(self, model_name: str, location: str) -> Recommendation:
        """The catalog does not change while the server runs: computed once."""
        key = (model_name, location)
        rec = self._recommendations.get(key)
        if rec is None:
            rec = recommend(self.catalog.models.get(model_name), self.catalog.gpus, location)
            self._recommendations[key] = rec
        return rec

    def option(self, row: EndpointRow) -> GpuOption | None:
        """The recommender's estimate for an endpoint's own GPU choice."""
        if row.model_name not in self.catalog.models:
            return None
        rec = self.recommendation(row.model_name, row.location_name)
        for opt in (*rec.options, *rec.rejected):
            if (opt.gpu_type, opt.gpu_count) == (row.gpu_type, row.gpu_count):
                return opt
        return None

    def visible_rows(self, principal: ConsolePrincipal) -> list[EndpointRow]:
        return [row for row in self.service.rows() if principal.sees(self.project_of(row))]

    def log_path(self, replica_id: str) -> Path | None:
        if self.log_dir is None:
            return None
        return self.log_dir / f"replica-{replica_id}.log"
