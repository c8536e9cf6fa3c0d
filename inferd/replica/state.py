"""A replica's lifecycle and its in-flight work.

starting -> loading -> ready -> draining -> stopped; starting/loading/ready
-> failed (with a reason). Only `ready` takes new requests; `draining`
finishes what it has and refuses the rest with 503, which the gateway
retries on another replica because no byte was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from inferd.aio import wait_event
from inferd.errors import ServiceUnavailable
from inferd.vocab import ReplicaStatus

__all__ = ["InFlight", "ReplicaState", "ReplicaStatus"]


class InFlight:
    """One admitted request; `release()` is idempotent so every exit path
    (response sent, stream closed, client gone, error) may call it."""

    __slots__ = ("_released", "_state")

    def __init__(self, state: ReplicaState) -> None:
        self._state = state
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._state._release()


class ReplicaState:
    def __init__(self) -> None:
        self.status = ReplicaStatus.STARTING
        self.reason: str | None = None
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def set(self, status: ReplicaStatus, reason: str | None = None) -> None:
        if self.status in ReplicaStatus.gone() or self.status == status:
            return
        self.status = status
        self.reason = reason
        for listener in self._listeners:
            listener()

    def note(self, progress: str) -> None:
        """What a long step (a build, a download, a load) is doing now: the
        reason of a starting or loading replica, reported like a status
        change so that the endpoint record shows it while it lasts."""
        if self.status not in (ReplicaStatus.STARTING, ReplicaStatus.LOADING):
            return
        self.reason = progress
        for listener in self._listeners:
            listener()

    def admit(self) -> InFlight:
        if self.status is not ReplicaStatus.READY:
            code = {
                ReplicaStatus.DRAINING: "replica_draining",
                ReplicaStatus.STOPPED: "replica_draining",
                ReplicaStatus.FAILED: "replica_failed",
            }.get(self.status, "model_loading")
            raise ServiceUnavailable(
                f"This replica is {self.status.value} and takes no new requests.",
                code=code,
                retry_after=1,
            )
        self.in_flight += 1
        self._idle.clear()
        return InFlight(self)

    def _release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        return await wait_event(self._idle, timeout)
