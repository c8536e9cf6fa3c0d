"""The five ways one project could reach into another, each closed: a key
never grants more than its minter could; another project's model is neither
deployable nor recommended; members register server directories only below
the operator's model roots; names and answers reveal nothing of another
project. (The composed sequences are in tests/integration/test_tenancy_properties.py.)"""

from __future__ import annotations

from pathlib import Path

from tests.integration.accounts_support import OTHER, OWN, World, unique, world

__all__ = ["world"]


def test_an_admin_of_another_project_cannot_take_over_a_shared_user(world: World) -> None:
    outsider, admin = world.keys["outsider"], world.keys["admin-user"]
    # Adding an existing user of another project makes a user of the
    # outsider's own namespace instead: nobody is enrolled without consent.
    added = world.op("PUT", f"/projects/{OTHER}/members/admin-user", outsider,
                     json={"role": "viewer"})  # fmt: skip
    assert added.status_code == 201, added.text
    assert added.json()["member"]["userId"] == f"{OTHER}:admin-user"
    members = world.ok("GET", f"/projects/{OWN}/members", admin)["data"]
    assert f"{OTHER}:admin-user" not in [m["userId"] for m in members]
    # The real admin-user is no member of OTHER, so its keys are out of reach.
    for method, path, body in (
        ("GET", "/users/admin-user/keys", None),
        ("POST", "/users/admin-user/keys", {"name": "stolen"}),
    ):
        assert world.op(method, path, outsider, json=body).status_code == 404
    # A user shared by both projects (the operator's doing): OTHER's admin
    # mints a key for it that acts in OTHER only, and sees only such keys.
    world.ok("PUT", f"/projects/{OTHER}/members/admin-user", json={"role": "viewer"})
    minted = world.ok("POST", "/users/admin-user/keys", outsider, json={"name": "for-rivals"})
    assert minted["projectId"] == OTHER
    listed = world.ok("GET", "/users/admin-user/keys", outsider)["data"]
    assert {k["projectId"] for k in listed} == {OTHER}
    whoami = world.ok("GET", "/whoami", minted["key"])
    assert whoami["roles"] == {OTHER: "viewer"} and whoami["keyProjectId"] == OTHER
    grab = world.op("PUT", f"/projects/{OWN}/members/outsider", minted["key"],
                    json={"role": "admin"})  # fmt: skip
    assert grab.status_code == 404
    # The user's own keys for all their projects stay theirs.
    own_key = next(k for k in world.ok("GET", "/users/admin-user/keys", admin)["data"]
                   if k["projectId"] is None)  # fmt: skip
    revoke = world.op("DELETE", f"/users/admin-user/keys/{own_key['id']}", outsider)
    assert revoke.status_code == 404
    assert world.ok("GET", f"/projects/{OWN}", admin)["id"] == OWN
    # A project key cannot mint itself a wider one.
    wider = world.ok("POST", "/users/admin-user/keys", minted["key"], json={"name": "w"})
    assert wider["projectId"] == OTHER
    # The key events are in OTHER's log, blamed on who did them.
    log = world.ok("GET", f"/projects/{OTHER}/audit", outsider)["data"]
    creates = [(e["actor"], e["detail"]["user"]) for e in log if e["action"] == "key.create"]
    assert ("user:outsider", "admin-user") in creates
    assert ("user:admin-user", "admin-user") in creates


def test_key_events_of_a_key_for_every_project_reach_every_project(world: World) -> None:
    user = unique("shared")
    world.add_member(OWN, user, "viewer")
    # The first key, made with the user, is in the log of the project it acts in.
    first = world.ok("GET", f"/projects/{OWN}/audit", world.keys["admin-user"],
                     params={"action": "key.create"})["data"]  # fmt: skip
    assert any(e["detail"]["user"] == user and e["actor"] == "operator" for e in first)
    world.add_member(OTHER, user, "viewer")
    key = world.ok("POST", f"/users/{user}/keys", world.keys[user], json={"name": "mine"})
    assert key["projectId"] is None
    for project, admin in ((OWN, "admin-user"), (OTHER, "outsider")):
        log = world.ok("GET", f"/projects/{project}/audit", world.keys[admin])["data"]
        assert any(
            e["action"] == "key.create" and e["target"] == f"key:{key['id']}"
            and e["actor"] == f"user:{user}"
            for e in log
        ), project  # fmt: skip


def test_another_projects_model_is_neither_deployed_nor_recommended(world: World) -> None:
    model = world.model(OWN)["name"]
    outsider = world.keys["outsider"]
    body = {"name": unique("ep"), "modelName": model, "minReplicas": 0, "projectId": OTHER}
    stolen = world.op("POST", "/endpoints", outsider, json=body)
    missing = world.op("POST", "/endpoints", outsider,
                       json={**body, "modelName": f"{OWN}:no-such-model"})  # fmt: skip
    assert stolen.status_code == missing.status_code == 400
    assert stolen.json()["error"]["code"] == missing.json()["error"]["code"] == "model_not_found"
    # Nor by the operator in a third project: a project's model serves it only.
    assert world.op("POST", "/endpoints", json=body).status_code == 400
    rec = world.op("GET", "/recommendations", outsider, params={"modelName": model})
    assert rec.status_code == 400 and rec.json()["error"]["code"] == "model_not_found"
    assert world.op("GET", "/recommendations", world.keys["viewer-user"],
                    params={"modelName": model}).status_code == 200  # fmt: skip
    # The owner deletes it: nothing of another project is in the way.
    assert world.op("DELETE", f"/models/{model}", world.keys["developer-user"]).status_code == 204


def test_model_names_are_per_project(world: World) -> None:
    bare = unique("same")
    mine = world.ok("POST", "/models", world.keys["developer-user"],
                    json={"source": world.model_source, "name": bare})  # fmt: skip
    theirs = world.ok("POST", "/models", world.keys["outsider"],
                      json={"source": world.model_source, "name": bare})  # fmt: skip
    assert (mine["name"], theirs["name"]) == (f"{OWN}:{bare}", f"{OTHER}:{bare}")
    again = world.op("POST", "/models", world.keys["developer-user"],
                     json={"source": world.model_source, "name": bare})  # fmt: skip
    assert again.status_code == 409  # within its own namespace only


def test_members_register_directories_only_below_the_model_roots(
    world: World, tmp_path: Path
) -> None:
    dev = world.keys["developer-user"]
    answers = []
    for source in (str(tmp_path), "/nonexistent", "~/.ssh", "/etc", f"{world.model_source}/.."
                   "/../..", "./"):  # fmt: skip
        resp = world.op("POST", "/models", dev, json={"source": source, "name": unique("m")})
        assert resp.status_code == 403, (source, resp.text)
        error = resp.json()["error"]
        assert error["code"] == "local_source_not_allowed"
        answers.append(error["message"])
    # One answer for every refused path, whatever exists there.
    assert len(set(answers)) == 1
    # The operator registers any directory.
    assert world.op("POST", "/models", json={"source": "/nonexistent"}).status_code == 400
