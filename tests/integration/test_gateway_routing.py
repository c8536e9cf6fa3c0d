"""Prefix routing through the gateway's request path: two gateways (as two
`inferd serve` processes behind one load balancer would be) agree on the
replica of every conversation without talking to each other; a dead
replica's conversations move at once; least-loaded stays available.

The replicas are a recording fake upstream: what is under test is where
the gateway sends each request, not what a replica answers.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from inferd.api.replica import PLACED_HEADER, PLACED_PREFIXES_PATH
from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.routing import Policy
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.gateway.upstream import Headers, UpstreamConnectError
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.replica.placed_prefixes import PlacedPrefixes
from inferd.testing import verifier_for

EP = "ep-routing"
TOKEN = new_endpoint_token()
CHAT = f"/endpoints/{EP}/openai/v1/chat/completions"
REPLICAS = [RoutableReplica(f"replica-{i}", f"http://127.0.0.1:{9100 + i}") for i in range(4)]
ANSWER = json.dumps({"choices": [], "usage": {"completion_tokens": 1}}).encode()


class _Answer:
    status = 200
    headers = [(b"content-type", b"application/json")]

    def __init__(self) -> None:
        self.complete = False

    async def next_chunk(self) -> bytes:
        if self.complete:
            return b""
        self.complete = True
        return ANSWER

    def close(self) -> None:
        return None


class _Listing(_Answer):
    def __init__(self, placed: PlacedPrefixes) -> None:
        super().__init__()
        self.body = json.dumps({"prefixes": placed.listing()}).encode()

    async def next_chunk(self) -> bytes:
        if self.complete:
            return b""
        self.complete = True
        return self.body


class RecordingUpstream:
    """Answers every request at once; remembers which replica got it, and
    lists the prefixes placed on each as a replica does."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.dead: set[str] = set()
        self.placed: dict[str, PlacedPrefixes] = {}

    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> _Answer:
        if base_url in self.dead:
            raise UpstreamConnectError("connection refused")
        placed = self.placed.setdefault(base_url, PlacedPrefixes())
        if path == PLACED_PREFIXES_PATH:
            return _Listing(placed)
        self.sent.append(base_url)
        for name, value in headers:
            if name == PLACED_HEADER.encode():
                placed.note(int(value))
        return _Answer()

    def abort_host(self, base_url: str, reason: str) -> int:
        return 0

    async def aclose(self) -> None:
        return None


def gateway(
    directory: StaticDirectory, upstream: RecordingUpstream, policy: Policy = Policy.PREFIX
) -> httpx.AsyncClient:
    gw = Gateway(
        directory,
        verifier_for({EP: TOKEN}),
        GatewaySettings(routing_policy=policy),
        upstream=upstream,  # type: ignore[arg-type]
    )
    app = Starlette(routes=gateway_routes(gw), exception_handlers=EXCEPTION_HANDLERS)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gateway")
    client.gateway = gw  # type: ignore[attr-defined]
    return client


def conversation(n: int, turns: int) -> list[dict[str, Any]]:
    """The request bodies of one conversation's turns, each repeating the
    previous ones (a 2 KB system prompt of its own)."""
    messages = [{"role": "system", "content": f"You are assistant {n}. " * 100}]
    bodies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Conversation {n}, question {turn}?" * 30})
        bodies.append({"model": "m", "messages": list(messages), "max_tokens": 4})
        messages.append({"role": "assistant", "content": f"Answer {turn} of {n}. " * 40})
    return bodies


