"""The registry's HTTP side: the route replicas report to, and the replica
gauge on `/metrics`.

A report is authenticated with the replica's own secret (a bearer token, the
same header parser as the gateway's) and parsed with the typed wire model
shared with the replica (`inferd.api.replica`): whatever a replica sends,
the answer is 204, or an error in the one error shape (400 for a malformed
report, never a 500).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferd.api.replica import ReplicaReport
from inferd.control.replicas.engine_figures import EndpointEngines, engine_families
from inferd.control.replicas.registry import Registry, ReportRejected
from inferd.errors import error_body
from inferd.gateway.auth import bearer_token
from inferd.http import read_body, validation_error_to_bad_request
from inferd.http_errors import error_response

REGISTRY_PATH = "/internal/registry"
MAX_REPORT_BYTES = 64 * 1024


def report_route(
    registry: Registry, subscribers: Sequence[Callable[[str, ReplicaReport], None]] = ()
) -> Route:
    """`subscribers`: told of every report the registry accepted (usage
    metering). The registry writes what changed to the store itself."""

    async def report(request: Request) -> Response:
        secret = bearer_token(request.headers.get("authorization", "").encode("latin-1"))
        replica_id = request.path_params["replica_id"]
        try:
            registry.authenticate(replica_id, secret)
            try:
                raw = await read_body(request, MAX_REPORT_BYTES)
            except ClientDisconnect:
                # The replica gave up on this report (its timeout); its next
                # one carries the same news. Not an error of ours.
                return Response(status_code=499)
            try:
                parsed = ReplicaReport.model_validate_json(raw)
            except ValidationError as exc:
                return error_response(validation_error_to_bad_request(exc))
            registry.report(replica_id, secret, parsed)
        except ReportRejected as exc:
            return _rejected(exc)
        for subscriber in subscribers:
            subscriber(replica_id, parsed)
        return Response(status_code=204)

    return Route(REGISTRY_PATH + "/replicas/{replica_id}", report, methods=["POST"])


def _rejected(exc: ReportRejected) -> Response:
    return JSONResponse(
        error_body(str(exc), "invalid_request_error", None, "report_rejected"),
        status_code=exc.status,
    )


class ReplicaCollector(Collector):
    """`inferd_replicas{endpoint, status}`: replicas by endpoint and status;
    and what the replicas report of their engines, per endpoint (prefix
    cache hits, KV cache use, engine queue)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "inferd_replicas", "Replicas by endpoint and status.", labels=["endpoint", "status"]
        )
        unresponsive = GaugeMetricFamily(
            "inferd_replicas_unresponsive",
            "Ready replicas not heard to serve lately (routed around while another is ready).",
            labels=["endpoint"],
        )
        counts: dict[tuple[str, str], int] = {}
        silent: dict[str, int] = {}
        engines: dict[str, EndpointEngines] = {}
        for replica in self._registry.all():
            key = (replica.endpoint_id, replica.status.value)
            counts[key] = counts.get(key, 0) + 1
            if replica.live:
                silent[replica.endpoint_id] = silent.get(replica.endpoint_id, 0) + (
                    1 if replica.unresponsive else 0
                )
            if replica.routable:
                engines.setdefault(replica.endpoint_id, EndpointEngines()).add(replica.load)
        for (endpoint, status), count in sorted(counts.items()):
            family.add_metric([endpoint, status], count)
        for endpoint, count in sorted(silent.items()):
            unresponsive.add_metric([endpoint], count)
        return [family, unresponsive, *engine_families(engines)]

    def describe(self) -> list[GaugeMetricFamily]:
        return []
