"""`inferd endpoints wait` (and `create --wait`): follow an endpoint until a
replica serves, showing the stage it is at and the time so far.

The stage is read from the endpoint record the management API already
gives (`status`, and each replica's status and what it is doing); nothing
here asks the server for more than `inferd endpoints get` does. On a
terminal the progress is one line redrawn in place; elsewhere (a log, CI)
a plain line each time the stage changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from inferd.vocab import REPLICA_STAGES, replica_stage

# The way to a serving replica, in order; a bar shows how far along it is.
STAGES = REPLICA_STAGES
POLL_S = 1.0


@dataclass(frozen=True)
class Stage:
    """Where the endpoint is: `name` one of STAGES, or a state that is not on
    the way (`scaled to zero`, `pending`, `failed`, `deleting`); `detail` why."""

    name: str
    detail: str = ""

    @property
    def done(self) -> bool:
        return self.name == "ready"

    @property
    def final(self) -> bool:
        """Nothing more will come by waiting (the endpoint failed or goes)."""
        return self.name in ("failed", "deleting")

    @property
    def step(self) -> int | None:
        return STAGES.index(self.name) + 1 if self.name in STAGES else None


def _replica_stage(replica: Mapping[str, Any]) -> int:
    """How far one replica is along STAGES (an index)."""
    return STAGES.index(replica_stage(replica.get("status") or "", replica.get("statusReason")))


def stage_of(record: Mapping[str, Any]) -> Stage:
    """The stage of an endpoint record (`GET /inference/endpoints/{id}`)."""
    status = record.get("status")
    reason = record.get("statusReason") or ""
    replicas: Sequence[Mapping[str, Any]] = [
        r for r in record.get("replicas") or () if r.get("status") not in ("draining", "stopped")
    ]
    if status in ("running", "updating") and any(r.get("status") == "ready" for r in replicas):
        return Stage("ready")
    if replicas and status in ("initializing", "updating", "running"):
        best = max(replicas, key=_replica_stage)
        return Stage(STAGES[_replica_stage(best)], best.get("statusReason") or "")
    if status == "failed":
        failure = record.get("lastReplicaFailure") or {}
        return Stage("failed", reason or failure.get("reason") or "replica failed")
    if status == "scaledToZero":
        return Stage("scaled to zero", "a replica starts with the next request")
    if status == "initializing":  # lost replicas being replaced
        return Stage("starting", reason)
    return Stage(str(status), reason)


class Progress:
    """Writes the stages to `out`: one line redrawn on a terminal, else a
    line per change."""

    def __init__(self, out: TextIO, name: str, tty: bool | None = None) -> None:
        self.out = out
        self.name = name
        self.tty = out.isatty() if tty is None else tty
        self._last: tuple[str, str] | None = None

    def show(self, stage: Stage, elapsed_s: float) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + self._line(stage, elapsed_s))
            self.out.flush()
            return
        key = (stage.name, stage.detail)
        if key != self._last:
            self._last = key
            print(self._line(stage, elapsed_s), file=self.out, flush=True)

    def end(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()

    def _line(self, stage: Stage, elapsed_s: float) -> str:
        step = stage.step
        if step is None:
            bar = " " * (len(STAGES) + 2)
        else:
            bar = "[" + "#" * step + "." * (len(STAGES) - step) + "]"
        if stage.done or not stage.detail:
            what = stage.name
        elif stage.detail.startswith(stage.name):  # "loading x with ...": said once
            what = stage.detail
        else:
            what = f"{stage.name}: {stage.detail}"
        return f"{self.name} {bar} {elapsed_s:5.0f} s  {what}"


def wait_until_ready(
    fetch: Callable[[], Mapping[str, Any]],
    progress: Progress,
    *,
    max_wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = POLL_S,
) -> tuple[Stage, float]:
    """Poll `fetch` (the endpoint record) until a replica is ready, the
    endpoint fails or goes, or `max_wait_s` passes. Returns the last stage
    and the seconds waited."""
    start = clock()
    while True:
        stage = stage_of(fetch())
        elapsed = clock() - start
        progress.show(stage, elapsed)
        if stage.done or stage.final or elapsed >= max_wait_s:
            progress.end()
            return stage, elapsed
        sleep(poll_s)
