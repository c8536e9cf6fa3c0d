"""A replica's list of the prompt prefixes gateways placed on it, and the
gateway's poll of those lists: what is listed, how it is bounded, and that
a replica that cannot answer leaves the placements as they were."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from inferd.api.replica import PLACED_HEADER, PLACED_PREFIXES_PATH
from inferd.gateway.directory import RoutableReplica
from inferd.gateway.placement import Claim, Placements
from inferd.gateway.placement_claims import ClaimsPoller
from inferd.gateway.upstream import Headers, UpstreamConnectError
from inferd.replica.auth import RequireCallKey
from inferd.replica.placed_prefixes import PlacedPrefixes, PlacedPrefixesApp


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_keys_are_listed_with_their_first_and_last_placement() -> None:
    clock = Clock()
    placed = PlacedPrefixes(clock=clock)
    placed.note(7)
    clock.now += 5
    placed.note(8)
    clock.now += 5
    placed.note(7)
    assert placed.listing() == [(8, 1005.0, 1005.0), (7, 1000.0, 1010.0)]


def test_the_list_is_bounded_and_forgets_keys_not_placed_for_its_horizon() -> None:
    clock = Clock()
    placed = PlacedPrefixes(max_entries=3, horizon_s=60.0, clock=clock)
    for key in range(5):
        placed.note(key)
    assert [k for k, _, _ in placed.listing()] == [2, 3, 4]
    clock.now += 30
    placed.note(3)
    clock.now += 31
    assert [k for k, _, _ in placed.listing()] == [3]


def _replica_app(placed: PlacedPrefixes) -> httpx.AsyncClient:
    async def chat(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app = RequireCallKey(PlacedPrefixesApp(inner, placed), "k")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://replica")


def test_the_replica_notes_the_gateways_header_and_lists_behind_its_call_key() -> None:
    async def scenario() -> None:
        placed = PlacedPrefixes()
        async with _replica_app(placed) as client:
            key = {"authorization": "Bearer k"}
            sent = await client.post(
                "/v1/chat/completions", headers={**key, PLACED_HEADER: "12345"}, content=b"{}"
            )
            assert sent.status_code == 200
            bad = await client.post(
                "/v1/chat/completions", headers={**key, PLACED_HEADER: "x"}, content=b"{}"
            )
            assert bad.status_code == 200  # a bad value is ignored, the request served
            assert (await client.get(PLACED_PREFIXES_PATH)).status_code == 401
            listed = (await client.get(PLACED_PREFIXES_PATH, headers=key)).json()["prefixes"]
            assert [k for k, _, _ in listed] == [12345]

    asyncio.run(scenario())


class _Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.headers: list[tuple[bytes, bytes]] = []
        self._body = body

    async def next_chunk(self) -> bytes:
        body, self._body = self._body, b""
        return body

    def close(self) -> None:
        return None


class Replicas:
    """Upstream of replicas that list prefixes, one that is down, one of a
    version without the list, one that sends garbage."""

    def __init__(self, listings: dict[str, bytes]) -> None:
        self.listings = listings
        self.asked: list[tuple[str, str, Headers]] = []

    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> _Response:
        self.asked.append((base_url, path, headers))
        listing = self.listings.get(base_url)
        if listing is None:
            raise UpstreamConnectError("connection refused")
        if listing == b"404":
            return _Response(404, b"not found")
        return _Response(200, listing)

    def abort_host(self, base_url: str, reason: str) -> int:
        return 0

    async def aclose(self) -> None:
        return None


def test_the_poll_merges_what_the_replicas_answer_and_skips_the_rest() -> None:
    replicas = [
        RoutableReplica(rid, f"http://{rid}", call_key=f"key-{rid}")
        for rid in ("a", "b", "down", "old", "garbage")
    ]
    upstream = Replicas(
        {
            "http://a": b'{"prefixes": [[1, 5.0, 9.0], [2, 1.0, 2.0]]}',
            "http://b": b'{"prefixes": [[1, 6.0, 10.0]]}',
            "http://old": b"404",
            "http://garbage": b'{"prefixes": [[1, "x"]]}',
        }
    )
    placements = Placements()
    placements.place("ep", 99, 8, replicas, 0.0)
    placement = placements.endpoint("ep")
    assert placement is not None
    poller = ClaimsPoller(placements, lambda ep: replicas, lambda: 1.0, upstream)  # type: ignore[arg-type]
    asyncio.run(poller.poll())
    assert placement.claims() == {1: Claim("a", "b"), 2: Claim("a", "a")}
    assert {(url, path) for url, path, _ in upstream.asked} == {
        (r.url, PLACED_PREFIXES_PATH) for r in replicas
    }
    # Each replica is asked with its own call key.
    assert all(
        (b"authorization", b"Bearer key-" + url[7:].encode()) in h for url, _, h in upstream.asked
    )
    # A new prefix follows the list: placed last on "b".
    assert placement.place(1, 8, replicas, 2.0) == "b"
