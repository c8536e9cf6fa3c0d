"""The endpoint record of spec 2.1: status derivation, URL, example command.

Pure functions over frozen dataclasses: the store row, the replicas the
registry knows, and the public base URL.
The record is a plain dict whose shape is `inferd.api.management.EndpointRecord`
(a test holds the two together); reads build it without pydantic, because
reads are the hot path of the management API.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd import COMPAT_FAMILY
from inferd.control.model import Endpoint, ReplicaFailure, rfc3339
from inferd.vocab import EndpointStatus, ModelKind, ReplicaStatus


@dataclass(frozen=True)
class ReplicaView:
    """What the record needs to know about one replica."""

    gpus: int
    status: ReplicaStatus
    generation: int = 1
    reason: str | None = None
    replica_id: str = ""
    since: str | None = None  # RFC 3339 time the replica entered its status
    engine: str | None = None  # the engine serving it, once the replica says
    node: str | None = None  # where it runs, as its launcher names it
    # LoRA adapters its engine holds now (sorted), as it last reported.
    adapters: tuple[str, ...] = ()
    # RFC 3339 time since which it has not been heard to serve (None: it is).
    unresponsive_since: str | None = None


@dataclass(frozen=True)
class EndpointRuntime:
    """Everything the record derives from besides the stored row: the
    replicas, why none is coming up when one is wanted (capacity), and the
    last replica failure."""

    replicas: tuple[ReplicaView, ...] = ()
    waiting_for: str | None = None
    last_failure: ReplicaFailure | None = None
    # Replicas that were serving were lost and their replacements are on
    # the way (why, when set): the endpoint is coming back, not failed.
    replacing: str | None = None


@dataclass(frozen=True)
class DerivedStatus:
    status: EndpointStatus
    reason: str | None = None


def derive_status(
    row: Endpoint,
    replicas: Sequence[ReplicaView] = (),
    waiting_for: str | None = None,
    replacing: str | None = None,
) -> DerivedStatus:
    """Endpoint status from its settings and its replicas' states.

    - deletion started -> deleting
    - a ready replica -> running, or updating while replicas of an older
      generation (GPU settings changed) are still being replaced
    - replicas coming up and none ready -> initializing
    - only draining replicas left -> updating (on the way down)
    - a replica wanted but not placeable (`waiting_for`) -> pending, with why
    - serving replicas lost, replacements on the way (`replacing`) ->
      initializing, with why (as at scale from zero, never failed)
    - no live replica: every recent one failed -> failed (with the reason);
      minReplicas 0 -> scaledToZero; else pending (waiting to be placed)
    """
    if row.deleting_at is not None:
        return DerivedStatus(EndpointStatus.DELETING)
    live = [r for r in replicas if r.status not in ReplicaStatus.gone()]
    ready = [r for r in live if r.status is ReplicaStatus.READY]
    if ready:
        stale = any(r.generation != row.generation for r in live)
        # Serving, but more replicas are wanted than can be had (capacity,
        # a project quota): the reason says why it stops there.
        return DerivedStatus(
            EndpointStatus.UPDATING if stale else EndpointStatus.RUNNING, waiting_for
        )
    if any(r.status in ReplicaStatus.coming_up() for r in live):
        return DerivedStatus(EndpointStatus.INITIALIZING)
    if live:
        # Only draining replicas left: on the way down (to zero, or out for
        # a replacement); not yet scaled to zero.
        return DerivedStatus(EndpointStatus.UPDATING)
    if waiting_for is not None:
        # A replica is wanted but cannot be placed: say so instead of
        # looking idle (scaledToZero) or broken (failed).
        return DerivedStatus(EndpointStatus.PENDING, waiting_for)
    if replacing is not None:
        return DerivedStatus(EndpointStatus.INITIALIZING, replacing)
    failed = [r for r in replicas if r.status is ReplicaStatus.FAILED]
    if failed:
        reason = failed[-1].reason or "replica failed"
        return DerivedStatus(EndpointStatus.FAILED, reason)
    if row.min_replicas == 0:
        return DerivedStatus(EndpointStatus.SCALED_TO_ZERO)
    return DerivedStatus(EndpointStatus.PENDING)


def endpoint_url(public_url: str, endpoint_id: str) -> str:
    return f"{public_url}/endpoints/{endpoint_id}"


DEFAULT_IMAGE_SIZE = "1024x1024"


# Request bodies of the example commands, keyed by model kind.
def _example_body(kind: ModelKind | str, model_name: str, image_size: str) -> dict[str, Any]:
    if kind == ModelKind.IMAGE:
        return {
            "model": model_name,
            "prompt": "A watercolor painting of a lighthouse at dawn",
            "n": 1,
            "size": image_size,
        }
    if kind == ModelKind.EMBEDDING:
        return {"model": model_name, "input": ["The first text", "and the second"]}
    if kind == ModelKind.RERANK:
        return {
            "model": model_name,
            "query": "Where is the lighthouse?",
            "documents": ["On the cliff, at the harbour mouth.", "Bread is baked at dawn."],
        }
    return {
        "model": model_name,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 64,
        "stream": False,
    }


def example_path(kind: ModelKind | str) -> str:
    if kind == ModelKind.IMAGE:
        return "/v1/images/generations"
    if kind == ModelKind.EMBEDDING:
        return f"/{COMPAT_FAMILY}/v1/embeddings"
    if kind == ModelKind.RERANK:
        return "/v1/rerank"
    return f"/{COMPAT_FAMILY}/v1/chat/completions"


def example_command(
    url: str, kind: ModelKind | str, model_name: str, image_size: str = DEFAULT_IMAGE_SIZE
) -> str:
    """A curl line ready to paste, with the literal placeholder `<ACCESS_TOKEN>`."""
    body = shlex.quote(json.dumps(_example_body(kind, model_name, image_size)))
    return (
        f"curl {url}{example_path(kind)}"
        ' -H "Authorization: Bearer <ACCESS_TOKEN>"'
        ' -H "Content-Type: application/json"'
        f" -d {body}"
    )


def build_record(
    row: Endpoint,
    public_url: str,
    replicas: Sequence[ReplicaView] = (),
    *,
    image_size: str = DEFAULT_IMAGE_SIZE,
    waiting_for: str | None = None,
    last_failure: ReplicaFailure | None = None,
    replacing: str | None = None,
    cost_so_far: float = 0.0,
) -> dict[str, Any]:
    """The endpoint record (spec 2.1 fields first, then inferd's extras).

    `image_size` is the model's default size, used in an image model's example;
    `cost_so_far`: this month's cost of the endpoint (the usage meter's).
    """
    derived = derive_status(row, replicas, waiting_for, replacing)
    url = endpoint_url(public_url, row.id)
    current = [r for r in replicas if r.status not in ReplicaStatus.gone()]
    return {
        "id": row.id,
        "name": row.name,
        "modelName": row.model_name,
        "gpuType": row.gpu_type,
        "gpuCount": row.gpu_count,
        "locationName": row.location_name,
        "minReplicas": row.min_replicas,
        "maxReplicas": row.max_replicas,
        "currentReplicas": len(current),
        "replicas": [
            {
                "gpus": r.gpus,
                "status": r.status.value,
                "id": r.replica_id,
                "statusReason": r.reason,
                "since": r.since,
                "engine": r.engine,
                "node": r.node,
                "adapters": list(r.adapters),
                "unresponsiveSince": r.unresponsive_since,
            }
            for r in current
        ],
        "scaleToZeroRetentionPeriodSeconds": row.retention_seconds,
        "hourlyPrice": row.hourly_price,
        "status": derived.status.value,
        "url": url,
        "exampleCommand": example_command(url, row.model_kind, row.model_name, image_size),
        "currency": row.currency,
        "statusReason": derived.reason,
        "createdAt": rfc3339(row.created_at),
        "updatedAt": rfc3339(row.updated_at),
        "lastReplicaFailure": None
        if last_failure is None
        else {
            "replicaId": last_failure.replica_id,
            "reason": last_failure.reason,
            "at": last_failure.at,
        },
        "engineSettings": row.engine_settings.given(),
        "projectId": row.project_id,
        "costSoFar": cost_so_far,
    }
