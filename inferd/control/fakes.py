"""In-memory fakes of the launch ports, shipped for unit tests.

`FakeLauncher` keeps the `Launcher` contract (`tests/contract/test_launcher.py`
holds it and every real launcher to the same behaviour) with no process: a
test ends a replica with `exit()`. `FakeLoad` is a load source whose numbers a
test sets, and which records what it was asked to abort. Use them with the
in-memory store (`inferd.control.stores.memory`) and an injected clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any

from inferd.control.ports import (
    Capacity,
    EndpointLoad,
    ExitReason,
    PlacementKey,
    ReplicaExit,
    ReplicaHandle,
)
from inferd.replica.config import ReplicaSpec

FAKE_NODE = "fake"


class FakeLauncher:
    """Replicas that "run" until a test ends them; `slots` per GPU type (any
    location), counted in replicas. State lives in the object, so a second
    reconciler (a restarted control plane) can `adopt` what the first launched."""

    def __init__(
        self, slots: int = 8, *, location: str = "local", drains_on_stop: bool = False
    ) -> None:
        """`drains_on_stop`: a stopped replica ends at once (code 0), as a
        healthy one does after draining; else it runs until `exit()`."""
        self.slots = slots
        self.location = location
        self.drains_on_stop = drains_on_stop
        self.closed = False
        self.alive: dict[str, ReplicaSpec] = {}
        self.stopping: set[str] = set()
        self.launched: list[ReplicaSpec] = []
        self.killed: list[str] = []
        self.logs: dict[str, str] = {}
        self._queue: asyncio.Queue[ReplicaExit | None] | None = None
        self._ending: dict[str, ExitReason] = {}
        self._ids = iter(range(1, 1_000_000))

    def _exits_queue(self) -> asyncio.Queue[ReplicaExit | None]:
        if self._queue is None:
            self._queue = asyncio.Queue()
        return self._queue

    async def capacity(self) -> Capacity:
        free = self.slots - len(self.alive)
        key = PlacementKey(self.location, "cpu")
        return Capacity({key: free}, {key: self.slots})

    async def cannot_place(self, location: str, gpu_type: str, gpu_count: int) -> str | None:
        if location != self.location:
            return f"no location {location!r}"
        return None if len(self.alive) < self.slots else "no free slot"

    async def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        if self.closed:
            raise RuntimeError("the launcher is shut down")
        reason = await self.cannot_place(spec.location, spec.gpu_type, spec.gpu_count)
        if reason is not None:
            raise RuntimeError(reason)
        self.alive[spec.replica_id] = spec
        self.launched.append(spec)
        return ReplicaHandle(spec.replica_id, FAKE_NODE, {"n": str(next(self._ids))})

    async def stop(self, handle: ReplicaHandle, grace_s: float) -> None:
        if handle.replica_id in self.alive:
            self.stopping.add(handle.replica_id)
            self._ending.setdefault(handle.replica_id, ExitReason.STOPPED)
            if self.drains_on_stop:
                self.exit(handle.replica_id, 0)

    async def kill(self, handle: ReplicaHandle) -> None:
        if handle.replica_id in self.alive:
            self.killed.append(handle.replica_id)
            self._ending[handle.replica_id] = ExitReason.KILLED
            self.exit(handle.replica_id, -9)

    def exit(self, replica_id: str, code: int | None, detail: str = "") -> None:
        """The replica's process ends now (test control)."""
        if self.alive.pop(replica_id, None) is None:
            return
        self.stopping.discard(replica_id)
        reason = self._ending.pop(replica_id, ExitReason.EXITED)
        self._exits_queue().put_nowait(ReplicaExit(replica_id, reason, code, detail))

    async def exits(self) -> AsyncIterator[ReplicaExit]:
        queue = self._exits_queue()
        while True:
            exited = await queue.get()
            if exited is None:
                return
            yield exited

    async def adopt(self, handle: ReplicaHandle) -> bool:
        return handle.node == FAKE_NODE and handle.replica_id in self.alive

    async def log_tail(self, replica_id: str, max_bytes: int) -> str | None:
        """What a test put in `logs` for the replica."""
        text = self.logs.get(replica_id)
        return None if text is None else text[-max_bytes:]

    async def shutdown(self, grace_s: float) -> None:
        for replica_id in list(self.alive):
            self._ending.setdefault(replica_id, ExitReason.STOPPED)
            self.exit(replica_id, 0)
        self.closed = True
        self._exits_queue().put_nowait(None)

    def reset_exits(self) -> None:
        """A new consumer (a restarted control plane in the same test) gets a
        fresh stream of exits."""
        self._queue = None


class FakeLoad:
    """A `LoadObservations` and `RequestAborter` whose load a test sets."""

    def __init__(self) -> None:
        self.loads: dict[str, EndpointLoad] = {}
        self.aborted: list[str] = []
        self.forgotten: list[str] = []

    def set(self, endpoint_id: str, **fields: Any) -> None:
        by_replica: Mapping[str, int] = fields.pop("in_flight_by_replica", {})
        base: dict[str, Any] = dict(in_flight=0, held=0, last_request_at=None)
        base.update(fields)
        self.loads[endpoint_id] = EndpointLoad(
            endpoint_id=endpoint_id, in_flight_by_replica=MappingProxyType(dict(by_replica)), **base
        )

    def load(self, endpoint_id: str) -> EndpointLoad:
        if endpoint_id not in self.loads:
            self.set(endpoint_id)
        return self.loads[endpoint_id]

    def forget(self, endpoint_id: str) -> None:
        self.loads.pop(endpoint_id, None)
        self.forgotten.append(endpoint_id)

    def abort_replica(self, replica_id: str, reason: str = "") -> int:
        self.aborted.append(replica_id)
        return 0

    def forget_endpoint(self, endpoint_id: str) -> None:
        self.forgotten.append(endpoint_id)
