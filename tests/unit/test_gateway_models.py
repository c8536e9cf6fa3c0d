"""`/v1/models` through the gateway: the base model and its adapters, with
nothing of the server's disk in what a client reads."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

import httpx
from starlette.applications import Starlette

from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.testing import verifier_for

EP = "ep-models"
TOKEN = new_endpoint_token()
ADAPTERS = {
    "sql": "/srv/inferd/adapters/sql-lora",  # a directory on the server
    "poems": "someorg/poems-lora@v2",  # a Hugging Face repository, at a revision
}


def models() -> dict[str, dict[str, object]]:
    directory = StaticDirectory()
    directory.add_endpoint(
        EndpointRoute(EP, "chat", "tiny-chat", adapters=MappingProxyType(ADAPTERS))
    )
    gateway = Gateway(directory, verifier_for({EP: TOKEN}), GatewaySettings())
    app = Starlette(routes=gateway_routes(gateway), exception_handlers=EXCEPTION_HANDLERS)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.get(
                f"/endpoints/{EP}/openai/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}
            )

    response = asyncio.run(get())
    assert response.status_code == 200, response.text
    return {card["id"]: card for card in response.json()["data"]}


def test_an_adapter_from_a_server_directory_shows_its_name_not_the_path() -> None:
    cards = models()
    assert cards["sql"]["root"] == "sql" and cards["sql"]["parent"] == "tiny-chat"
    assert "/srv" not in str(cards)


def test_an_adapter_from_a_repository_shows_the_repository_as_registered() -> None:
    cards = models()
    assert cards["poems"]["root"] == "someorg/poems-lora@v2"
    assert cards["tiny-chat"]["root"] == "tiny-chat" and "parent" not in cards["tiny-chat"]