async def send(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await client.post(CHAT, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text


def directory() -> StaticDirectory:
    d = StaticDirectory()
    d.add_endpoint(EndpointRoute(EP, "chat", "m"), REPLICAS)
    return d


def test_two_gateways_send_each_conversation_to_one_replica() -> None:
    async def scenario() -> None:
        upstream = RecordingUpstream()
        shared = directory()
        a, b = gateway(shared, upstream), gateway(shared, upstream)
        where: dict[int, set[str]] = {}
        for n in range(12):
            for turn, body in enumerate(conversation(n, 6)):
                # Turns alternate between the two gateways.
                await send((a, b)[turn % 2], body)
                where.setdefault(n, set()).add(upstream.sent[-1])
        assert all(len(replicas) == 1 for replicas in where.values()), where
        # Conversations spread over the replicas.
        assert len(set.union(*where.values())) >= 3
        metrics = a.gateway.metrics.render().decode()  # type: ignore[attr-defined]
        assert f'inferd_gateway_routed_requests_total{{endpoint="{EP}",reason="home"}}' in metrics

    asyncio.run(scenario())


def test_a_dead_replicas_conversations_move_at_once_and_stay_together() -> None:
    async def scenario() -> None:
        upstream = RecordingUpstream()
        shared = directory()
        a, b = gateway(shared, upstream), gateway(shared, upstream)
        turns = conversation(1, 6)
        await send(a, turns[0])
        home = upstream.sent[-1]
        upstream.dead.add(home)  # it dies: connections are refused
        sent_before = len(upstream.sent)
        await send(b, turns[1])  # b retries elsewhere; the directory drops it
        assert home not in {r.url for r in shared.ready_replicas(EP)}
        after = upstream.sent[sent_before:]
        assert home not in after
        moved_to = after[-1]
        for turn, body in enumerate(turns[2:]):
            await send((a, b)[turn % 2], body)
        assert set(upstream.sent[sent_before:]) == {moved_to}

    asyncio.run(scenario())


@pytest.mark.parametrize("policy", [Policy.LEAST_LOADED, Policy.PREFIX])
def test_least_loaded_stays_available(policy: Policy) -> None:
    async def scenario() -> set[str]:
        upstream = RecordingUpstream()
        client = gateway(directory(), upstream, policy)
        for body in conversation(3, 8):
            await send(client, body)
        return set(upstream.sent)

    used = asyncio.run(scenario())
    # Least-loaded goes round-robin among idle replicas; prefix stays put.
    assert len(used) == (len(REPLICAS) if policy is Policy.LEAST_LOADED else 1)


@pytest.mark.parametrize("place", [True, False])
def test_prompts_are_split_by_what_each_cache_holds(place: bool) -> None:
    """12 new conversations over 2 replicas, their turns alternating between
    two gateways that read the replicas' lists of placed prefixes every 4
    requests: with placement, 6 on each replica (hashing alone splits these
    12 prompts 7/5), and the two gateways agree on every prompt from the
    second turn on (a prompt placed apart in the first turn moves once: a
    prefill)."""

    async def scenario() -> tuple[list[dict[int, str]], int]:
        upstream = RecordingUpstream()
        shared = StaticDirectory()
        shared.add_endpoint(EndpointRoute(EP, "chat", "m"), REPLICAS[:2])
        settings = GatewaySettings(routing_place_prefixes=place)
        clients, gateways = [], []
        for _ in range(2):
            gw = Gateway(shared, verifier_for({EP: TOKEN}), settings, upstream=upstream)  # type: ignore[arg-type]
            app = Starlette(routes=gateway_routes(gw), exception_handlers=EXCEPTION_HANDLERS)
            transport = httpx.ASGITransport(app)
            clients.append(httpx.AsyncClient(transport=transport, base_url="http://gateway"))
            gateways.append(gw)
        turns: list[dict[int, str]] = []
        sent = 0
        rng = random.Random(5)
        for turn in range(4):
            turns.append({})
            for n in rng.sample(range(12), 12):  # each turn in another order
                await send(clients[sent % 2], conversation(n, 4)[turn])
                turns[-1][n] = upstream.sent[-1]
                sent += 1
                if sent % 4 == 0:
                    for gw in gateways:
                        await gw._claims.poll()
        moves = 0
        for gw in gateways:
            placement = gw.placements.endpoint(EP)
            moves += placement.moves if placement else 0
        return turns, moves

    (first, *later), moves = asyncio.run(scenario())
    assert all(turn == later[0] for turn in later)
    assert sum(first[n] != later[0][n] for n in first) == moves <= (4 if place else 0)
    split = sorted(list(later[0].values()).count(r.url) for r in REPLICAS[:2])
    assert split == ([6, 6] if place else [5, 7])
