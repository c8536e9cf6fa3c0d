"""What the gateway needs to know about endpoints and replicas, and nothing more.

The control plane implements `ReplicaDirectory`; the gateway only reads it
and reports unreachable replicas back. Asking for capacity is a separate
signal (`hold.CapacitySignal`), answered by the reconciler. Keeping this
interface narrow is what lets a cluster-backed launcher or another registry
replace the local one without touching the gateway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

NO_ADAPTERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class EndpointRoute:
    endpoint_id: str
    kind: str  # "chat" | "image"
    model_name: str
    # Requests for an endpoint being deleted are refused (503), not held.
    deleting: bool = False
    # Scaled to zero or still coming up: hold requests rather than refuse.
    accepts_held_requests: bool = True
    # Why no replica can be placed anywhere (not even on an idle cluster):
    # with no ready replica, requests are refused at once with this reason.
    unplaceable: str | None = None
    # LoRA adapters registered on it: name (a request's `model`) -> where a
    # replica loads it from (told to the replica with the request).
    adapters: Mapping[str, str] = field(default_factory=lambda: NO_ADAPTERS)
    # The context its engine settings set (None: the model's own), shown as
    # `max_model_len` in /v1/models as vLLM's server shows it.
    max_model_len: int | None = None


@dataclass(frozen=True)
class RoutableReplica:
    replica_id: str
    url: str  # base URL of the replica server, e.g. http://127.0.0.1:41234
    # Engine queue depth from the replica's last report (every gateway's
    # requests); the gateway ranks replicas by the larger of it and its own
    # in-flight count there.
    reported_waiting: int = 0
    # LoRA adapters the replica reported loaded: a request naming one of them
    # prefers this replica.
    adapters: frozenset[str] = frozenset()
    # Tokens its KV cache holds (vLLM's blocks times their size), as the
    # replica reported it; None where unknown. Prefixes are placed by it
    # (`inferd.gateway.placement`).
    kv_cache_tokens: int | None = None
    # Sent with every call: the replica answers nobody else (replica.auth).
    call_key: str = field(default="", repr=False, compare=False)


class ReplicaDirectory(Protocol):
    def endpoint(self, endpoint_id: str) -> EndpointRoute | None:
        """None when no such endpoint exists (the gateway answers 404 — after
        authentication, so that ids cannot be probed without a token)."""
        ...

    def ready_replicas(self, endpoint_id: str) -> Sequence[RoutableReplica]:
        """Replicas in status `ready` only; draining ones are excluded."""
        ...

    def report_unreachable(self, replica_id: str, reason: str) -> None:
        """The gateway could not connect to this replica: stop routing to it
        until it reports again (the registry decides whether it failed)."""
        ...

    def report_answered(self, replica_id: str) -> None:
        """The replica answered a request with a 2xx: a sign of life as good
        as a report, for a replica too busy (CPU-starved by its engine) to
        report on time."""
        ...

    def coming_stage(self, endpoint_id: str) -> str | None:
        """How far the endpoint's replica furthest on its way to ready is
        ("starting", "building weights", "loading", "warming up": the words
        of `inferd.vocab.REPLICA_STAGES`); None when none is on its way.
        Told to a streaming request held at zero while it waits."""
        ...

    async def wait_ready(self, endpoint_id: str, timeout: float) -> bool:
        """Return True as soon as the endpoint has a ready replica (at once if
        it has one now), False after `timeout` seconds."""
        ...
