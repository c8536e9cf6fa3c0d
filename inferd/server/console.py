"""The console's wiring: its sources from the control plane (and, in
`inferd serve`, from the runtime: replicas, scale events, series, logs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.routing import Mount

from inferd.console.app import Console
from inferd.console.principal import ConsolePrincipal, operator
from inferd.console.sources import ConsoleSources, ReplicaLine

if TYPE_CHECKING:
    from inferd.server.app import ControlPlane
    from inferd.server.runtime import Runtime


def console_sources(plane: ControlPlane, runtime: Runtime | None = None) -> ConsoleSources:
    def authenticate(key: str) -> ConsolePrincipal | None:
        # The operator's admin key is the superuser.
        return operator() if plane.admin.is_valid(key) else None

    sources = ConsoleSources(
        service=plane.service,
        catalog=plane.catalog,
        authenticate=authenticate,
        public_url=plane.settings.public_url,
    )
    if runtime is not None:
        registry = runtime.registry
        sources.series = runtime.series
        sources.scale_events = runtime.reconciler.journal.of_endpoint
        sources.replicas = lambda endpoint_id: [
            ReplicaLine(
                r.replica_id, r.status.value, r.status_since_wall or r.created_wall, r.reason
            )
            for r in registry.of_endpoint(endpoint_id)
        ]
        sources.held = lambda endpoint_id: runtime.gateway.traffic(endpoint_id).held
        sources.log_dir = plane.settings.state_dir / "logs"  # where build_launcher puts them
    return sources


def console_mount(plane: ControlPlane, runtime: Runtime | None = None) -> Mount:
    return Console(console_sources(plane, runtime)).mount()
