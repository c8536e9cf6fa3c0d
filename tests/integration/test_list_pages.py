"""Lists on the wire: `limit`, the `continue` cursor, filters, and the 400s
of a bad limit or a tampered or stale cursor (in-process, SQLite)."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest

from inferd.client.api import ManagementClient
from inferd.control.accounts.model import UsageDelta
from tests.integration.accounts_support import OPERATOR_KEY, OTHER, OWN, World, world

__all__ = ["world"]


def walk(w: World, query: dict[str, Any], key: str | None = None) -> list[list[dict[str, Any]]]:
    """Every page of the endpoint list for `query`, following `continue`."""
    pages: list[list[dict[str, Any]]] = []
    params = dict(query)
    for _ in range(100):
        body = w.ok("GET", "/endpoints", key, params=params)
        pages.append(body["data"])
        if "continue" not in body:
            return pages
        assert isinstance(body["continue"], str) and body["continue"]
        params = {**query, "continue": body["continue"]}
    raise AssertionError("the list never ended")


def ids(pages: list[list[dict[str, Any]]]) -> list[str]:
    return [r["id"] for page in pages for r in page]


def test_pages_walk_the_whole_list_in_order(world: World) -> None:
    made = [world.endpoint(OWN)["id"] for _ in range(7)]
    whole = world.ok("GET", "/endpoints")
    assert "continue" not in whole  # one page: the answer reads as before pages
    assert [r["id"] for r in whole["data"]] == made
    pages = walk(world, {"limit": 3})
    assert [len(p) for p in pages] == [3, 3, 1]
    assert ids(pages) == made
    # Records on a page are the full records, as GET by id answers them.
    first = world.ok("GET", f"/endpoints/{made[0]}")
    assert {k: v for k, v in pages[0][0].items() if k != "costSoFar"} == {
        k: v for k, v in first.items() if k != "costSoFar"
    }


def test_filters(world: World) -> None:
    web = world.endpoint(OWN, name="web-1")["id"]
    eu = world.endpoint(OWN, name="web-eu", locationName="eu-west", gpuType="cpu")["id"]
    batch = world.endpoint(OWN, name="batch-1", minReplicas=1)["id"]
    image = world.endpoint(OWN, name="img-1", modelName="tiny-sdxl")["id"]
    theirs = world.endpoint(OTHER, name="web-theirs")["id"]

    def listed(key: str | None = None, **query: Any) -> list[str]:
        return ids(walk(world, {"limit": 1, **query}, key))

    assert listed(namePrefix="web-") == [web, eu, theirs]
    assert listed(namePrefix="web-", projectId=OWN) == [web, eu]
    assert listed(locationName="eu-west") == [eu]
    assert listed(modelName="tiny-sdxl") == [image]
    assert listed(status="pending") == [batch]
    assert listed(status="scaledToZero", projectId=OWN) == [web, eu, image]
    assert listed(status="running") == []
    # A member sees their own projects only, filters or not; naming another
    # project selects nothing rather than revealing it.
    viewer = world.keys["viewer-user"]
    assert listed(viewer, namePrefix="web-") == [web, eu]
    assert listed(viewer, projectId=OTHER) == []


def test_status_filter_pages_may_be_short_but_end(world: World) -> None:
    pending = [world.endpoint(OWN, minReplicas=1)["id"] for _ in range(2)]
    for _ in range(25):
        world.endpoint(OWN)
    pending.append(world.endpoint(OWN, minReplicas=1)["id"])
    pages = walk(world, {"limit": 1, "status": "pending"})
    assert ids(pages) == pending
    assert all(len(p) <= 1 for p in pages)


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten", ""])
def test_bad_limit_is_400(world: World, limit: str) -> None:
    resp = world.op("GET", "/endpoints", params={"limit": limit})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "limit"


@pytest.mark.parametrize(
    "query", [{"status": "sleeping"}, {"namePrefix": ""}, {"modelName": ""}, {"colour": "red"}]
)
def test_bad_filter_is_400(world: World, query: dict[str, str]) -> None:
    resp = world.op("GET", "/endpoints", params=query)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == next(iter(query))


def test_tampered_and_stale_cursors_are_400(world: World) -> None:
    for _ in range(3):
        world.endpoint(OWN, name=f"web-{_}")
    cursor = world.ok("GET", "/endpoints", params={"limit": 1})["continue"]
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    # Move the position on by one without fixing the check digest.
    edited = raw.replace(b'"a":', b'"a":9', 1)
    tampered = [
        base64.urlsafe_b64encode(edited).rstrip(b"=").decode(),
        cursor[:-3],
        "not a cursor!",
        "e30",  # {} with no check digest
    ]
    for bad in tampered:
        resp = world.op("GET", "/endpoints", params={"limit": 1, "continue": bad})
        assert resp.status_code == 400, bad
        assert resp.json()["error"]["code"] == "invalid_cursor"
        assert resp.json()["error"]["param"] == "continue"
    # The same cursor with other filters (or another limit-free query
    # shape) would skip or repeat items: stale.
    for other in ({"namePrefix": "web-"}, {"projectId": OWN}, {"status": "pending"}):
        resp = world.op("GET", "/endpoints", params={"limit": 1, "continue": cursor, **other})
        assert resp.status_code == 400, other
        assert resp.json()["error"]["code"] == "stale_cursor"
    # Another limit is fine: the position does not depend on it.
    assert world.op("GET", "/endpoints", params={"limit": 2, "continue": cursor}).status_code == 200


def test_audit_log_pages(world: World) -> None:
    admin = world.keys["admin-user"]
    for _ in range(5):
        world.endpoint(OWN)
    whole = world.ok("GET", f"/projects/{OWN}/audit", admin)
    assert "continue" not in whole
    made = [e for e in whole["data"] if e["action"] == "endpoint.create"]
    assert len(made) == 5

    def walk_audit(query: dict[str, Any]) -> list[list[dict[str, Any]]]:
        pages, params = [], dict(query)
        while True:
            body = world.ok("GET", f"/projects/{OWN}/audit", admin, params=params)
            pages.append(body["data"])
            if "continue" not in body:
                return pages
            params = {**query, "continue": body["continue"]}

    pages = walk_audit({"limit": 2})
    assert [e for p in pages for e in p] == whole["data"]
    assert all(len(p) == 2 for p in pages[:-1])
    filtered = walk_audit({"limit": 2, "action": "endpoint.create"})
    assert [e for p in filtered for e in p] == made
    # The cursor is bound to the project and the filters.
    cursor = world.ok("GET", f"/projects/{OWN}/audit", admin, params={"limit": 1})["continue"]
    query = {"limit": 1, "continue": cursor, "action": "endpoint.create"}
    resp = world.op("GET", f"/projects/{OWN}/audit", admin, params=query)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "stale_cursor"
    resp = world.op("GET", f"/projects/{OTHER}/audit", params={"continue": cursor})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "stale_cursor"


def test_member_pages(world: World) -> None:
    for i in range(5):
        world.add_member(OWN, f"zz-{i}", "developer" if i % 2 else "viewer")
    whole = world.ok("GET", f"/projects/{OWN}/members")
    assert "continue" not in whole
    ids = [m["userId"] for m in whole["data"]]
    assert ids == sorted(ids) and len(ids) == 8  # the fixture's three and these five
    seen, params = [], {"limit": "3"}
    while True:
        body = world.ok("GET", f"/projects/{OWN}/members", params=params)
        seen += [m["userId"] for m in body["data"]]
        if "continue" not in body:
            break
        params = {"limit": "3", "continue": body["continue"]}
    assert seen == ids
    devs = world.ok("GET", f"/projects/{OWN}/members", params={"role": "developer"})["data"]
    assert {m["userId"] for m in devs} == {"developer-user", "zz-1", "zz-3"}
    bad = world.op("GET", f"/projects/{OWN}/members", params={"role": "owner"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "role"
    cursor = world.ok("GET", f"/projects/{OWN}/members", params={"limit": 1})["continue"]
    stale = world.op("GET", f"/projects/{OTHER}/members", params={"continue": cursor})
    assert stale.status_code == 400 and stale.json()["error"]["code"] == "stale_cursor"
    # A cursor of the endpoint list is not one of a member list.
    world.endpoint(OWN)
    world.endpoint(OWN)
    other_list = world.ok("GET", "/endpoints", params={"limit": 1})["continue"]
    wrong = world.op("GET", f"/projects/{OWN}/members", params={"continue": other_list})
    assert wrong.status_code == 400


def test_pages_and_their_errors_are_documented(world: World) -> None:
    """Each list's page (with `continue`) and its 400 are in the OpenAPI
    document, schema included, as are the new query parameters."""
    doc = world.client.get("/openapi.json").json()
    for _ in range(2):
        world.endpoint(OWN)
        world.new_key("admin-user")
    admin = world.keys["admin-user"]
    calls = [
        ("/endpoints", "/inference/endpoints"),
        (f"/projects/{OWN}/audit", "/inference/projects/{id}/audit"),
        (f"/projects/{OWN}/members", "/inference/projects/{id}/members"),
        ("/users/admin-user/keys", "/inference/users/{userId}/keys"),
        ("/models", "/inference/models"),
    ]
    for path, template in calls:
        op = doc["paths"][template]["get"]
        assert {"limit", "continue"} <= {p["name"] for p in op["parameters"]}
        for params in ({"limit": 1}, {"limit": 0}):
            resp = world.op("GET", path, admin, params=params)
            spec = op["responses"][str(resp.status_code)]
            schema = {**spec["content"]["application/json"]["schema"],
                      "components": doc["components"]}  # fmt: skip
            jsonschema.Draft202012Validator(schema).validate(resp.json())
            if resp.status_code == 200:
                assert "continue" in resp.json()


def test_key_pages(world: World) -> None:
    made = [world.new_key("viewer-user")["id"] for _ in range(4)]
    whole = world.ok("GET", "/users/viewer-user/keys")
    assert "continue" not in whole
    ids = [k["id"] for k in whole["data"]]
    assert ids[-4:] == made and len(ids) == 5  # the first key, then these
    seen, params = [], {"limit": "2"}
    while True:
        body = world.ok("GET", "/users/viewer-user/keys", params=params)
        seen += [k["id"] for k in body["data"]]
        if "continue" not in body:
            break
        params = {"limit": "2", "continue": body["continue"]}
    assert seen == ids
    cursor = world.ok("GET", "/users/viewer-user/keys", params={"limit": 1})["continue"]
    stale = world.op("GET", "/users/developer-user/keys", params={"continue": cursor})
    assert stale.status_code == 400 and stale.json()["error"]["code"] == "stale_cursor"


def test_the_client_walks_every_page(world: World) -> None:
    """What the CLI's list commands use: with pages of one item, the walk
    still yields every item once (repeated filters kept on every page)."""
    client = ManagementClient("http://testserver", OPERATOR_KEY, http=world.client)
    members = [m["userId"] for m in client.walk(f"/projects/{OWN}/members", {"limit": "1"})]
    assert members == sorted(["admin-user", "developer-user", "viewer-user"])
    for _ in range(3):
        world.endpoint(OWN)
    query = [("limit", "1"), ("action", "endpoint.create"), ("action", "member.add")]
    entries = list(client.walk(f"/projects/{OWN}/audit", query))
    whole = world.ok("GET", f"/projects/{OWN}/audit", params=query[1:])["data"]
    assert entries == whole and len(entries) == 6


def test_usage_pages_merge_unwritten_figures_and_total_the_window(world: World) -> None:
    endpoint_id = world.endpoint(OWN)["id"]
    h0 = datetime(2026, 11, 1, tzinfo=UTC)

    def delta(hour: int, gpu: str = "cpu", **figures: Any) -> UsageDelta:
        return UsageDelta(endpoint_id, OWN, h0 + timedelta(hours=hour), gpu, 1, **figures)

    # Some hours written, some only in the meter (not written yet), one both.
    written = [delta(h, requests=1, cost=0.25) for h in (0, 1, 3, 5)]
    asyncio.run(world.plane.accounts.service.store.add_usage(written))
    world.plane.accounts.meter.restore(
        [delta(2, requests=2), delta(3, requests=5), delta(4, "L4", images=1)]
    )
    path = f"/endpoints/{endpoint_id}/usage"
    whole = world.ok("GET", path)
    assert "continue" not in whole
    assert [r["requests"] for r in whole["data"]] == [1, 1, 2, 6, 0, 1]
    assert whole["totals"]["requests"] == 11 and whole["totals"]["images"] == 1
    seen, params = [], {"limit": "2"}
    while True:
        body = world.ok("GET", path, params=params)
        assert body["totals"] == whole["totals"]  # the window's, on every page
        assert len(body["data"]) <= 2
        seen += body["data"]
        if "continue" not in body:
            break
        params = {"limit": "2", "continue": body["continue"]}
    assert seen == whole["data"]
    project = world.ok("GET", f"/projects/{OWN}/usage", params={"limit": 4})
    assert project["data"] == whole["data"][:4] and "continue" in project
    stale = world.op("GET", path, params={"continue": project["continue"]})
    assert stale.status_code == 400 and stale.json()["error"]["code"] == "stale_cursor"


def test_model_pages_and_filters(world: World) -> None:
    mine = [world.model(OWN)["name"] for _ in range(2)]
    theirs = world.model(OTHER)["name"]
    viewer = world.keys["viewer-user"]
    whole = world.ok("GET", "/models", viewer)
    assert "continue" not in whole
    names = [m["name"] for m in whole["data"]]
    assert names == sorted(names) and set(mine) <= set(names) and theirs not in names
    seen, params = [], {"limit": "3"}
    while True:
        body = world.ok("GET", "/models", viewer, params=params)
        seen += [m["name"] for m in body["data"]]
        if "continue" not in body:
            break
        params = {"limit": "3", "continue": body["continue"]}
    assert seen == names
    own = world.ok("GET", "/models", viewer, params={"projectId": OWN})["data"]
    assert sorted(m["name"] for m in own) == sorted(mine)
    assert world.ok("GET", "/models", viewer, params={"projectId": OTHER})["data"] == []
    images = world.ok("GET", "/models", viewer, params={"kind": "image"})["data"]
    assert images and all(m["kind"] == "image" for m in images)
    embedders = world.ok("GET", "/models", viewer, params={"kind": "embedding"})["data"]
    assert "tiny-embed" in {m["name"] for m in embedders}
    assert all(m["kind"] == "embedding" for m in embedders)
    tiny = world.ok("GET", "/models", viewer, params={"namePrefix": "tiny-"})["data"]
    # The prefix selects exactly the whole list's names that start with it.
    assert [m["name"] for m in tiny] == [n for n in names if n.startswith("tiny-")]
    assert {"tiny-chat", "tiny-sdxl"} <= {m["name"] for m in tiny}
    bad = world.op("GET", "/models", viewer, params={"kind": "audio"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"
