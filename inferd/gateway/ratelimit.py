"""Rate limits of client tokens: a token bucket per (endpoint, client).

A limit of N requests per minute refills N/60 per second and holds up to N
(a client idle for a minute may send its minute's worth at once; sustained,
it gets N a minute). A request past it is refused with 429 and the seconds
until the bucket holds one again (`Retry-After`). Each gateway instance
counts on its own: behind k instances a client gets up to k times N.

Pure but for the clock it is given; buckets of tokens not seen for a while
are dropped, so the table stays as small as the set of active clients.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# Buckets untouched this long are full again anyway: dropped.
_IDLE_S = 120.0
# Buckets kept before the idle ones are swept.
_SWEEP_AT = 4096


class RateLimits:
    __slots__ = ("_buckets", "_clock")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # (endpoint id, client) -> (tokens left, when last refilled)
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}

    def take(self, endpoint_id: str, client: str, per_minute: int) -> float:
        """Take one request from the client's bucket: 0 when it may go, else
        the seconds until it may (nothing taken)."""
        now = self._clock()
        key = (endpoint_id, client)
        tokens, at = self._buckets.get(key, (float(per_minute), now))
        rate = per_minute / 60.0
        tokens = min(float(per_minute), tokens + (now - at) * rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > _SWEEP_AT:
                self._sweep(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / rate

    def _sweep(self, now: float) -> None:
        for key, (_, at) in list(self._buckets.items()):
            if now - at > _IDLE_S:
                del self._buckets[key]


def retry_after_seconds(wait: float) -> int:
    """Whole seconds for `Retry-After`, never 0."""
    return max(1, math.ceil(wait))
