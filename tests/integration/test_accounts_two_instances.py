"""Two control planes on one database (as several instances behind a load
balancer share one): a key revoked or a member removed on one stops working
on the other, which had it cached, within the change feed's delay; an
endpoint created or a token re-issued on one works on the other at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import load_settings
from inferd.testing.postgres import PostgresServer

OPERATOR = "two-instances-operator-key-0123"
FEED_DELAY_S = 3.0  # the SQLite change log is polled every 0.5 s


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    yield from _pair(tmp_path, {})


@pytest.fixture(params=["sqlite", "postgres"])
def any_pair(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[TestClient, TestClient]]:
    """Two instances on one SQLite file, or on one real PostgreSQL."""
    more: dict[str, Any] = {}
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        more["database_url"] = server.create_database()
    yield from _pair(tmp_path, more)


def _pair(tmp_path: Path, more: dict[str, Any]) -> Iterator[tuple[TestClient, TestClient]]:
    settings = load_settings(
        env={}, overrides={"state_dir": tmp_path, "admin_key": OPERATOR, **more}
    )
    planes = [
        asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False)) for _ in range(2)
    ]
    try:
        with TestClient(create_app(planes[0])) as a, TestClient(create_app(planes[1])) as b:
            a.headers["Authorization"] = b.headers["Authorization"] = f"Bearer {OPERATOR}"
            yield a, b
    finally:
        for plane in planes:
            asyncio.run(plane.close())


def status_within(client: TestClient, path: str, key: str, want: int) -> int:
    deadline = time.monotonic() + FEED_DELAY_S
    while True:
        got = client.get(path, headers={"Authorization": f"Bearer {key}"}).status_code
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_revocation_and_removal_reach_the_other_instance(
    pair: tuple[TestClient, TestClient],
) -> None:
    a, b = pair
    assert a.post("/inference/projects", json={"id": "team"}).status_code == 201
    added = a.put("/inference/projects/team/members/ada", json={"role": "developer"})
    key = added.json()["createdKey"]
    spare = a.post("/inference/users/ada/keys", json={"name": "spare"}).json()
    # B resolves (and caches) both keys.
    for k in (key["key"], spare["key"]):
        assert (
            b.get("/inference/projects/team", headers={"Authorization": f"Bearer {k}"}).status_code
            == 200
        )

    assert a.delete(f"/inference/users/ada/keys/{key['id']}").status_code == 204
    assert status_within(b, "/inference/projects/team", key["key"], 401) == 401
    # The other key still works on B, and a membership removed on A takes
    # the project away from it on B.
    assert status_within(b, "/inference/projects/team", spare["key"], 200) == 200
    assert a.delete("/inference/projects/team/members/ada").status_code == 204
    assert status_within(b, "/inference/projects/team", spare["key"], 404) == 404
    # A quota set on A caps creates made on B.
    a.put("/inference/projects/team/quota", json={"endpoints": 0})
    deadline = time.monotonic() + FEED_DELAY_S
    body = {"name": "late", "modelName": "tiny-chat", "minReplicas": 0, "projectId": "team"}
    while True:
        resp = b.post("/inference/endpoints", json=body)
        if resp.status_code == 409 or time.monotonic() > deadline:
            break
        b.delete(f"/inference/endpoints/{resp.json()['id']}")
        body["name"] += "x"
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "quota_exceeded"


def test_a_quota_holds_across_instances(any_pair: tuple[TestClient, TestClient]) -> None:
    """Each instance checks a project's quota against the store under a lock
    shared with the others, not against its own copy of the endpoints: a
    create on A and then at once on B, and creates racing on both, never
    exceed the quota together."""
    a, b = any_pair
    assert (
        a.post("/inference/projects", json={"id": "team", "quota": {"endpoints": 1}}).status_code
        == 201
    )

    def create(client: TestClient, name: str) -> int:
        body = {"name": name, "modelName": "tiny-chat", "minReplicas": 0, "projectId": "team"}
        return client.post("/inference/endpoints", json=body).status_code

    # B has not heard of A's endpoint through the change feed yet.
    assert create(a, "first") == 201
    assert create(b, "second") == 409
    listed = a.get("/inference/endpoints").json()["data"]
    assert [e["name"] for e in listed if e["projectId"] == "team"] == ["first"]

    # Room for three more; eight creates race on the two instances.
    assert a.put("/inference/projects/team/quota", json={"endpoints": 4}).status_code == 200
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda n: create((a, b)[n % 2], f"race-{n}"), range(8)))
    assert sorted(codes) == [201] * 3 + [409] * 5, codes
    listed = b.get("/inference/endpoints").json()["data"]
    assert len([e for e in listed if e["projectId"] == "team"]) <= 4
    deadline = time.monotonic() + FEED_DELAY_S
    while len([e for e in listed if e["projectId"] == "team"]) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
        listed = b.get("/inference/endpoints").json()["data"]
    assert len([e for e in listed if e["projectId"] == "team"]) == 4


def test_an_endpoint_made_on_one_instance_answers_through_the_other_at_once(
    pair: tuple[TestClient, TestClient],
) -> None:
    """A client that creates an endpoint through one instance and calls it
    through another must not be refused while the other's change feed
    catches up (SQLite's is polled every 0.5 s: without the read on a miss,
    B answers 401 here every time)."""
    a, b = pair
    body = {"name": "chat", "modelName": "tiny-chat", "minReplicas": 0}
    created = a.post("/inference/endpoints", json=body).json()
    eid, token = created["id"], created["accessToken"]
    models = f"/endpoints/{eid}/openai/v1/models"
    answered = b.get(models, headers={"Authorization": f"Bearer {token}"})
    assert answered.status_code == 200, answered.text
    assert [m["id"] for m in answered.json()["data"]] == ["tiny-chat"]
    # A token re-issued on A opens the endpoint on B at once too.
    fresh = a.post(f"/inference/endpoints/{eid}/access-token").json()["accessToken"]
    assert b.get(models, headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
    # What the store does not hold still gets the one 401, after its read.
    wrong = b.get(models, headers={"Authorization": f"Bearer {token[:-1]}x"})
    assert wrong.status_code == 401
    unknown = b.get(
        "/endpoints/no-such-endpoint/openai/v1/models",
        headers={"Authorization": f"Bearer {fresh}"},
    )
    assert unknown.status_code == 401
    assert unknown.json() == wrong.json()
