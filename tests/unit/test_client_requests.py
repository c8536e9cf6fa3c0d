"""What the gateway knows of a client's request, as tables: whose token it
is (owner, client, revoked, unknown), its rate limit's buckets, its priority
class (header or ASGI scope), and the usage read from the answer's bytes;
then in process: a batch request waits for the interactive ones, and a bad
priority header is a clean 400 before anything goes upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from inferd.control.endpoints.tokens import TokenVerifier, hash_token, new_endpoint_token
from inferd.control.model import ClientToken
from inferd.control.stores.sql.store import MemoryStore
from inferd.errors import BadRequest
from inferd.gateway.app import Gateway, gateway_routes, is_batch
from inferd.gateway.auth import OWNER_CALLER, Caller
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.ratelimit import RateLimits, retry_after_seconds
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.gateway.usage import UsageTail
from inferd.http_errors import EXCEPTION_HANDLERS
from tests.records import T0

EP = "ep-clients"


def client_token(name: str, token: str, weight: float = 1.0) -> ClientToken:
    return ClientToken(EP, name, hash_token(token), "hint", T0, weight, 30)


def test_whose_token_it_is() -> None:
    owner, app, other = new_endpoint_token(), new_endpoint_token(), new_endpoint_token()
    verifier = TokenVerifier(MemoryStore(), wall=lambda: 1_700_000_000.0)
    verifier.set_active(EP, hash_token(owner))
    verifier.set_clients(EP, [client_token("app", app, 3.0)])
    assert verifier.identify(EP, owner) is OWNER_CALLER
    assert verifier.identify(EP, app) == Caller("app", 3.0, 30)
    assert verifier.identify(EP, other) is None
    assert verifier.identify("another-endpoint", app) is None
    assert verifier.identify(EP, app[:-1] + "x") is None  # checksum fails: no lookup
    assert verifier.pending_last_used(EP, "app") is not None
    verifier.set_clients(EP, [])  # revoked
    assert verifier.identify(EP, app) is None
    assert verifier.identify(EP, owner) is OWNER_CALLER
    verifier.set_clients(EP, [client_token("app", app)])
    verifier.forget(EP)  # the endpoint is deleted: every token of it fails
    assert verifier.identify(EP, app) is None and verifier.identify(EP, owner) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


BUCKETS = [
    # (name, per minute, [(seconds since the last call, expected wait)])
    ("a burst of a minute's worth, then refused", 3, [(0, 0), (0, 0), (0, 0), (0, 20)]),
    ("refilled at the rate", 60, [*[(0, 0)] * 60, (0, 1), (1, 0), (0, 1)]),
    ("a refusal takes nothing", 1, [(0, 0), (0, 60), (30, 30), (30, 0)]),
    ("idle for long: full again, not more", 2, [(0, 0), (0, 0), (600, 0), (0, 0), (0, 30)]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("per_minute", "calls"), [c[1:] for c in BUCKETS], ids=[c[0] for c in BUCKETS]
)
def test_rate_limit_buckets(per_minute: int, calls: list[tuple[float, float]]) -> None:
    clock = Clock()
    limits = RateLimits(clock)
    waits = []
    for elapsed, _ in calls:
        clock.now += elapsed
        waits.append(limits.take(EP, "app", per_minute))
    assert waits == pytest.approx([wait for _, wait in calls])
    assert limits.take(EP, "another-client", per_minute) == 0  # its own bucket


def test_retry_after_is_whole_seconds_never_zero() -> None:
    assert [retry_after_seconds(w) for w in (0.01, 1.0, 1.2, 59.5)] == [1, 1, 2, 60]


PRIORITY = [
    # (name, scope extra, header, batch)
    ("no header: interactive", {}, None, False),
    ("header batch", {}, b"batch", True),
    ("header, any case and spaces", {}, b" Batch ", True),
    ("header interactive", {}, b"interactive", False),
    ("in process: the scope says batch", {"inferd.priority": "batch"}, None, True),
    ("the scope wins over a header", {"inferd.priority": "batch"}, b"interactive", True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("scope", "header", "batch"), [c[1:] for c in PRIORITY], ids=[c[0] for c in PRIORITY]
)
def test_priority_class(scope: dict[str, Any], header: bytes | None, batch: bool) -> None:
    assert is_batch(scope, header) is batch


def test_an_unknown_priority_is_a_400() -> None:
    with pytest.raises(BadRequest) as raised:
        is_batch({}, b"urgent")
    assert raised.value.param == "x-inferd-priority"


def usage_of(*chunks: bytes) -> tuple[int | None, int | None]:
    tail = UsageTail()
    for chunk in chunks:
        tail.seen(chunk)
    return tail.counts()


USAGE = [
    ("a JSON answer", [json.dumps({"choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}).encode()], (12, 7)),
    ("a stream with its usage chunk", [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n"], (5, 2)),
    ("a stream without usage: its events", [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[]}\n\n',
        b"data: [DONE]\n\n"], (None, 2)),
    ("Responses and Messages: input and output tokens",
     [b'{"usage":{"input_tokens":40,"output_tokens":3}}'], (40, 3)),
    ("a long answer: the usage at its end", [b"x" * 100_000,
     b'{"usage":{"prompt_tokens":9,"completion_tokens":8}}'], (9, 8)),
    ("an error", [b'{"error":{"message":"no"}}'], (None, None)),
]  # fmt: skip


@pytest.mark.parametrize(("chunks", "counts"), [c[1:] for c in USAGE], ids=[c[0] for c in USAGE])
def test_usage_read_from_the_answer(
    chunks: list[bytes], counts: tuple[int | None, int | None]
) -> None:
    assert usage_of(*chunks) == counts


class SlowReplica:
    """One replica that answers after `release` is set, recording the order
    in which requests reached it."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.release = asyncio.Event()

    async def send(self, base_url: str, method: str, path: str, headers: Any, body: bytes) -> Any:
        self.order.append(json.loads(body)["user"])
        await self.release.wait()
        return Answer()

    def abort_host(self, base_url: str, reason: str) -> int:
        return 0

    async def aclose(self) -> None:
        pass


