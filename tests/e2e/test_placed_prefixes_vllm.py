"""A real replica lists the prompt prefixes a gateway placed on it, and the
gateway's poll reads the list through its own connection pool (the shared
tiny-chat vLLM replica)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from inferd.api.replica import PLACED_HEADER
from inferd.gateway.directory import RoutableReplica
from inferd.gateway.placement import Placements
from inferd.gateway.placement_claims import ClaimsPoller
from inferd.gateway.pool import ConnectionPool
from inferd.testing import ReplicaHandle
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow]


def test_a_replica_lists_the_prefixes_placed_on_it(vllm_replica: ReplicaHandle) -> None:
    key = 987_654_321
    answered = httpx.post(
        f"{vllm_replica.url}/openai/v1/chat/completions",
        json={
            "model": "tiny-chat",
            "messages": [{"role": "user", "content": "Name a sea."}],
            "max_tokens": 2,
            "temperature": 0,
        },
        headers={PLACED_HEADER: str(key)},
        timeout=120,
    )
    assert answered.status_code == 200, answered.text

    async def poll() -> dict[int, str]:
        pool = ConnectionPool()
        replicas = [
            RoutableReplica("shared", vllm_replica.url),
            RoutableReplica("gone", "http://127.0.0.1:9"),  # refuses: skipped
        ]
        placements = Placements()
        placements.place("ep", 1, 8, replicas, 0.0)
        try:
            await ClaimsPoller(placements, lambda _: replicas, time.monotonic, pool).poll()
        finally:
            await pool.aclose()
        placement = placements.endpoint("ep")
        assert placement is not None
        return {k: claim.first for k, claim in placement.claims().items()}

    assert asyncio.run(poll())[key] == "shared"
