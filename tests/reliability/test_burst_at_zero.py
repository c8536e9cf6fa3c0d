"""A burst at zero replicas is held, not refused, and asks for every replica
it needs at once; past the hold queue's memory bound the rest is refused
with 503 and Retry-After, and nothing else is lost.

A real `inferd serve` with fake-engine replicas that take a few seconds to
load, so that the whole burst arrives while nothing can serve it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from inferd.testing import ServeHandle
from tests.reliability.fault_support import CHAT, Endpoint

LOADING = "--engine fake --engine-arg token_delay_s=0.01 --engine-arg load_delay_s=4"
BODY = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def burst(endpoint: Endpoint, count: int) -> list[httpx.Response | str]:
    """`count` chats sent at once, each on its own connection."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one() -> httpx.Response | str:
            try:
                return await client.post(endpoint.url + CHAT, json=BODY, headers=endpoint.headers)
            except httpx.HTTPError as exc:
                return type(exc).__name__

        return await asyncio.gather(*(one() for _ in range(count)))


def create(serve: ServeHandle) -> Endpoint:
    return Endpoint.create(serve, name="burst", modelName="tiny-chat", minReplicas=0, maxReplicas=2)


def replicas_of(serve: ServeHandle, endpoint: Endpoint) -> list[dict[str, Any]]:
    with serve.api() as api:
        return list(api.get(f"/inference/endpoints/{endpoint.id}").json()["replicas"])


def test_a_burst_of_200_at_zero_is_held_and_asks_for_max_replicas_at_once(
    serve_factory: Callable[..., ServeHandle],
) -> None:
    """Default hold bounds. The upscale delay is long: only the rule for
    held requests can bring the second replica before the first is ready."""
    serve = serve_factory(replica_args=LOADING, autoscale_upscale_delay_seconds="120")
    endpoint = create(serve)

    async def scenario() -> tuple[list[httpx.Response | str], int]:
        sending = asyncio.ensure_future(burst(endpoint, 200))
        most = 0
        while not sending.done():
            replicas = await asyncio.to_thread(replicas_of, serve, endpoint)
            if not any(r["status"] == "ready" for r in replicas):
                most = max(most, len(replicas))
            await asyncio.sleep(0.2)
        return await sending, most

    answers, replicas_before_ready = asyncio.run(scenario())
    codes = Counter(a.status_code if isinstance(a, httpx.Response) else a for a in answers)
    assert codes == {200: 200}, codes
    assert replicas_before_ready == 2


def test_past_the_memory_bound_the_rest_is_refused_and_the_held_are_answered(
    serve_factory: Callable[..., ServeHandle],
) -> None:
    """Room for about 20 held chats (4 KiB each plus the body): of a burst of
    60, those held are all answered and the others get 503 with Retry-After
    at once; no connection fails, nothing else is lost."""
    serve = serve_factory(
        replica_args=LOADING, gateway_max_held_bytes_per_endpoint=str(20 * (4096 + 128))
    )
    endpoint = create(serve)
    answers = asyncio.run(burst(endpoint, 60))
    responses = [a for a in answers if isinstance(a, httpx.Response)]
    assert len(responses) == 60, [a for a in answers if isinstance(a, str)]
    codes = Counter(r.status_code for r in responses)
    assert set(codes) == {200, 503} and 15 <= codes[200] <= 25, codes
    for refused in (r for r in responses if r.status_code == 503):
        assert refused.json()["error"]["code"] == "scaling_up"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.elapsed.total_seconds() < 3  # at once, not after holding