class Answer:
    status = 200
    headers = [(b"content-type", b"application/json")]
    complete = False

    async def next_chunk(self) -> bytes:
        if self.complete:
            return b""
        self.complete = True
        return b'{"usage":{"prompt_tokens":3,"completion_tokens":4}}'

    def close(self) -> None:
        pass


def test_batch_requests_wait_for_interactive_ones_and_bad_priorities_are_refused() -> None:
    owner = new_endpoint_token()
    directory = StaticDirectory()
    directory.add_endpoint(EndpointRoute(EP, "chat", "m"), [RoutableReplica("r", "http://r")])
    verifier = TokenVerifier(MemoryStore())
    verifier.set_active(EP, hash_token(owner))
    replica = SlowReplica()
    gateway = Gateway(
        directory, verifier, GatewaySettings(max_in_flight_per_replica=1), upstream=replica
    )
    app = Starlette(routes=gateway_routes(gateway), exception_handlers=EXCEPTION_HANDLERS)
    path = f"/endpoints/{EP}/openai/v1/chat/completions"

    async def scenario() -> tuple[list[str], httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

            def post(user: str, priority: str | None = None) -> Any:
                headers = {"Authorization": f"Bearer {owner}"}
                if priority is not None:
                    headers["x-inferd-priority"] = priority
                return client.post(path, json={"user": user}, headers=headers)

            async def until(held: int) -> None:
                for _ in range(1000):
                    if gateway._dispatcher.held(EP) >= held and replica.order:
                        return
                    await asyncio.sleep(0.01)

            bad = await post("bad", "urgent")
            first = asyncio.ensure_future(post("first"))
            await until(0)
            later = [asyncio.ensure_future(post("batch-1", "batch"))]
            await until(1)
            later += [asyncio.ensure_future(post(f"chat-{i}")) for i in range(2)]
            await until(3)
            replica.release.set()
            answers = await asyncio.gather(first, *later)
            assert [a.status_code for a in answers] == [200] * 4
            return replica.order, bad

    order, bad = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-inferd-priority"
    assert "bad" not in order  # refused before anything went upstream
    # The batch request came before the two chats, and went after them.
    assert order == ["first", "chat-0", "chat-1", "batch-1"]
    owner_tokens = gateway.metrics.client_tokens.labels(EP, "owner", "completion")
    assert owner_tokens._value.get() == 16  # four answers of 4 completion tokens
