"""What a gateway shares with the control plane, built before the gateway.

The reconciler reads the gateway's load and, when a replica fails, has the
requests in flight there failed at once; the gateway needs the reconciler to
ask for capacity. So the shared part is its own object, built first and
handed to both: the per-endpoint accounting (`TrafficBook`), the connections
to replicas (`Upstream`), the metrics, and which replica each in-flight
request went to.
"""

from __future__ import annotations

from inferd.gateway.metrics import GatewayMetrics
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.traffic import TrafficBook, TrafficSnapshot
from inferd.gateway.upstream import HttpxUpstream, Upstream


def default_upstream(settings: GatewaySettings) -> Upstream:
    try:
        from inferd.gateway.pool import ConnectionPool
    except ImportError:  # httptools is absent on some platforms
        return HttpxUpstream(connect_timeout=settings.connect_timeout_seconds)
    return ConnectionPool(connect_timeout=settings.connect_timeout_seconds)


class GatewayState:
    """Load observations' source (`traffic`) and the control plane's
    `RequestAborter` (`abort_replica`, `forget_endpoint`). Event loop only."""

    def __init__(self, settings: GatewaySettings, upstream: Upstream | None = None) -> None:
        self.book = TrafficBook(settings.service_time_window)
        self.upstream = upstream or default_upstream(settings)
        self.metrics = GatewayMetrics(self.book.all)
        # Replica id -> base URL, for the replicas requests are in flight on.
        self.replica_urls: dict[str, str] = {}

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        return self.book.traffic(endpoint_id)

    def abort_replica(self, replica_id: str, reason: str = "the replica failed") -> int:
        """Fail what is in progress on a replica the registry gave up on (for
        example one that hangs): requests that had no byte yet are retried
        elsewhere, streams end with an SSE error event. Returns the count."""
        url = self.replica_urls.get(replica_id)
        return 0 if url is None else self.upstream.abort_host(url, reason)

    def forget_endpoint(self, endpoint_id: str) -> None:
        """Drop the accounting of a deleted endpoint (once nothing is in flight)."""
        if self.book.forget(endpoint_id):
            self.metrics.forget(endpoint_id)
