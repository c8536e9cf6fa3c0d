"""In-process calls to the gateway (the batch runner's): the grant stands
for the token of its own endpoint only; nothing a client sends makes one;
the request is marked with the batch priority on its way."""

from __future__ import annotations

import asyncio
import json

import httpx

from inferd.gateway.app import Gateway
from inferd.gateway.caller import InProcessCaller
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.inprocess import GRANT_KEY, InProcessGrant, granted
from inferd.gateway.static import StaticDirectory
from inferd.testing import verifier_for

MINE, OTHER = "ep-mine", "ep-other"
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def test_only_a_grant_object_for_that_endpoint_is_granted() -> None:
    assert granted({GRANT_KEY: InProcessGrant(MINE, "batch_1")}, MINE)
    assert not granted({GRANT_KEY: InProcessGrant(OTHER, "batch_1")}, MINE)
    # What a scope could hold were it built from the wire: never the object.
    for value in ("batch_1", MINE, {"endpoint_id": MINE}, (MINE, "batch_1"), None):
        assert not granted({GRANT_KEY: value}, MINE)
    assert not granted({}, MINE)


def test_the_gateway_takes_the_grant_for_its_endpoint_and_no_other() -> None:
    seen: list[httpx.Request] = []

    def replica(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            headers={"content-type": "application/json"},
            stream=httpx.ByteStream(b'{"usage": {"prompt_tokens": 1}}'),
        )

    directory = StaticDirectory()
    for endpoint_id in (MINE, OTHER):
        directory.add_endpoint(
            EndpointRoute(endpoint_id, "chat", "m"),
            [RoutableReplica(f"r-{endpoint_id}", f"http://{endpoint_id}.replica")],
        )
    # No token of either endpoint is known: only the grant can pass.
    gateway = Gateway(
        directory,
        verifier_for({}),
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(replica)),
    )
    caller = InProcessCaller(gateway)

    async def scenario() -> None:
        await gateway.startup()
        try:
            ok = await caller.post(
                InProcessGrant(MINE, "batch_1"), "/v1/chat/completions", CHAT, "batch_1-0"
            )
            assert ok.status == 200 and json.loads(ok.body)["usage"]["prompt_tokens"] == 1
            assert ok.request_id == "batch_1-0"
            assert [str(r.url) for r in seen] == [
                f"http://{MINE}.replica/openai/v1/chat/completions"
            ]
            # A grant for one endpoint used on another's path: the same 401 as no token.
            wrong = await _call_with_grant_for(caller, OTHER, InProcessGrant(MINE, "batch_1"))
            assert wrong == 401
        finally:
            await gateway.shutdown()

    asyncio.run(scenario())


async def _call_with_grant_for(caller: InProcessCaller, path_endpoint: str,
                               grant: InProcessGrant) -> int:  # fmt: skip
    """The caller's request, its path changed to another endpoint's."""
    route = caller.route("/v1/chat/completions")
    scope = {
        "type": "http", "method": "POST", "path": f"/endpoints/{path_endpoint}{route.path}",
        "headers": [(b"content-type", b"application/json")], "client": None,
        "path_params": {"endpoint_id": path_endpoint}, GRANT_KEY: grant,
    }  # fmt: skip
    status = 0
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": CHAT, "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError

    async def send(message: dict[str, object]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])  # type: ignore[call-overload]

    await caller._gateway.handle(scope, receive, send, route)
    return status
