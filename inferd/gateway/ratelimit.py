"""Rate limits of client tokens: a token bucket per (endpoint, client),
shared by every gateway instance on the same store.

A limit of N requests per minute refills N/60 per second and holds up to N
(a client idle for a minute may send its minute's worth at once; sustained,
it gets N a minute). A request past it is refused with 429 and the seconds
until the bucket holds one again (`Retry-After`).

Each instance decides on its own copy of the bucket. Every
`EXCHANGE_PERIOD_S` it sends the store what it admitted since the last
exchange and takes back the level that every instance's admissions left
(`SharedBuckets`, the store's `exchange_rate_spend`); what it admitted
meanwhile is taken from that. A bucket may go below zero: requests two
instances admitted before seeing each other's are paid back by waiting, so
the limit holds over time whatever the number of instances (alone, each
instance counted its own and k instances let a client send k times N). The
request path waits for the store once per client and instance (its first
request, or the first after two idle minutes): the bucket's level is read
before that request is decided, so that a client moving to another instance
does not find a full bucket there (a store that does not answer within
`LEARN_TIMEOUT_S` leaves it full).

The error, with k instances and an exchange every D seconds: an instance
admits against a level at most D old, so what the others admitted in the
last D seconds is admitted again at most once. A client held at its limit
gets at most N/60 * D + 1 more per other instance in any window (1 request
at 60 a minute and D = 1 s); a client that was idle and bursts at k
instances within the same D seconds gets at most k times N at once, and
is then refused until the debt is paid: over the next (k - 1) minutes it
gets nothing more, and the average stays N a minute. Without a store
(`shared=None`) each instance counts alone.

`RateLimits` is pure but for the clock it is given; buckets of tokens not
seen for a while are dropped, so the table stays as small as the set of
active clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

logger = logging.getLogger(__name__)

# Buckets untouched this long are full again anyway: dropped.
_IDLE_S = 120.0
# Buckets kept before the idle ones are swept.
_SWEEP_AT = 4096
# How often an instance exchanges its admissions with the others.
EXCHANGE_PERIOD_S = 1.0
# How long a client's first request here waits for its shared bucket.
LEARN_TIMEOUT_S = 0.5

Key = tuple[str, str]  # (endpoint id, client)


class SharedBuckets(Protocol):
    async def exchange_rate_spend(
        self, spent: Mapping[Key, tuple[int, int]], now: float
    ) -> dict[Key, float]:
        """Take `(admitted, per_minute)` per key from the shared buckets,
        refilled to `now` (epoch seconds); return their levels."""
        ...


class _Bucket:
    __slots__ = ("admitted", "at", "level", "per_minute")

    def __init__(self, per_minute: int, now: float) -> None:
        self.level = float(per_minute)
        self.at = now
        self.per_minute = per_minute
        # Requests admitted since the last exchange (not yet told).
        self.admitted = 0


class RateLimits:
    __slots__ = ("_buckets", "_clock")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._buckets: dict[Key, _Bucket] = {}

    def take(self, endpoint_id: str, client: str, per_minute: int) -> float:
        """Take one request from the client's bucket: 0 when it may go, else
        the seconds until it may (nothing taken)."""
        now = self._clock()
        key = (endpoint_id, client)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(per_minute, now)
            if len(self._buckets) > _SWEEP_AT:
                self._sweep(now)
        bucket.per_minute = per_minute  # a token's limit may have changed
        rate = per_minute / 60.0
        bucket.level = min(float(per_minute), bucket.level + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.level >= 1.0:
            bucket.level -= 1.0
            bucket.admitted += 1
            return 0.0
        return (1.0 - bucket.level) / rate

    def known(self, endpoint_id: str, client: str) -> bool:
        """Whether this instance has the client's bucket (else: learn it)."""
        return (endpoint_id, client) in self._buckets

    def learned(self, key: Key, per_minute: int, level: float) -> None:
        """The shared bucket's level, read before the client's first request
        here (kept as it is where requests were decided meanwhile)."""
        if key not in self._buckets:
            bucket = self._buckets[key] = _Bucket(per_minute, self._clock())
            bucket.level = min(float(per_minute), level)

    def pending(self) -> dict[Key, tuple[int, int]]:
        """What to tell the other instances: per live bucket, the requests
        admitted since the last call and its limit (a bucket with none is
        sent too, to learn what the others admitted)."""
        told = {}
        for key, bucket in self._buckets.items():
            told[key] = (bucket.admitted, bucket.per_minute)
            bucket.admitted = 0
        return told

    def shared(self, levels: Mapping[Key, float]) -> None:
        """The levels every instance's admissions left, as of the exchange
        that `pending` began: what was admitted here since comes off them."""
        now = self._clock()
        for key, level in levels.items():
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket.level = min(float(bucket.per_minute), level) - bucket.admitted
                bucket.at = now

    def untold(self, told: Mapping[Key, tuple[int, int]]) -> None:
        """An exchange failed: keep what it was to tell for the next one."""
        for key, (admitted, _) in told.items():
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket.admitted += admitted

    def _sweep(self, now: float) -> None:
        for key, bucket in list(self._buckets.items()):
            if now - bucket.at > _IDLE_S and not bucket.admitted:
                del self._buckets[key]


class RateLimitExchange:
    """Exchanges one instance's admissions with the others' through the
    store, every `period` seconds, on the gateway's event loop."""

    def __init__(
        self,
        limits: RateLimits,
        store: SharedBuckets,
        period: float = EXCHANGE_PERIOD_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._limits = limits
        self._store = store
        self._period = period
        self._wall_clock = wall_clock
        self._task: asyncio.Task[None] | None = None
        # Clients whose bucket is being read (their first requests wait on it).
        self._learning: dict[Key, asyncio.Future[None]] = {}

    async def learn(self, endpoint_id: str, client: str, per_minute: int) -> None:
        """Read the client's shared bucket before its first request here is
        decided (one read for every request that arrives meanwhile)."""
        key = (endpoint_id, client)
        reading = self._learning.get(key)
        if reading is None:
            reading = self._learning[key] = asyncio.ensure_future(self._read(key, per_minute))
            reading.add_done_callback(lambda _: self._learning.pop(key, None))
        with contextlib.suppress(Exception):
            await asyncio.shield(reading)

    async def _read(self, key: Key, per_minute: int) -> None:
        try:
            levels = await asyncio.wait_for(
                self._store.exchange_rate_spend({key: (0, per_minute)}, self._wall_clock()),
                LEARN_TIMEOUT_S,
            )
        except Exception:
            logger.warning("could not read a rate-limit bucket from the store", exc_info=True)
            return
        if key in levels:
            self._limits.learned(key, per_minute, levels[key])

    async def exchange(self) -> None:
        """One exchange (a store that fails leaves this instance counting
        on its own until the next one; nothing admitted is forgotten)."""
        told = self._limits.pending()
        if not told:
            return
        try:
            levels = await self._store.exchange_rate_spend(told, self._wall_clock())
        except asyncio.CancelledError:
            self._limits.untold(told)
            raise
        except Exception:
            self._limits.untold(told)
            logger.warning("could not exchange rate-limit buckets with the store", exc_info=True)
            return
        self._limits.shared(levels)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop, after a last exchange (the others learn what was admitted here)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self.exchange()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            await self.exchange()


def retry_after_seconds(wait: float) -> int:
    """Whole seconds for `Retry-After`, never 0."""
    return max(1, math.ceil(wait))
