"""Client tokens through the management API and the gateway, in process on a
real SQLite store: shown once and stored as a digest, listed by hint with
their last use, revoked one by one on this instance and on another one
following the same store, the owner's token untouched, the roles of the
endpoint's project, a rate limit answered 429 with Retry-After, and usage
per token on /metrics. No replica: the gateway answers `/v1/models` itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from inferd.control.endpoints.tokens import TokenVerifier, is_well_formed, new_endpoint_token
from inferd.control.fakes import FakeLauncher
from inferd.control.stores.sql.store import SqliteStore
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute
from inferd.gateway.static import StaticDirectory
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings

OPERATOR_KEY = "test-operator-key-0123456789"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Api:
    def __init__(self, client: TestClient, plane: Server) -> None:
        self.client = client
        self.plane = plane
        self.keys: dict[str, str] = {}

    def op(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
        headers = OPERATOR if key is None else bearer(key)
        return self.client.request(method, "/inference" + path, headers=headers, **kwargs)

    def ok(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
        resp = self.op(method, path, key, **kwargs)
        assert resp.status_code < 300, resp.text
        return resp.json() if resp.content else None

    def models(self, endpoint_id: str, token: str) -> Any:
        return self.client.get(f"/endpoints/{endpoint_id}/openai/v1/models", headers=bearer(token))


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One server for the module (each test makes its own endpoints)."""
    state = tmp_path_factory.mktemp("client-tokens") / "state"
    settings = load_settings(env={}, overrides={"state_dir": state, "admin_key": OPERATOR_KEY})
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    try:
        with TestClient(create_app(plane)) as client:
            yield Api(client, plane)
    finally:
        asyncio.run(plane.close())


def endpoint(api: Api, project: str = "default") -> dict[str, Any]:
    body = {"name": f"ep-{time.monotonic_ns()}", "modelName": "tiny-chat", "minReplicas": 0,
            "projectId": project}  # fmt: skip
    created: dict[str, Any] = api.ok("POST", "/endpoints", json=body)
    return created


def test_a_client_token_is_shown_once_works_beside_the_owners_and_is_revoked_alone(
    api: Api,
) -> None:
    ep = endpoint(api)
    eid, owner = ep["id"], ep["accessToken"]
    created = api.op("POST", f"/endpoints/{eid}/tokens", json={"name": "billing", "weight": 2})
    assert created.status_code == 201, created.text
    body = created.json()
    token = body["token"]
    assert is_well_formed(token) and body["hint"].endswith(token[-4:])
    assert (body["name"], body["weight"], body["requestsPerMinute"]) == ("billing", 2, None)
    assert body["lastUsedAt"] is None
    other = api.ok("POST", f"/endpoints/{eid}/tokens", json={"name": "search"})["token"]
    # Only digests are stored; listings show the hint, never the token.
    stored = api.plane.store._query("SELECT token_hash FROM endpoint_client_tokens")
    assert len(stored) == 2 and all(len(bytes(r[0])) == 32 for r in stored)
    assert token.encode() not in b"".join(bytes(r[0]) for r in stored)
    listing = api.op("GET", f"/endpoints/{eid}/tokens")
    assert token not in listing.text and other not in listing.text
    assert [t["name"] for t in listing.json()["data"]] == ["billing", "search"]

    for key in (owner, token, other):
        assert api.models(eid, key).status_code == 200
    # Last use is listed (from memory until the next flush to the store).
    assert api.ok("GET", f"/endpoints/{eid}/tokens/billing")["lastUsedAt"] is not None

    made_up = api.models(eid, new_endpoint_token())
    assert api.op("DELETE", f"/endpoints/{eid}/tokens/billing").status_code == 204
    revoked = api.models(eid, token)
    # Exactly the answer of a token that never existed.
    assert revoked.status_code == 401 and revoked.json() == made_up.json()
    assert revoked.headers["www-authenticate"] == "Bearer"
    assert api.models(eid, other).status_code == 200
    assert api.models(eid, owner).status_code == 200
    # The owner's "Request Access Token" leaves the client tokens alone.
    new_owner = api.ok("POST", f"/endpoints/{eid}/access-token")["accessToken"]
    assert api.models(eid, owner).status_code == 401
    assert api.models(eid, new_owner).status_code == 200
    assert api.models(eid, other).status_code == 200
    # A client token opens its own endpoint only.
    assert api.models(endpoint(api)["id"], other).status_code == 401
    assert api.op("GET", f"/endpoints/{eid}/tokens/billing").status_code == 404
    # The name is free again.
    assert api.op("POST", f"/endpoints/{eid}/tokens", json={"name": "billing"}).status_code == 201


