"""Accounts through the management API: keys (shown once, listed by hint,
revoked at once), quotas at and over their limits, the audit trail of every
action with its actor, names unique per project."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from inferd.control.accounts.keys import USER_KEY_PREFIX
from tests.integration.accounts_support import OTHER, OWN, World, unique, world

__all__ = ["world"]


def test_key_is_shown_once_and_listed_by_hint(world: World) -> None:
    created = world.ok("POST", "/users/developer-user/keys", world.keys["developer-user"],
                       json={"name": "ci"})  # fmt: skip
    key = created["key"]
    assert key.startswith(USER_KEY_PREFIX) and created["hint"].endswith(key[-4:])
    listed = world.ok("GET", "/users/developer-user/keys", world.keys["developer-user"])["data"]
    mine = next(k for k in listed if k["id"] == created["id"])
    assert "key" not in mine and mine["name"] == "ci" and mine["revokedAt"] is None
    assert key not in world.op("GET", "/users/developer-user/keys").text
    # Only the digest is stored.
    stored = world.plane.store._query("SELECT key_hash, hint FROM user_keys WHERE id = ?",
                                      (created["id"],))  # fmt: skip
    assert key.encode() not in bytes(stored[0][0]) and len(bytes(stored[0][0])) == 32


def test_last_used_is_recorded(world: World) -> None:
    created = world.new_key("viewer-user")
    # Stored to the millisecond: the bounds of this use, widened by one.
    before = datetime.now(UTC) - timedelta(milliseconds=1)
    world.ok("GET", "/endpoints", created["key"])
    after = datetime.now(UTC) + timedelta(milliseconds=1)
    listed = world.ok("GET", "/users/viewer-user/keys")["data"]
    used = next(k for k in listed if k["id"] == created["id"])
    at = datetime.fromisoformat(used["lastUsedAt"].replace("Z", "+00:00"))
    assert before <= at <= after, (before, at, after)


def test_revoked_key_fails_at_once(world: World) -> None:
    created = world.new_key("developer-user")
    key = created["key"]
    assert world.op("GET", "/endpoints", key).status_code == 200  # cached now
    resp = world.op("DELETE", f"/users/developer-user/keys/{created['id']}", key)
    assert resp.status_code == 204
    # The very next request with it fails, though it had been resolved before.
    resp = world.op("GET", "/endpoints", key)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    # Revoking twice: it is not an active key any more, but still listed.
    listed = world.ok("GET", "/users/developer-user/keys")["data"]
    assert next(k for k in listed if k["id"] == created["id"])["revokedAt"] is not None


def test_removed_member_loses_access_at_once(world: World) -> None:
    key = world.add_member(OWN, "leaver", "developer")
    assert key is not None
    endpoint = world.endpoint(OWN)
    assert world.op("GET", f"/endpoints/{endpoint['id']}", key).status_code == 200
    world.ok("DELETE", f"/projects/{OWN}/members/leaver", world.keys["admin-user"])
    assert world.op("GET", f"/endpoints/{endpoint['id']}", key).status_code == 404
    # A role change applies at once too.
    world.add_member(OWN, "leaver", "viewer")
    assert world.op("DELETE", f"/endpoints/{endpoint['id']}", key).status_code == 403


def test_names_are_unique_within_a_project(world: World) -> None:
    world.endpoint(OWN, name="shared-name")
    world.endpoint(OTHER, name="shared-name")
    resp = world.op("POST", "/endpoints", json={"name": "shared-name", "modelName": "tiny-chat",
                                                "minReplicas": 0, "projectId": OWN})  # fmt: skip
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "name_taken"


def test_project_is_chosen_for_a_single_project_member(world: World) -> None:
    key = world.keys["developer-user"]
    fields = {"name": unique("ep"), "modelName": "tiny-chat", "minReplicas": 0}
    body = world.ok("POST", "/endpoints", key, json=fields)
    assert body["projectId"] == OWN and body["costSoFar"] == 0
    listed = world.ok("GET", "/endpoints", key)["data"]
    assert {e["projectId"] for e in listed} == {OWN}


# --- quotas ------------------------------------------------------------------------------


def _create(world: World, key: str, **fields: object) -> Any:
    body = {"name": unique("ep"), "modelName": "tiny-chat", "projectId": OWN, **fields}
    return world.op("POST", "/endpoints", key, json=body)


def test_quota_edges(world: World) -> None:
    dev = world.keys["developer-user"]
    world.ok("PUT", f"/projects/{OWN}/quota", json={"replicas": 3, "endpoints": 3})
    assert _create(world, dev, minReplicas=2, maxReplicas=3).status_code == 201
    # Exactly at the limit: 2 + 1 = 3.
    at_limit = _create(world, dev, minReplicas=1, maxReplicas=1)
    assert at_limit.status_code == 201
    # One over: 3 + 1.
    over = _create(world, dev, minReplicas=1, maxReplicas=1)
    assert over.status_code == 409
    error = over.json()["error"]
    assert error["code"] == "quota_exceeded" and error["param"] == "replicas"
    assert "limit 3" in error["message"] and "in use 3" in error["message"]
    # PATCH over the quota is refused the same way; at the limit it passes.
    endpoint_id = at_limit.json()["id"]
    resp = world.op(
        "PATCH", f"/endpoints/{endpoint_id}", dev, json={"minReplicas": 2, "maxReplicas": 2}
    )
    assert resp.status_code == 409 and resp.json()["error"]["param"] == "replicas"
    resp = world.op("PATCH", f"/endpoints/{endpoint_id}", dev, json={"minReplicas": 0})
    assert resp.status_code == 200
    # The endpoint count: 2 exist, a third at 0 replicas fits, a fourth does not.
    assert _create(world, dev, minReplicas=0).status_code == 201
    over = _create(world, dev, minReplicas=0)
    assert over.status_code == 409 and over.json()["error"]["param"] == "endpoints"
    # The other project is not limited by this one's quota.
    outsider = world.keys["outsider"]
    body = {"name": unique("ep"), "modelName": "tiny-chat", "projectId": OTHER, "minReplicas": 4,
            "maxReplicas": 4}  # fmt: skip
    assert world.op("POST", "/endpoints", outsider, json=body).status_code == 201


def test_gpu_quota_by_type(world: World) -> None:
    gpu_type = world.ok("GET", "/endpoints/" + world.endpoint(OWN)["id"])["gpuType"]
    world.ok("PUT", f"/projects/{OWN}/quota", json={"gpus": {gpu_type: 1}})
    dev = world.keys["developer-user"]
    assert _create(world, dev, minReplicas=1, maxReplicas=1).status_code == 201
    over = _create(world, dev, minReplicas=1, maxReplicas=1)
    assert over.status_code == 409
    assert over.json()["error"]["param"] == f"gpus:{gpu_type}"


def test_admins_set_their_quota_within_the_operators_limit(world: World) -> None:
    admin, dev = world.keys["admin-user"], world.keys["developer-user"]
    # With no limit set, the project's admins manage their own quota.
    project = world.ok("PUT", f"/projects/{OWN}/quota", admin, json={"replicas": 99})
    assert project["quota"]["replicas"] == 99 and project["quotaInForce"]["replicas"] == 99
    # The operator lends the team at most 4 replicas and 2 endpoints.
    world.ok("PUT", f"/projects/{OWN}/quota-limit", json={"replicas": 4, "endpoints": 2})
    project = world.ok("GET", f"/projects/{OWN}", admin)
    assert project["quotaLimit"] == {"endpoints": 2, "replicas": 4, "gpus": {}}
    assert project["quotaInForce"] == {"endpoints": 2, "replicas": 4, "gpus": {}}
    assert project["role"] == "admin"
    # An admin may not go above it, nor leave a limited count unlimited...
    for body, param in (
        ({"replicas": 5, "endpoints": 2}, "replicas"),
        ({"replicas": 3}, "endpoints"),
    ):
        resp = world.op("PUT", f"/projects/{OWN}/quota", admin, json=body)
        assert resp.status_code == 403, resp.text
        error = resp.json()["error"]
        assert error["code"] == "above_quota_limit" and error["param"] == param
        assert "limit" in error["message"]
    # ...but may hold the team below it, and the lower one is enforced.
    world.ok("PUT", f"/projects/{OWN}/quota", admin, json={"replicas": 1, "endpoints": 2})
    assert _create(world, dev, minReplicas=1, maxReplicas=1).status_code == 201
    over = _create(world, dev, minReplicas=1, maxReplicas=1)
    assert over.status_code == 409 and "limit 1" in over.json()["error"]["message"]
    # A developer or viewer sets neither; only the operator sets the limit.
    for who in ("developer-user", "viewer-user"):
        resp = world.op("PUT", f"/projects/{OWN}/quota", world.keys[who], json={"replicas": 1})
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "insufficient_role"
    resp = world.op("PUT", f"/projects/{OWN}/quota-limit", admin, json={"replicas": 99})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "operator_only"
    # Another project's quota is not even there for this admin.
    resp = world.op("PUT", f"/projects/{OTHER}/quota", admin, json={"replicas": 1})
    assert resp.status_code == 404
    # Lowering the limit under the admins' quota lowers what is in force.
    world.ok("PUT", f"/projects/{OWN}/quota-limit", json={"replicas": 4, "endpoints": 1})
    project = world.ok("GET", f"/projects/{OWN}", admin)
    assert project["quota"]["endpoints"] == 2 and project["quotaInForce"]["endpoints"] == 1


def test_quotas_and_members_read_back_what_was_written(world: World) -> None:
    """GET on each route that is written with PUT answers the value written,
    in the PUT body's shape, to every member of the project."""
    quota = {"endpoints": 5, "replicas": 3, "gpus": {}}
    limit = {"endpoints": None, "replicas": 8, "gpus": {}}
    world.ok("PUT", f"/projects/{OWN}/quota-limit", json=limit)
    world.ok("PUT", f"/projects/{OWN}/quota", world.keys["admin-user"], json=quota)
    world.add_member(OWN, "reader", "developer")
    viewer = world.keys["viewer-user"]
    assert world.ok("GET", f"/projects/{OWN}/quota", viewer) == quota
    assert world.ok("GET", f"/projects/{OWN}/quota-limit", viewer) == limit
    member = world.ok("GET", f"/projects/{OWN}/members/reader", viewer)
    assert (member["userId"], member["role"]) == ("reader", "developer")
    # Read back after a change, not a copy from before it.
    world.add_member(OWN, "reader", "viewer")
    assert world.ok("GET", f"/projects/{OWN}/members/reader", viewer)["role"] == "viewer"
    # A user who is not a member (here: of the other project only) is a 404
    # naming the member, as DELETE answers.
    resp = world.op("GET", f"/projects/{OWN}/members/outsider", viewer)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "member_not_found"


