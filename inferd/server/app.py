"""The HTTP surface of a built server (`inferd.server.compose.build`).

`create_app(server)` mounts the management API (a user's key or the operator
key, checked per operation by `inferd.server.access`), the gateway
(endpoint tokens), the registry's report route (replica secrets), `/metrics`,
`/healthz`, `/openapi.json` and the web console at `/console`; its lifespan
starts and stops the server in the serving event loop. Only HTTP objects (the
routes objects, the access check, the console) are constructed here: every
service they call is built in `compose`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router

from inferd.catalog import Catalog
from inferd.control.accounts.adapter_metering import AdapterCollector
from inferd.control.endpoints.views import ReplicaViews
from inferd.control.metrics.plane import PlaneCollector
from inferd.control.model import utc_now
from inferd.control.replicas.registry_api import ReplicaCollector, report_route
from inferd.gateway.app import gateway_routes
from inferd.gateway.openapi import gateway_openapi
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.server import account_routes, adapter_routes, client_token_routes, management
from inferd.server.access import AccessCheck, Operation, ResolvePrincipal, Routes, build_routes
from inferd.server.account_routes import AccountRoutes
from inferd.server.adapter_routes import AdapterRoutes
from inferd.server.batch_openapi import batch_openapi
from inferd.server.batch_routes import BatchRoutes
from inferd.server.client_token_routes import ClientTokenRoutes
from inferd.server.compose import Server
from inferd.server.console import build_console
from inferd.server.management import ManagementRoutes
from inferd.server.openapi import build_openapi
from inferd.server.request_spans import RequestSpans
from inferd.settings import Settings


def openapi_document(
    settings: Settings, catalog: Catalog, parts: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """What `/openapi.json` serves for these settings and catalog: generated
    from the route table (`OPERATIONS`); `parts`: the OpenAPI paths and
    components of the routes mounted besides the management API, so that the
    one document describes every public route."""
    gpus = catalog.gpus
    return build_openapi(
        OPERATIONS,
        max_replicas_cap=settings.max_replicas_cap,
        gpu_types=list(gpus.gpu_types),
        # Any count some type allows; which type allows which is checked
        # per request (and listed by GET /inference/gpu-types).
        gpu_counts=sorted({c for t in gpus.gpu_types for c in gpus.allowed_counts_for(t)}),
        locations=list(gpus.locations),
        server_url=settings.public_url,
        parts=parts,
    )


def serving_openapi() -> dict[str, Any]:
    """OpenAPI paths and components of the gateway, the Batch API and
    `/metrics` (the registry's report route is internal: replicas only)."""
    part = gateway_openapi()
    batches = batch_openapi()
    part["paths"].update(batches["paths"])
    part["components"]["schemas"].update(batches["components"]["schemas"])
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


def serving_routes(server: Server) -> list[BaseRoute]:
    """The gateway, the Batch API, the registry's report route and `/metrics`."""
    metrics_registry = CollectorRegistry(auto_describe=True)
    metrics_registry.register(ReplicaCollector(server.registry))
    metrics_registry.register(AdapterCollector(server.accounts.adapters))
    observers = [server.meter_feed.reported]
    if server.tokens is not None and server.store_probe is not None:
        service = server.service
        metrics_registry.register(
            PlaneCollector(
                lambda: [e for i in service.endpoint_ids() if (e := service.find(i)) is not None],
                ReplicaViews(server.registry, server.reconciler),
                server.registry,
                server.tokens,
                server.store_probe,
                lambda: server.coordination.term is not None,
            )
        )
        observers.append(server.tokens.reported)
    gateway_metrics = server.gateway.metrics

    async def metrics(request: Request) -> Response:
        body = gateway_metrics.render() + bytes(generate_latest(metrics_registry))
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    batch_routes = BatchRoutes(
        server.batches, server.verifier, utc_now, server.settings.max_body_bytes
    )
    return [
        *gateway_routes(server.gateway),
        *batch_routes.routes(),
        report_route(server.registry, observers),
        Route("/metrics", metrics, methods=["GET"]),
    ]


async def console_home_redirect(request: Request) -> Response:
    """`/console` -> `/console/` (the console's pages are below it), keeping
    the query; every other path of the server stays exact."""
    query = f"?{request.url.query}" if request.url.query else ""
    return RedirectResponse(f"/console/{query}", status_code=308)


# Every operation below /inference: the route table the access checks and
# the OpenAPI document are generated from.
OPERATIONS: tuple[Operation, ...] = (
    *management.OPERATIONS,
    *adapter_routes.OPERATIONS,
    *client_token_routes.OPERATIONS,
    *account_routes.OPERATIONS,
)


def create_app(server: Server) -> Starlette:
    settings = server.settings
    openapi_body = json.dumps(
        openapi_document(settings, server.catalog, [serving_openapi()])
    ).encode()

    async def openapi(request: Request) -> Response:
        return Response(openapi_body, media_type="application/json")

    async def healthz(request: Request) -> Response:
        # In a cluster: which instance answered, and which one leads.
        return JSONResponse({"status": "ok", **server.health()})

    accounts = server.accounts
    tables = [
        Routes(
            ManagementRoutes(
                server.service,
                server.endpoint_commands,
                server.models,
                server.recommendations,
                server.catalog,
                settings.max_body_bytes,
            ),
            management.OPERATIONS,
        ),
        Routes(
            AdapterRoutes(server.adapters, settings.max_body_bytes),
            adapter_routes.OPERATIONS,
        ),
        Routes(
            ClientTokenRoutes(server.client_tokens, settings.max_body_bytes),
            client_token_routes.OPERATIONS,
        ),
        Routes(
            AccountRoutes(
                accounts.service,
                server.project_deletion,
                accounts.usage,
                lambda: server.catalog.gpus.currency,
                settings.max_body_bytes,
                lambda: server.catalog.gpus.gpu_types.keys(),
            ),
            account_routes.OPERATIONS,
        ),
    ]
    access = AccessCheck(server.service, accounts.service, server.models)
    # No slash redirects: a 307 is not an answer a JSON client expects, and
    # every path here is exact.
    inference = Router(build_routes(tables, access), redirect_slashes=False)
    console = build_console(server)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await console.close()
            await server.stop()

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Mount(
                "/inference",
                app=inference,
                middleware=[
                    Middleware(RequestSpans),
                    Middleware(ResolvePrincipal, resolver=accounts.resolver),
                ],
            ),
            *serving_routes(server),
            # The console's address as typed: its pages live under `/console/`.
            Route("/console", console_home_redirect, methods=["GET", "HEAD"]),
            console.mount(),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False
    app.state.server = server
    app.state.operations = [op for table in tables for op in table.operations]
    app.state.console = console
    return app