BAD = [
    ({"name": "owner"}, 400, "invalid_value"),
    ({"name": "Has Spaces"}, 400, None),
    ({"name": "x", "weight": 0}, 400, None),
    ({"name": "x", "requestsPerMinute": 0}, 400, None),
    ({"name": "x", "unknown": 1}, 400, None),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD)
def test_bad_requests_are_clean_400s(
    api: Api, body: dict[str, Any], status: int, code: str | None
) -> None:
    eid = endpoint(api)["id"]
    resp = api.op("POST", f"/endpoints/{eid}/tokens", json=body)
    assert resp.status_code == status, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    if code is not None:
        assert resp.json()["error"]["code"] == code


def test_duplicates_unknown_names_and_endpoints(api: Api) -> None:
    eid = endpoint(api)["id"]
    api.ok("POST", f"/endpoints/{eid}/tokens", json={"name": "app"})
    dup = api.op("POST", f"/endpoints/{eid}/tokens", json={"name": "app"})
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "client_token_exists"
    assert api.op("DELETE", f"/endpoints/{eid}/tokens/nobody").status_code == 404
    missing = "00000000-0000-4000-8000-000000000000"
    assert api.op("GET", f"/endpoints/{missing}/tokens").status_code == 404


def test_roles_are_the_endpoints_project_roles(api: Api) -> None:
    api.ok("POST", "/projects", json={"id": "team"})
    api.ok("POST", "/projects", json={"id": "rivals"})
    keys = {}
    for user, project, role in (("dev", "team", "developer"), ("viewer", "team", "viewer"),
                                ("outsider", "rivals", "admin")):  # fmt: skip
        created = api.ok("PUT", f"/projects/{project}/members/{user}", json={"role": role})
        keys[user] = created["createdKey"]["key"]
    eid = endpoint(api, "team")["id"]
    path = f"/endpoints/{eid}/tokens"
    assert api.op("POST", path, keys["dev"], json={"name": "dev-app"}).status_code == 201
    assert api.op("GET", path, keys["viewer"]).status_code == 200
    assert api.op("POST", path, keys["viewer"], json={"name": "v"}).status_code == 403
    assert api.op("DELETE", path + "/dev-app", keys["viewer"]).status_code == 403
    assert api.op("GET", path, keys["outsider"]).status_code == 404
    assert api.op("DELETE", path + "/dev-app", keys["outsider"]).status_code == 404
    audit = api.ok("GET", "/projects/team/audit")["data"]
    assert any(e["action"] == "endpoint.client_token.create" for e in audit)


def test_a_rate_limited_token_gets_429_with_retry_after_and_metrics_name_it(api: Api) -> None:
    eid = endpoint(api)["id"]
    token = api.ok(
        "POST", f"/endpoints/{eid}/tokens", json={"name": "cron", "requestsPerMinute": 2}
    )["token"]
    assert [api.models(eid, token).status_code for _ in range(2)] == [200, 200]
    refused = api.models(eid, token)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    metrics = api.client.get("/metrics").text
    series = 'inferd_gateway_client_requests_total{{client="cron",endpoint="{}",status="{}"}} {}'
    assert series.format(eid, 429, "1.0") in metrics
    assert series.format(eid, 200, "2.0") in metrics


def test_a_revocation_reaches_another_instance_following_the_store(api: Api) -> None:
    eid = endpoint(api)["id"]
    token = api.ok("POST", f"/endpoints/{eid}/tokens", json={"name": "mobile"})["token"]
    store = api.plane.store
    assert isinstance(store, SqliteStore)

    async def other_instance() -> tuple[bool, bool, float]:
        # Another server on the same database: its own store, cache and feed.
        other = SqliteStore.open(store.path)
        verifier = TokenVerifier(other)
        feed = other.changes()
        await verifier.load()
        follower = asyncio.ensure_future(verifier.follow(feed))
        try:
            before = verifier.verify(eid, token)
            await asyncio.to_thread(api.op, "DELETE", f"/endpoints/{eid}/tokens/mobile")
            started = time.monotonic()
            for _ in range(500):
                if not verifier.verify(eid, token):
                    break
                await asyncio.sleep(0.02)
            return before, verifier.verify(eid, token), time.monotonic() - started
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await other.close()

    before, after, _ = asyncio.run(other_instance())
    assert before and not after


