"""The status and kind vocabularies, defined once.

A leaf module (no inferd imports): the replica, the registry, the store, the
gateway and the API models all speak these words, and a replica on another
machine must agree with the control plane about each of them.
"""

from __future__ import annotations

import enum


class ModelKind(str, enum.Enum):
    """What a model serves: chat (and text) completions, image generations,
    embeddings, or relevance scores of text pairs (score and rerank)."""

    CHAT = "chat"
    IMAGE = "image"
    EMBEDDING = "embedding"
    RERANK = "rerank"

    @property
    def pooling(self) -> bool:
        """Served by a pooling model: one forward pass per input, no decode."""
        return self in (ModelKind.EMBEDDING, ModelKind.RERANK)

    @property
    def reads_text(self) -> bool:
        """A transformer over text (`ChatArchitecture`): chat models, and the
        embedders and cross-encoders served by vLLM's pooling runner."""
        return self is not ModelKind.IMAGE

    @property
    def serves(self) -> str:
        """What an endpoint of this kind answers, for the refusal of a route
        it does not (paths below the endpoint's URL)."""
        return _SERVES[self]


_SERVES = {
    ModelKind.CHAT: "chat completions at /openai/v1/chat/completions and text completions "
    "at /openai/v1/completions",
    ModelKind.IMAGE: "image generations at /v1/images/generations",
    ModelKind.EMBEDDING: "embeddings at /openai/v1/embeddings, and scores at /score and /rerank",
    ModelKind.RERANK: "relevance scores at /score and /rerank",
}


class ReplicaStatus(str, enum.Enum):
    """starting -> loading -> ready -> draining -> stopped; any live status
    -> failed (with a reason)."""

    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"

    @classmethod
    def coming_up(cls) -> frozenset[ReplicaStatus]:
        """On the way to ready: launched, not yet serving."""
        return _COMING_UP

    @classmethod
    def gone(cls) -> frozenset[ReplicaStatus]:
        """Terminal: no longer holds GPUs, does not count as a current replica,
        and never changes status again."""
        return _GONE


# Built once: the liveness sweep asks for these for every replica on every
# reconciler pass.
_COMING_UP = frozenset({ReplicaStatus.STARTING, ReplicaStatus.LOADING})
_GONE = frozenset({ReplicaStatus.STOPPED, ReplicaStatus.FAILED})


# The way to a serving replica, in order: what `inferd endpoints wait` shows
# and a streaming request held at zero is told (`replica_stage`).
REPLICA_STAGES: tuple[str, ...] = ("starting", "building weights", "loading", "warming up", "ready")


def replica_stage(status: str, reason: str | None) -> str:
    """Where a replica is along `REPLICA_STAGES`, from its status and what it
    says it is doing (a status reason: the replica's own words)."""
    said = (reason or "").lower()
    if status == ReplicaStatus.READY:
        return "ready"
    if said.startswith("warming up"):
        return "warming up"
    if "building or downloading" in said:
        return "building weights"
    if status == ReplicaStatus.LOADING:
        return "loading"
    return "starting"


class EndpointStatus(str, enum.Enum):
    """Derived from an endpoint's settings and its replicas (never stored)."""

    PENDING = "pending"
    INITIALIZING = "initializing"
    RUNNING = "running"
    UPDATING = "updating"
    SCALED_TO_ZERO = "scaledToZero"
    FAILED = "failed"
    DELETING = "deleting"
