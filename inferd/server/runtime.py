"""The serving half of `inferd serve`: registry, launcher, gateway, reconciler.

`attach_runtime(plane)` builds them, plugs them into the management side
(the record's replicas and status, the drain on delete) and the app's
lifespan, and returns the routes to mount: the gateway, the registry's
report route and `/metrics`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferd.control.launchers.inventory import detect_gpus, match_gpu_type
from inferd.control.launchers.local import LocalLauncher
from inferd.control.load import MergedLoad
from inferd.control.ports import Launcher
from inferd.control.reconciler import Reconciler, ReconcilerSettings
from inferd.control.records import EndpointRuntime, ReplicaView
from inferd.control.registry import Registry
from inferd.control.registry_api import REGISTRY_PATH, ReplicaCollector, report_route
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute
from inferd.gateway.openapi import gateway_openapi
from inferd.gateway.settings import GatewaySettings
from inferd.replica.config import ReplicaSettings, model_source
from inferd.server.app import ControlPlane
from inferd.settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    registry: Registry
    launcher: Launcher
    gateway: Gateway
    reconciler: Reconciler

    def endpoint_runtime(self, endpoint_id: str) -> EndpointRuntime:
        views = tuple(
            ReplicaView(
                gpus=r.gpu_count,
                status=r.status,
                generation=r.generation,
                reason=r.reason,
                replica_id=r.replica_id,
                since=r.status_since_wall or None,
            )
            for r in self.registry.of_endpoint(endpoint_id)
        )
        return EndpointRuntime(views, self.reconciler.capacity_reason(endpoint_id))


def registry_url(settings: Settings) -> str:
    host = settings.host
    dial = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in dial and not dial.startswith("["):
        dial = f"[{dial}]"
    return f"http://{dial}:{settings.port}{REGISTRY_PATH}"


def replica_settings(settings: Settings) -> ReplicaSettings:
    return ReplicaSettings(
        registry_url=registry_url(settings),
        report_interval_s=settings.health_period_seconds,
        orphan_timeout_s=settings.replica_orphan_timeout_seconds,
        drain_timeout_s=settings.replica_drain_timeout_seconds,
        log_level=settings.log_level,
        replica_args=settings.replica_args,
    )


def build_launcher(plane: ControlPlane) -> Launcher:
    if plane.settings.launcher == "ray":
        return build_ray_launcher(plane)
    return build_local_launcher(plane)


class LauncherUnavailable(RuntimeError):
    """The chosen launcher cannot start (a missing extra, a missing setting,
    an unreachable cluster)."""


def build_ray_launcher(plane: ControlPlane) -> Launcher:
    """Imports Ray: only when it was chosen."""
    settings = plane.settings
    try:
        from inferd.control.launchers.ray_launcher import RayLauncher
    except ImportError as exc:
        raise LauncherUnavailable(
            f"--launcher ray needs Ray (pip install 'inferd[ray]'): {exc}"
        ) from None
    if not settings.ray_address:
        raise LauncherUnavailable("--launcher ray needs --ray-address HOST:PORT (the head's GCS)")
    try:
        return RayLauncher(
            address=settings.ray_address,
            namespace=settings.ray_namespace,
            settings=replica_settings(settings),
            node_ip_address=settings.ray_node_ip_address,
        )
    except (ConnectionError, RuntimeError) as exc:
        raise LauncherUnavailable(
            f"cannot reach the Ray cluster at {settings.ray_address}: {exc}"
        ) from None


def build_local_launcher(plane: ControlPlane) -> LocalLauncher:
    settings = plane.settings
    gpu_types = plane.catalog.gpus.gpu_types
    gpus = [(gpu, match_gpu_type(gpu, gpu_types)) for gpu in detect_gpus()]
    for gpu, gpu_type in gpus:
        logger.info("GPU %d: %s -> %s", gpu.index, gpu.name, gpu_type or "(no catalog type)")
    return LocalLauncher(
        settings=replica_settings(settings),
        log_dir=settings.state_dir / "logs",
        gpus=gpus,
        cpu_slots=settings.cpu_replica_slots,
        location=settings.default_location,
    )


def attach_runtime(plane: ControlPlane, launcher: Launcher | None = None) -> Runtime:
    settings = plane.settings
    # The reconciler is woken by the registry; it exists after the registry,
    # so the callbacks look it up late.
    holder: dict[str, Reconciler] = {}

    def wake(endpoint_id: str) -> None:
        if "r" in holder:
            holder["r"].wake(endpoint_id)

    def endpoint_route(endpoint_id: str) -> EndpointRoute | None:
        row = plane.service.find(endpoint_id)
        if row is None:
            return None
        return EndpointRoute(
            row.id, row.model_kind, row.model_name, deleting=row.deleting_at is not None
        )

    registry = Registry(
        endpoints=endpoint_route,
        health_period_s=settings.health_period_seconds,
        failure_periods=settings.health_failure_periods,
        start_timeout_s=settings.replica_start_timeout_seconds,
        on_change=wake,
        on_capacity_request=wake,
    )
    gateway = Gateway(
        registry,
        plane.verifier,
        GatewaySettings(
            max_body_bytes=settings.max_body_bytes,
            max_in_flight_per_replica=settings.gateway_max_in_flight_per_replica,
            max_held_requests=settings.gateway_max_queued_per_endpoint,
            max_hold_seconds=settings.gateway_hold_timeout_seconds,
        ),
    )
    launcher = launcher or build_launcher(plane)

    def model_of(name: str) -> Any:
        return model_source(plane.catalog.models.get(name))

    reconciler = Reconciler(
        registry=registry,
        launcher=launcher,
        load=MergedLoad(gateway, registry, clock=gateway.clock),
        aborter=gateway,
        records=plane.store,
        endpoints=plane.service.rows,
        models=model_of,
        settings=ReconcilerSettings(
            period_s=settings.reconcile_period_seconds,
            drain_timeout_s=settings.replica_drain_timeout_seconds,
            target_concurrency=settings.autoscale_target_concurrency,
            upscale_delay_s=settings.autoscale_upscale_delay_seconds,
            downscale_delay_s=settings.autoscale_downscale_delay_seconds,
        ),
    )
    holder["r"] = reconciler
    runtime = Runtime(registry, launcher, gateway, reconciler)
    plane.service.runtime_of = runtime.endpoint_runtime
    plane.service.drain = lambda row: reconciler.drain_endpoint(row.id)
    plane.service.capacity_of = launcher.capacity

    async def start() -> None:
        rows = await plane.store.list_replicas()
        adopted = set(await reconciler.adopt(rows, plane.service.rows()))
        sweep = getattr(launcher, "sweep_orphans", None)
        if sweep is not None:  # a cluster may hold replicas the store never recorded
            await sweep(adopted)
        for row in rows:
            if row.id not in adopted:
                await plane.store.delete_replica(row.id)
        if rows:
            logger.info("adopted %d of %d replicas from the last run", len(adopted), len(rows))
        await gateway.startup()
        reconciler.start()

    async def stop() -> None:
        await reconciler.stop()
        await gateway.shutdown()
        # Embedded mode owns its replicas: a clean stop leaves none running.
        await launcher.shutdown(settings.replica_drain_timeout_seconds)
        for replica in registry.all():
            registry.remove(replica.replica_id)
            await plane.store.delete_replica(replica.replica_id)

    plane.on_startup.append(start)
    plane.on_shutdown.append(stop)
    return runtime


def runtime_openapi() -> dict[str, Any]:
    """OpenAPI paths and components of the public routes of `runtime_routes`
    (the registry's report route is internal: replicas only)."""
    part = gateway_openapi()
    part["paths"]["/metrics"] = {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics of the gateway and the replicas by status",
            "responses": {
                "200": {
                    "description": "Prometheus text exposition format.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
            "security": [],
        }
    }
    return part


def runtime_routes(runtime: Runtime) -> Sequence[BaseRoute]:
    registry = runtime.registry

    metrics_registry = CollectorRegistry(auto_describe=True)
    metrics_registry.register(ReplicaCollector(registry))

    async def metrics(request: Request) -> Response:
        body = runtime.gateway.metrics.render() + bytes(generate_latest(metrics_registry))
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return [
        *gateway_routes(runtime.gateway),
        report_route(registry),
        Route("/metrics", metrics, methods=["GET"]),
    ]
