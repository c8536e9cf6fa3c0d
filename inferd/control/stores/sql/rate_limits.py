"""Client tokens' rate-limit buckets, shared by every instance on the store
(`RateLimitStore`): one row per (endpoint, client) with the bucket's level
and when it was last brought up to date, in wall-clock seconds (instances
are different processes, possibly on different hosts).

Each instance sends what it admitted since its last exchange and gets the
level every instance's admissions left (`inferd.gateway.ratelimit`). A
missing row is a full bucket; rows untouched for `IDLE_S` are full again
and are deleted on the way.
"""

from __future__ import annotations

from collections.abc import Mapping

from inferd.control.stores.sql.database import Tx
from inferd.control.stores.sql.repository import Repository

# A bucket untouched this long has refilled whatever limit it has (at most
# a minute's worth): its row can go.
IDLE_S = 300.0


class RateLimitBuckets(Repository):
    async def exchange_rate_spend(
        self, spent: Mapping[tuple[str, str], tuple[int, int]], now: float
    ) -> dict[tuple[str, str], float]:
        """For each (endpoint id, client): `(admitted, per_minute)`, what this
        instance admitted since its last exchange under that limit. Refills
        each bucket to `now` (epoch seconds; at most a minute's worth),
        takes what was admitted (a bucket may go below zero: admissions
        other instances had not seen yet, paid back by waiting) and returns
        the levels. One transaction; rows locked in key order, so that two
        instances exchanging at once wait for each other, never deadlock."""

        def write(tx: Tx) -> dict[tuple[str, str], float]:
            levels = {}
            for key in sorted(spent):
                admitted, per_minute = spent[key]
                levels[key] = self._take_from_bucket(tx, key, admitted, per_minute, now)
            tx.execute("DELETE FROM rate_limit_buckets WHERE at < ?", (now - IDLE_S,))
            return levels

        if not spent:
            return {}
        return await self._db.write(write)

    def _take_from_bucket(
        self, tx: Tx, key: tuple[str, str], admitted: int, per_minute: int, now: float
    ) -> float:
        endpoint_id, client = key
        tx.execute(
            "INSERT INTO rate_limit_buckets (endpoint_id, client, level, at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (endpoint_id, client) DO NOTHING",
            (endpoint_id, client, float(per_minute), now),
        )
        row = tx.one(
            "SELECT level, at FROM rate_limit_buckets WHERE endpoint_id = ? AND client = ?"
            + self._dialect.for_update,
            key,
        )
        assert row is not None
        level, at = float(row[0]), float(row[1])
        # A clock behind another instance's refills nothing (never drains).
        level = min(float(per_minute), level + max(0.0, now - at) * per_minute / 60.0)
        level -= admitted
        tx.execute(
            "UPDATE rate_limit_buckets SET level = ?, at = ? WHERE endpoint_id = ? AND client = ?",
            (level, max(at, now), endpoint_id, client),
        )
        return level
