"""The endpoints list's live updates: which rows changed since the version a
browser has, answered without looking at every row.

Comparing every row (replicas, cost, view) on every poll costs rows x
browsers. `LiveBoard` instead keeps each row's current view with the version
at which it last changed, fed from two sides:

- marks: rows known to have changed (the console's own writes), refreshed by
  the next poll, so that what a person just did shows at once;
- a sweep over every row, in the background about once a second while some
  browser polls (and never while nobody watches), shared by all browsers:
  what changed elsewhere (replicas, the autoscaler, cost, other instances)
  shows within a sweep period plus the browser's poll interval. It yields to
  the event loop between chunks, so the gateway is never held up for long.

A poll then costs the rows changed since its version, not the whole list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable

from inferd.console.views import RowView

logger = logging.getLogger(__name__)


class LiveBoard:
    def __init__(
        self,
        view_of: Callable[[str], RowView | None],
        endpoint_ids: Callable[[], Iterable[str]],
        *,
        clock: Callable[[], float] = time.monotonic,
        sweep_period_s: float = 1.0,
        watch_s: float = 10.0,
        chunk: int = 100,
    ) -> None:
        """`view_of(id)`: the row's view now, None once it is gone;
        `endpoint_ids()`: every endpoint of the server."""
        self._view_of = view_of
        self._endpoint_ids = endpoint_ids
        self._clock = clock
        self._sweep_period_s = sweep_period_s
        self._watch_s = watch_s
        self._chunk = chunk
        self.version = 0
        # The last version at which a row appeared or went: a browser older
        # than that shows another set of rows and needs the whole body.
        self.members_version = 0
        self._rows: dict[str, tuple[RowView, int]] = {}
        self._log: deque[tuple[int, str]] = deque()  # (version, id), oldest first
        self._log_floor = 0  # versions up to here may have left the log
        self._marked: set[str] = set()
        self._watched_until = 0.0
        self._sweeper: asyncio.Task[None] | None = None

    # --- what changed -------------------------------------------------------------------

    def put(self, view: RowView) -> None:
        known = self._rows.get(view.id)
        if known is not None and (known[0] is view or known[0] == view):
            return
        self.version += 1
        if known is None:
            self.members_version = self.version
        self._rows[view.id] = (view, self.version)
        self._append(view.id)

    def drop(self, endpoint_id: str) -> None:
        if self._rows.pop(endpoint_id, None) is not None:
            self.version += 1
            self.members_version = self.version

    def update(self, views: Iterable[RowView]) -> None:
        for view in views:
            self.put(view)

    def version_of(self, endpoint_id: str) -> int:
        known = self._rows.get(endpoint_id)
        return 0 if known is None else known[1]

    def mark(self, endpoint_id: str) -> None:
        """This row changed: the next poll looks at it again."""
        self._marked.add(endpoint_id)

    def refresh_marked(self) -> None:
        marked, self._marked = self._marked, set()
        for endpoint_id in marked:
            self._refresh(endpoint_id)

    def changed_since(self, since: int) -> list[RowView] | None:
        """The rows changed after version `since`, or None when the set of
        rows changed since, `since` is older than the log keeps, or it is
        newer than this board (a browser's page from before a restart)."""
        if since < self._log_floor or self.members_version > since or since > self.version:
            return None
        seen: set[str] = set()
        changed: list[RowView] = []
        for version, endpoint_id in reversed(self._log):
            if version <= since:
                break
            known = self._rows.get(endpoint_id)
            if endpoint_id not in seen and known is not None and known[1] == version:
                seen.add(endpoint_id)
                changed.append(known[0])
        changed.reverse()
        return changed

    def _append(self, endpoint_id: str) -> None:
        self._log.append((self.version, endpoint_id))
        while len(self._log) > max(1024, 4 * len(self._rows)):
            self._log_floor = self._log.popleft()[0]

    def _refresh(self, endpoint_id: str) -> None:
        view = self._view_of(endpoint_id)
        if view is None:
            self.drop(endpoint_id)
        else:
            self.put(view)

    # --- the sweep ----------------------------------------------------------------------

    async def sweep(self) -> None:
        """Every row once, in chunks, yielding to the event loop between."""
        ids = list(self._endpoint_ids())
        for start in range(0, len(ids), self._chunk):
            for endpoint_id in ids[start : start + self._chunk]:
                self._refresh(endpoint_id)
            await asyncio.sleep(0)
        present = set(ids)
        for endpoint_id in [i for i in self._rows if i not in present]:
            self.drop(endpoint_id)

    def watch(self) -> None:
        """A browser polls: keep sweeping for a while (started here, on the
        running loop, so that a server nobody watches does no work)."""
        self._watched_until = self._clock() + self._watch_s
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_while_watched())

    async def _sweep_while_watched(self) -> None:
        while self._clock() < self._watched_until:
            await asyncio.sleep(self._sweep_period_s)
            try:
                await self.sweep()
            except Exception:  # one bad row must not stop the list's updates
                logger.exception("console live board: sweep failed")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
