"""A batch runs as the client whose token created it: the batch keeps that
client's name (memory store), and the gateway serves its in-process
requests as that client (its fair share, its rate limit, which makes them
wait rather than fail, its usage on /metrics); a client token revoked since
opens nothing, as the token itself would not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from starlette.applications import Starlette

from inferd.control.batches.model import BatchSettings
from inferd.control.batches.service import BatchService
from inferd.control.endpoints.tokens import TokenVerifier, hash_token, new_endpoint_token
from inferd.control.model import ClientToken
from inferd.control.stores.memory import MemoryStore
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.caller import InProcessCaller
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.inprocess import InProcessGrant
from inferd.gateway.static import StaticDirectory
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.server.batch_routes import BatchRoutes
from tests.records import T0, endpoint_row

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def test_a_batch_keeps_the_client_whose_token_created_it() -> None:
    store = MemoryStore()
    row = endpoint_row(1)
    owner, app_token = new_endpoint_token(), new_endpoint_token()
    verifier = TokenVerifier(store)
    verifier.set_active(row.id, hash_token(owner))
    verifier.set_clients(
        row.id, [ClientToken(row.id, "app", hash_token(app_token), "hint", T0, 2.0, 60)]
    )
    service = BatchService(store, {row.id: row}.get, BatchSettings(), lambda: T0)
    routes = BatchRoutes(service, verifier, lambda: T0, 1 << 20)
    app = Starlette(routes=routes.routes(), exception_handlers=EXCEPTION_HANDLERS)
    base = f"/endpoints/{row.id}/openai/v1"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}

    async def create(token: str) -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            up = await client.post(
                f"{base}/files",
                files={"file": ("in.jsonl", (json.dumps(line) + "\n").encode())},
                data={"purpose": "batch"},
                headers=headers,
            )
            assert up.status_code == 200, up.text
            made = await client.post(
                f"{base}/batches",
                json={
                    "input_file_id": up.json()["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
                headers=headers,
            )
            assert made.status_code == 200, made.text
            body: dict[str, Any] = made.json()
            return body

    async def scenario() -> None:
        await store.insert_endpoint(row, bytes(32))
        by_app = await create(app_token)
        by_owner = await create(owner)
        for made, client in ((by_app, "app"), (by_owner, "")):
            stored = await store.get_batch(made["id"])
            assert stored is not None and stored.client == client
            assert set(made) >= {"id", "request_counts", "status"}  # OpenAI's shape kept
        await store.close()

    asyncio.run(scenario())


class Replica:
    """Answers every request at once with a usage of 3 + 4 tokens."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        usage = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}'
        return httpx.Response(
            200, headers={"content-type": "application/json"}, stream=httpx.ByteStream(usage)
        )


def _gateway(per_minute: int) -> tuple[Gateway, TokenVerifier, Replica, str]:
    ep = "ep-batch-client"
    directory = StaticDirectory()
    directory.add_endpoint(EndpointRoute(ep, "chat", "m"), [RoutableReplica("r", "http://r")])
    verifier = TokenVerifier(MemoryStore())
    token = new_endpoint_token()
    verifier.set_active(ep, hash_token(new_endpoint_token()))
    verifier.set_clients(
        ep, [ClientToken(ep, "app", hash_token(token), "hint", T0, 4.0, per_minute)]
    )
    replica = Replica()
    gateway = Gateway(
        directory, verifier, upstream=httpx.AsyncClient(transport=httpx.MockTransport(replica))
    )
    return gateway, verifier, replica, token


def test_in_process_requests_run_as_the_batch_client() -> None:
    gateway, verifier, replica, token = _gateway(per_minute=600)
    ep = "ep-batch-client"
    caller = InProcessCaller(gateway)
    grant = InProcessGrant(ep, "batch_1", "app")
    app = Starlette(routes=gateway_routes(gateway), exception_handlers=EXCEPTION_HANDLERS)

    async def scenario() -> None:
        await gateway.startup()
        try:
            reply = await caller.post(grant, "/v1/chat/completions", CHAT, "batch_1-0")
            assert reply.status == 200
            # Counted as the client's, not the owner's: usage and fair share.
            tokens = gateway.metrics.client_tokens.labels(ep, "app", "completion")
            assert tokens._value.get() == 4
            owner = gateway.metrics.client_tokens.labels(ep, "owner", "completion")
            assert owner._value.get() == 0
            counters = gateway._dispatcher._state(gateway._book.endpoint(ep)).share.counters
            assert set(counters) == {"app"}
            # The client's bucket is empty: its own request over the wire is
            # refused 429; the batch's waits for the bucket (600 a minute:
            # one every 0.1 s) and is answered.
            while gateway.rate_limits.take(ep, "app", 600) == 0:
                pass
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                refused = await client.post(
                    f"/endpoints/{ep}/openai/v1/chat/completions",
                    content=CHAT,
                    headers={"Authorization": f"Bearer {token}"},
                )
            assert refused.status_code == 429
            calls = replica.calls
            waited = await caller.post(grant, "/v1/chat/completions", CHAT, "batch_1-1")
            assert waited.status == 200 and replica.calls == calls + 1
            # Revoked since the batch was created: refused like the token.
            verifier.set_clients(ep, [])
            revoked = await caller.post(grant, "/v1/chat/completions", CHAT, "batch_1-2")
            assert revoked.status == 401 and replica.calls == calls + 1
            # The owner's batches are the owner's, as before.
            owned = await caller.post(
                InProcessGrant(ep, "batch_2"), "/v1/chat/completions", CHAT, "batch_2-0"
            )
            assert owned.status == 200 and owner._value.get() == 4
        finally:
            await gateway.shutdown()

    asyncio.run(asyncio.wait_for(scenario(), 20))
