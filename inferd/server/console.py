"""The console's wiring: its sources from the control plane (and, in
`inferd serve`, from the runtime: replicas, scale events, series, logs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.routing import Mount

from inferd.console.app import Console
from inferd.console.sources import ConsoleSources, ReplicaLine

if TYPE_CHECKING:
    from inferd.server.app import ControlPlane
    from inferd.server.runtime import Runtime


def console_sources(plane: ControlPlane, runtime: Runtime | None = None) -> ConsoleSources:
    accounts = plane.accounts
    sources = ConsoleSources(
        service=plane.service,
        endpoints=accounts.endpoints,
        accounts=accounts.service,
        catalog=plane.catalog,
        # The same resolver as the management API: operator key or user key.
        resolve=accounts.resolver.resolve,
        public_url=plane.settings.public_url,
        cost_so_far=accounts.meter.cost_so_far,
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
        sources.log_dir = plane.settings.state_dir / "logs"  # where build_launcher puts them
    return sources


def console_mount(plane: ControlPlane, runtime: Runtime | None = None) -> Mount:
    return Console(console_sources(plane, runtime)).mount()