# --- audit ---------------------------------------------------------------------------------


def test_audit_entries_per_action_with_actor(world: World) -> None:
    admin, dev = world.keys["admin-user"], world.keys["developer-user"]
    start = datetime.now(UTC) - timedelta(seconds=1)
    body = {"name": unique("ep"), "modelName": "tiny-chat", "minReplicas": 0, "projectId": OWN}
    endpoint = world.ok("POST", "/endpoints", dev, json=body)
    world.ok("PATCH", f"/endpoints/{endpoint['id']}", dev, json={"maxReplicas": 2})
    world.ok("POST", f"/endpoints/{endpoint['id']}/access-token", dev)
    world.ok("DELETE", f"/endpoints/{endpoint['id']}", dev)
    key = world.ok("POST", "/users/developer-user/keys", admin, json={"name": "by-admin"})
    world.ok("DELETE", f"/users/developer-user/keys/{key['id']}", admin)
    world.add_member(OWN, "audited", "viewer")
    world.ok("PUT", f"/projects/{OWN}/members/audited", admin, json={"role": "developer"})
    world.ok("DELETE", f"/projects/{OWN}/members/audited", admin)
    world.ok("PUT", f"/projects/{OWN}/quota", admin, json={"replicas": 7})
    world.ok("PUT", f"/projects/{OWN}/quota-limit", json={"replicas": 8})

    entries = world.ok("GET", f"/projects/{OWN}/audit", admin,
                       params={"from": start.isoformat()})["data"]  # fmt: skip
    seen = [(e["action"], e["actor"]) for e in entries]
    for want in [
        ("endpoint.create", "user:developer-user"),
        ("endpoint.update", "user:developer-user"),
        ("endpoint.token.reissue", "user:developer-user"),
        ("endpoint.delete", "user:developer-user"),
        ("key.create", "user:admin-user"),
        ("key.revoke", "user:admin-user"),
        ("member.add", "operator"),
        ("member.change", "user:admin-user"),
        ("member.remove", "user:admin-user"),
        ("quota.change", "user:admin-user"),
        ("quota.change", "operator"),
    ]:
        assert want in seen, (want, seen)
    create = next(e for e in entries if e["action"] == "endpoint.create")
    assert create["target"] == f"endpoint:{endpoint['id']}" and create["projectId"] == OWN
    assert datetime.fromisoformat(create["at"].replace("Z", "+00:00")) >= start
    # Filter by action, and by time.
    pairs = [("action", "key.create"), ("action", "key.revoke")]
    only = world.ok("GET", f"/projects/{OWN}/audit", admin, params=pairs)["data"]
    assert {e["action"] for e in only} == {"key.create", "key.revoke"}
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    later = world.ok("GET", f"/projects/{OWN}/audit", admin, params={"from": soon})
    assert later["data"] == []
    # Another project's log shows none of these.
    other = world.ok("GET", f"/projects/{OTHER}/audit", world.keys["outsider"])["data"]
    assert all(e["projectId"] == OTHER for e in other)
    # Bad filters are 400s.
    resp = world.op("GET", f"/projects/{OWN}/audit", admin, params={"action": "nope"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "action"
    resp = world.op("GET", f"/projects/{OWN}/audit", admin, params={"from": "yesterday"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "from"


def test_audit_log_is_append_only_in_the_database(world: World) -> None:
    store = world.plane.store
    for sql in ("UPDATE audit_log SET actor = 'someone else'", "DELETE FROM audit_log"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"), store._tx() as conn:
            conn.execute(sql)


def test_registered_models_belong_to_the_callers_project(world: World) -> None:
    """A developer's model joins their project (no projectId needed with one
    project), named in the project's own namespace (`<project>:<name>`);
    members see it, other projects do not (404, not listed); the operator's
    is global: everyone reads it, only the operator deletes it."""
    bare = unique("model")
    mine = world.ok("POST", "/models", world.keys["developer-user"],
                    json={"source": world.model_source, "name": bare})  # fmt: skip
    assert mine["projectId"] == OWN
    name = mine["name"]
    assert name == f"{OWN}:{bare}"
    listed = world.ok("GET", "/models", world.keys["viewer-user"])["data"]
    assert name in [m["name"] for m in listed]
    assert name not in [
        m["name"] for m in world.ok("GET", "/models", world.keys["outsider"])["data"]
    ]
    assert world.op("GET", f"/models/{name}", world.keys["outsider"]).status_code == 404
    assert world.op("DELETE", f"/models/{name}", world.keys["viewer-user"]).status_code == 403

    glob = unique("model")
    made = world.ok("POST", "/models", json={"source": world.model_source, "name": glob})
    assert made["projectId"] is None and made["name"] == glob
    assert world.ok("GET", f"/models/{glob}", world.keys["outsider"])["name"] == glob
    refused = world.op("DELETE", f"/models/{glob}", world.keys["admin-user"])
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_only"
    assert world.op("DELETE", f"/models/{glob}").status_code == 204
    assert world.op("DELETE", f"/models/{name}", world.keys["developer-user"]).status_code == 204


# --- projects --------------------------------------------------------------------------


def test_only_an_empty_project_is_deleted_and_its_history_stays(world: World) -> None:
    admin = world.keys["admin-user"]
    world.ok("POST", "/projects", json={"id": "short-lived"})
    member_key = world.add_member("short-lived", unique("member"), "developer")
    assert member_key is not None
    endpoint = world.endpoint("short-lived")
    # Not while it has an endpoint (nor for its own admin: the operator's call).
    resp = world.op("DELETE", "/projects/short-lived")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "project_not_empty"
    assert world.op("DELETE", f"/projects/{OWN}", admin).status_code == 403
    assert world.op("DELETE", "/projects/default").json()["error"]["code"] == "project_is_default"
    world.ok("DELETE", f"/endpoints/{endpoint['id']}", member_key)
    assert world.op("DELETE", "/projects/short-lived").status_code == 204
    # Its member sees it no more, and nothing can be created in it.
    assert world.op("GET", "/projects/short-lived", member_key).status_code == 404
    body = {"name": unique("ep"), "modelName": "tiny-chat", "projectId": "short-lived"}
    assert world.op("POST", "/endpoints", json=body).status_code == 404
    assert world.op("DELETE", "/projects/short-lived").status_code == 404
    # The audit log keeps what happened in it, its deletion included.
    rows = world.plane.store._query(
        "SELECT action FROM audit_log WHERE project_id = ? ORDER BY id", ("short-lived",)
    )
    actions = [r[0] for r in rows]
    assert "endpoint.delete" in actions and actions[-1] == "project.delete"
