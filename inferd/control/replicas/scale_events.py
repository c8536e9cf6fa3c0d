"""Why an endpoint scaled: events with their cause, kept per endpoint.

The autoscaler's decision carries a reason string; `classify` turns it into
one of four causes a person reading the console's timeline cares about:
load, idle past retention, a manual change of the settings, a failure.
The journal is memory only (bounded per endpoint): it explains what the
current process decided, and a restart starts a new story.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from inferd.control.model import utc_now_text

EVENTS_PER_ENDPOINT = 200


class ScaleCause(str, Enum):
    LOAD = "load"
    IDLE = "idle"
    MANUAL = "manual"
    FAILURE = "failure"
    # Not a change of replicas: a stream continued on another replica after
    # its own was lost (the gateway's), shown on the same timeline.
    MIGRATION = "migration"


@dataclass(frozen=True)
class ScaleEvent:
    endpoint_id: str
    at: str  # RFC 3339 wall time
    cause: ScaleCause
    from_replicas: int
    to_replicas: int
    reason: str  # the autoscaler's (or the reconciler's) own words


def classify(reason: str, previous: int, desired: int) -> ScaleCause:
    """The cause of a change of desired replicas, from the decision's reason.

    The autoscaler's reasons (see `inferd.control.replicas.autoscaler`): "replica
    bounds changed" and "minReplicas" follow a settings change; "idle past
    the retention period" is scale to zero; request counts and "traffic
    within the retention period" are load.
    """
    text = reason.lower()
    if "failed" in text or "failure" in text:
        return ScaleCause.FAILURE
    if "bounds changed" in text or text.startswith("minreplicas"):
        return ScaleCause.MANUAL
    if "idle past" in text:
        return ScaleCause.IDLE
    if desired < previous and "retention" not in text and "request" not in text:
        return ScaleCause.MANUAL
    return ScaleCause.LOAD


class ScaleJournal:
    """Recent scale events of every endpoint, newest last."""

    def __init__(
        self, per_endpoint: int = EVENTS_PER_ENDPOINT, wall: Callable[[], str] = utc_now_text
    ) -> None:
        self._per_endpoint = per_endpoint
        self._wall = wall
        self._events: dict[str, deque[ScaleEvent]] = {}

    def record(
        self,
        endpoint_id: str,
        previous: int,
        desired: int,
        reason: str,
        cause: ScaleCause | None = None,
    ) -> ScaleEvent:
        event = ScaleEvent(
            endpoint_id=endpoint_id,
            at=self._wall(),
            cause=cause or classify(reason, previous, desired),
            from_replicas=previous,
            to_replicas=desired,
            reason=reason,
        )
        events = self._events.setdefault(endpoint_id, deque(maxlen=self._per_endpoint))
        events.append(event)
        return event

    def record_migration(self, endpoint_id: str, text: str) -> None:
        """A stream of the endpoint continued on another replica; merged
        with the previous event when that was one too (a replica lost with
        many streams is one line, with a count)."""
        events = self._events.setdefault(endpoint_id, deque(maxlen=self._per_endpoint))
        count = 1
        if events and events[-1].cause is ScaleCause.MIGRATION and events[-1].reason == text:
            count = events.pop().to_replicas + 1
        # For a migration, `to_replicas` counts the streams it stands for.
        events.append(ScaleEvent(endpoint_id, self._wall(), ScaleCause.MIGRATION, 0, count, text))

    def of_endpoint(self, endpoint_id: str) -> list[ScaleEvent]:
        return list(self._events.get(endpoint_id, ()))

    def forget(self, endpoint_id: str) -> None:
        self._events.pop(endpoint_id, None)
