"""`Solo`: the `Coordination` of a single instance, a cluster of one.

It leads at once, under term 0, for as long as it runs; nobody else
publishes load; a wake-up rings its own reconciler. Its store (SQLite, or
memory) has no other writer, so the term fences nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from inferd.control.cluster.loadshare import LocalLoad
from inferd.control.cluster.ports import Deposed, LeaderDuties, LeaderInfo
from inferd.control.ports import LoadSample

SOLO_TERM = 0


class Solo:
    def __init__(self, instance_id: str, on_wake: Callable[[str], None]) -> None:
        self._instance_id = instance_id
        self._on_wake = on_wake
        self._duties: LeaderDuties | None = None
        self._leading = False

    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def ends_with_instance(self) -> bool:
        return True

    @property
    def term(self) -> int | None:
        return SOLO_TERM if self._leading else None

    def leader(self) -> LeaderInfo:
        if self._leading:
            return LeaderInfo(term=SOLO_TERM, holder=self._instance_id)
        return LeaderInfo(term=None, holder=None)

    def health(self) -> dict[str, Any]:
        # A single instance says nothing about leaders (`GET /healthz` is
        # what it was before clusters existed).
        return {}

    async def start(self, duties: LeaderDuties) -> None:
        self._duties = duties
        self._leading = True
        try:
            await duties.start(SOLO_TERM)
        except BaseException:
            self._leading = False
            raise

    async def stop(self) -> None:
        if not self._leading or self._duties is None:
            return
        self._leading = False
        await self._duties.stop()

    async def publish_load(self, loads: Sequence[LocalLoad]) -> None:
        return None  # nobody else to tell

    async def remote_load(self) -> list[LoadSample]:
        return []

    def wake(self, endpoint_id: str) -> None:
        self._on_wake(endpoint_id)

    async def confirm(self, term: int) -> None:
        if not self._leading or term != SOLO_TERM:
            raise Deposed(term, SOLO_TERM)
