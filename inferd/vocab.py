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
        return frozenset({cls.STARTING, cls.LOADING})

    @classmethod
    def gone(cls) -> frozenset[ReplicaStatus]:
        """Terminal: no longer holds GPUs, does not count as a current replica,
        and never changes status again."""
        return frozenset({cls.STOPPED, cls.FAILED})


class EndpointStatus(str, enum.Enum):
    """Derived from an endpoint's settings and its replicas (never stored)."""

    PENDING = "pending"
    INITIALIZING = "initializing"
    RUNNING = "running"
    UPDATING = "updating"
    SCALED_TO_ZERO = "scaledToZero"
    FAILED = "failed"
    DELETING = "deleting"
