"""The serving half of `inferd serve`: registry, launcher, gateway, reconciler.

`attach_runtime(plane)` builds them, plugs them into the management side
(the record's replicas and status, the drain on delete) and the app's
lifespan, and returns the routes to mount: the gateway, the registry's
report route and `/metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.control.launchers.inventory import detect_gpus, match_gpu_type
from inferd.control.launchers.local import LocalLauncher
from inferd.control.leader import LeaderInfo, PostgresElection
from inferd.control.loadshare import max_age
from inferd.control.model import Endpoint
from inferd.control.reconciler import Reconciler, ReconcilerSettings
from inferd.control.records import EndpointRuntime, ReplicaView
from inferd.control.registry import Registry, ReportRejected
from inferd.control.replica_mirror import ReplicaMirror
from inferd.errors import error_body
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute
from inferd.gateway.openapi import gateway_openapi
from inferd.gateway.settings import GatewaySettings
from inferd.http import parse_json_object, read_body
from inferd.server.app import ControlPlane
from inferd.server.cluster import (
    CallbackDuty,
    ClusterLoadFeed,
    ClusterTraffic,
    LeaderDutySet,
    LoadPublisher,
)
from inferd.settings import Settings

logger = logging.getLogger(__name__)

REGISTRY_PATH = "/internal/registry"
_MAX_REPORT_BYTES = 64 * 1024


@dataclass
class ClusterMember:
    """This instance's part in a cluster (set when `database_url` is)."""

    instance_id: str
    election: PostgresElection
    publisher: LoadPublisher
    mirror: ReplicaMirror

    def health(self) -> dict[str, Any]:
        info: LeaderInfo | None = self.election.info
        leading = self.election.leading
        return {
            "instance": self.instance_id,
            "leader": {
                "instance": self.instance_id if leading else (info.holder if info else None),
                "term": info.term if info else None,
                "self": leading,
            },
        }


@dataclass
class Runtime:
    registry: Registry
    launcher: LocalLauncher
    gateway: Gateway
    reconciler: Reconciler
    cluster: ClusterMember | None = None

    def health(self) -> dict[str, Any]:
        return self.cluster.health() if self.cluster is not None else {}

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


def build_launcher(plane: ControlPlane) -> LocalLauncher:
    settings = plane.settings
    gpu_types = plane.catalog.gpus.gpu_types
    gpus = [(gpu, match_gpu_type(gpu, gpu_types)) for gpu in detect_gpus()]
    for gpu, gpu_type in gpus:
        logger.info("GPU %d: %s -> %s", gpu.index, gpu.name, gpu_type or "(no catalog type)")
    args = [
        "--report-interval", str(settings.health_period_seconds),
        "--orphan-timeout", str(settings.replica_orphan_timeout_seconds),
        "--drain-timeout", str(settings.replica_drain_timeout_seconds),
        "--models-dir", str(settings.models_dir),
        "--log-level", settings.log_level,
        *shlex.split(settings.replica_args),
    ]  # fmt: skip
    for base in filter(None, (u.strip() for u in settings.replica_report_fallback_urls.split(","))):
        args += ["--registry-fallback-url", base.rstrip("/") + REGISTRY_PATH]
    return LocalLauncher(
        registry_url=registry_url(settings),
        log_dir=settings.state_dir / "logs",
        gpus=gpus,
        cpu_slots=settings.cpu_replica_slots,
        replica_args=args,
    )


class _ReplicaCollector(Collector):
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "inferd_replicas", "Replicas by endpoint and status.", labels=["endpoint", "status"]
        )
        counts: dict[tuple[str, str], int] = {}
        for replica in self._registry.all():
            key = (replica.endpoint_id, replica.status.value)
            counts[key] = counts.get(key, 0) + 1
        for (endpoint, status), count in sorted(counts.items()):
            family.add_metric([endpoint, status], count)
        return [family]

    def describe(self) -> list[GaugeMetricFamily]:
        return []


def is_postgres(url: str) -> bool:
    return url.partition(":")[0].lower() in ("postgresql", "postgres")


def default_instance_id(settings: Settings) -> str:
    return f"{socket.gethostname()}:{settings.port}"