def test_a_rate_limit_holds_across_two_instances_on_the_same_store(api: Api) -> None:
    """A client that used its minute's worth on this instance is refused on
    another one following the same database (before, each instance counted
    alone: two instances let twice the limit through)."""
    eid = endpoint(api)["id"]
    token = api.ok(
        "POST", f"/endpoints/{eid}/tokens", json={"name": "roamer", "requestsPerMinute": 6}
    )["token"]
    assert [api.models(eid, token).status_code for _ in range(6)] == [200] * 6
    assert api.models(eid, token).status_code == 429
    store = api.plane.store
    assert isinstance(store, SqliteStore)

    async def other_instance() -> list[httpx.Response]:
        other = SqliteStore.open(store.path)
        verifier = TokenVerifier(other)
        await verifier.load()
        directory = StaticDirectory()
        directory.add_endpoint(EndpointRoute(eid, "chat", "tiny-chat"), [])
        gateway = Gateway(directory, verifier, shared_limits=other)
        await gateway.startup()
        app = Starlette(routes=gateway_routes(gateway), exception_handlers=EXCEPTION_HANDLERS)
        try:
            # This instance tells the store what it admitted within a second.
            for _ in range(250):
                shared = await other.exchange_rate_spend({(eid, "roamer"): (0, 6)}, time.time())
                if shared[(eid, "roamer")] < 1:
                    break
                await asyncio.sleep(0.02)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                url = f"/endpoints/{eid}/openai/v1/models"
                return [await client.get(url, headers=bearer(token)) for _ in range(2)]
        finally:
            await gateway.shutdown()
            await other.close()

    answers = asyncio.run(other_instance())
    assert [a.status_code for a in answers] == [429, 429], answers[0].text
    assert answers[0].json()["error"]["code"] == "rate_limited"
    assert int(answers[0].headers["retry-after"]) >= 1


def test_the_cli_creates_lists_and_revokes(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from inferd.cli import main
    from inferd.client import cli as endpoints_cli
    from inferd.client.api import ManagementClient

    ep = endpoint(api)
    monkeypatch.setattr(
        endpoints_cli,
        "client_from_args",
        lambda args, env=None: ManagementClient(admin_key=OPERATOR_KEY, http=api.client),
    )
    assert main(["endpoints", "tokens", "create", ep["name"], "ci", "--weight", "3",
                 "--rate-limit", "600"]) == 0  # fmt: skip
    token = capsys.readouterr().out.splitlines()[0]
    assert is_well_formed(token) and api.models(ep["id"], token).status_code == 200
    assert main(["endpoints", "tokens", "list", ep["name"]]) == 0
    listed = capsys.readouterr().out
    assert "ci" in listed and "600/min" in listed and token not in listed
    assert main(["endpoints", "tokens", "revoke", ep["name"], "ci"]) == 0
    assert api.models(ep["id"], token).status_code == 401
    assert main(["endpoints", "tokens", "revoke", ep["name"], "ci"]) == 1
    assert "no client token named 'ci'" in capsys.readouterr().err


def test_the_console_lists_creates_shows_once_and_revokes(api: Api) -> None:
    import re

    from tests.console_support import sign_in

    ep = endpoint(api)
    page = f"/console/endpoints/{ep['id']}"
    csrf = sign_in(api.client, OPERATOR_KEY)
    assert "None yet." in api.client.get(page).text
    created = api.client.post(
        page + "/client-tokens",
        data={"csrf": csrf, "name": "web-app", "weight": "2", "requestsPerMinute": "120"},
    )
    assert created.status_code == 200  # the redirect to the endpoint's page, followed
    shown = re.search(r'data-testid="client-token">([^<]+)<', created.text)
    assert shown is not None and api.models(ep["id"], shown.group(1)).status_code == 200
    again = api.client.get(page).text
    assert shown.group(1) not in again and "web-app" in again and "120/min" in again
    bad = api.client.post(page + "/client-tokens", data={"csrf": csrf, "name": "Bad Name"})
    assert bad.status_code == 400
    without_csrf = api.client.post(page + "/client-tokens/web-app/revoke", data={})
    assert without_csrf.status_code == 403
    revoked = api.client.post(page + "/client-tokens/web-app/revoke", data={"csrf": csrf})
    assert revoked.status_code == 200 and "None yet." in revoked.text
    assert api.models(ep["id"], shown.group(1)).status_code == 401