def attach_runtime(plane: ControlPlane, launcher: LocalLauncher | None = None) -> Runtime:
    settings = plane.settings
    cluster_url = settings.database_url if is_postgres(settings.database_url) else None
    instance_id = settings.instance_id or default_instance_id(settings)
    # The reconciler is woken by the registry; it exists after the registry,
    # so the callbacks look it up late.
    holder: dict[str, Reconciler] = {}
    publishers: list[LoadPublisher] = []

    def wake(endpoint_id: str) -> None:
        if "r" in holder:
            holder["r"].wake(endpoint_id)

    def capacity_wanted(endpoint_id: str) -> None:
        # The leader may be another instance: tell it through the database.
        wake(endpoint_id)
        for publisher in publishers:
            publisher.wake(endpoint_id)

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
        on_capacity_request=capacity_wanted,
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
    interval = settings.cluster_load_interval_seconds
    # In a cluster the reconciler sees every instance's traffic.
    traffic = ClusterTraffic(gateway, instance_id, max_age(interval)) if cluster_url else gateway
    launcher = launcher or build_launcher(plane)
    reconciler = Reconciler(
        registry=registry,
        launcher=launcher,
        traffic=traffic,
        records=plane.store,
        endpoints=plane.service.rows,
        settings=ReconcilerSettings(
            period_s=settings.reconcile_period_seconds,
            drain_timeout_s=settings.replica_drain_timeout_seconds,
            target_concurrency=settings.autoscale_target_concurrency,
            upscale_delay_s=settings.autoscale_upscale_delay_seconds,
            downscale_delay_s=settings.autoscale_downscale_delay_seconds,
        ),
    )
    holder["r"] = reconciler

    async def adopt() -> None:
        rows = await plane.store.list_replicas()
        # A new leader takes over the launcher's side of every replica it
        # does not watch yet (the registry may know them from the store).
        watched = set(launcher.running())
        rows = [row for row in rows if row.id not in watched]
        adopted = set(reconciler.adopt(rows, plane.service.rows()))
        for row in rows:
            if row.id not in adopted:
                await plane.store.delete_replica(row.id)
        if rows:
            logger.info("adopted %d of %d replicas", len(adopted), len(rows))

    async def lead(term: int) -> None:
        await adopt()
        reconciler.start()

    mirror_task: list[asyncio.Task[None]] = []

    cluster: ClusterMember | None = None
    if cluster_url:
        assert isinstance(traffic, ClusterTraffic)
        publisher = LoadPublisher(cluster_url, instance_id, gateway, interval)
        publishers.append(publisher)
        duties = LeaderDutySet(
            [
                ClusterLoadFeed(cluster_url, traffic, reconciler.wake, interval),
                CallbackDuty(lead, reconciler.stop),
            ]
        )
        election = PostgresElection(cluster_url, instance_id, duties)
        mirror = ReplicaMirror(
            plane.store,
            registry,
            settings.health_period_seconds,
            heartbeats_needed=lambda: not election.leading,
        )
        cluster = ClusterMember(instance_id, election, publisher, mirror)
    runtime = Runtime(registry, launcher, gateway, reconciler, cluster)
    plane.service.runtime_of = runtime.endpoint_runtime

    async def drain(row: Endpoint) -> None:
        if cluster is None or cluster.election.leading:
            await reconciler.drain_endpoint(row)
            return
        # The leader drains (the endpoint is marked deleting in the store);
        # this instance waits for its replicas' rows to go.
        deadline = time.monotonic() + settings.replica_drain_timeout_seconds + 30
        while time.monotonic() < deadline:
            if cluster.election.leading:
                await reconciler.drain_endpoint(row)
                return
            rows = await plane.store.list_replicas()
            if not any(r.endpoint_id == row.id for r in rows):
                return
            await asyncio.sleep(0.2)

    plane.service.drain = drain

    async def start() -> None:
        await gateway.startup()
        if cluster is None:
            await lead(0)
            return
        cluster.publisher.start()
        mirror_task.append(asyncio.ensure_future(cluster.mirror.follow()))
        cluster.election.start()

    async def stop() -> None:
        if cluster is not None:
            # Leader duties stop and the lock goes with the session: another
            # instance takes over at once and adopts the replicas, which keep
            # running (they are not this instance's alone).
            await cluster.election.stop()
            await cluster.publisher.stop()
            for task in mirror_task:
                task.cancel()
            await asyncio.gather(*mirror_task, return_exceptions=True)
            await gateway.shutdown()
            return
        await reconciler.stop()
        await gateway.shutdown()
        # Embedded mode owns its replicas: a clean stop leaves none running.
        await asyncio.to_thread(launcher.shutdown, settings.replica_drain_timeout_seconds)
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

    async def report(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        secret = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        payload = parse_json_object(await read_body(request, _MAX_REPORT_BYTES))
        replica_id = request.path_params["replica_id"]
        try:
            registry.report(replica_id, secret, payload)
        except ReportRejected as exc:
            return JSONResponse(
                error_body(str(exc), "invalid_request_error", None, "report_rejected"),
                status_code=exc.status,
            )
        if runtime.cluster is not None:
            # The leader and the other instances learn it through the store.
            await runtime.cluster.mirror.reported(replica_id)
        return Response(status_code=204)

    metrics_registry = CollectorRegistry(auto_describe=True)
    metrics_registry.register(_ReplicaCollector(registry))

    async def metrics(request: Request) -> Response:
        body = runtime.gateway.metrics.render() + bytes(generate_latest(metrics_registry))
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return [
        *gateway_routes(runtime.gateway),
        Route(REGISTRY_PATH + "/replicas/{replica_id}", report, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
