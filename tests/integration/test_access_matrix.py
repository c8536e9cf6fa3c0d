"""Who may do what to whose object: every management route x every caller x
every kind of owner, against a table written here by hand from the README's
Accounts section, not computed from the product's own role or route tables
(a route declared with the wrong action or target then fails here).

Callers: a viewer, a developer and an admin of project `team`, and the
operator. Owners of the object a call names:
- `own` / `other`: an endpoint, project or model of `team` / of `rivals`;
- `global`: a model the operator registered without a project;
- for a user's keys: `self`, `member` (another user of `team` only),
  `shared` (a user of `team` and of `rivals`), `stranger` (a user of
  `rivals` only), and `foreign-key` (the caller's own user path with a key
  id of someone else's);
- `any`: the route names no owned object (a catalog, a list, whoami, an
  operator-only act).

Outcomes: `ok` (2xx), 403 (the caller's role may not act), 404 (the object
is hidden: the answer of one that does not exist).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from starlette.routing import Mount, Route

from inferd.control.accounts.roles import ROLE_ACTIONS, Action, Role
from tests.integration.accounts_support import OTHER, OWN, ROLES, World, unique, world

assert set(ROLES) == {"viewer", "developer", "admin"}

__all__ = ["world"]

OK, DENY, HIDE = "ok", "403", "404"
CALLERS = ("viewer", "developer", "admin", "operator")  # the table's columns, in order

Row = dict[str, tuple[str, str, str, str]]


def everyone(outcome: str) -> tuple[str, str, str, str]:
    return (outcome, outcome, outcome, OK)


READ = (OK, OK, OK, OK)  # every member reads their project's things
WRITE = (DENY, OK, OK, OK)  # developers and admins change them
MANAGE = (DENY, DENY, OK, OK)  # admins manage the project itself
OPERATOR_ONLY = (DENY, DENY, DENY, OK)
# Another project's object: hidden from every role (never a 403, which would
# say it exists); the operator sees every project.
HIDDEN = (HIDE, HIDE, HIDE, OK)

# The README: "viewer (read), developer (create, change and delete
# endpoints, re-issue tokens), admin (also members, their keys, the
# project's quota, the audit log). The operator key is the superuser (every
# project; creates projects and sets their quota limits). Another project's
# endpoint is a 404 on every route; a role that may not act gets a 403."
# Registered models: "only its members see them, its developers delete them
# and record profiles. The operator's (no projectId) are global: everyone
# sees them, only the operator changes them."
# Users' keys: a user manages their own; a project's admin manages its
# members' keys that act nowhere but in the project (a key never grants more
# than its minter could); to anyone else a user's keys do not exist (404: a
# user is not a project's object, so there is nothing a 403 would be about).
EXPECTED: dict[tuple[str, str], Row] = {
    # --- the caller and catalogs ---
    ("GET", "/whoami"): {"any": READ},
    ("GET", "/gpu-types"): {"any": READ},
    ("GET", "/locations"): {"any": READ},
    ("GET", "/recommendations"): {"any": READ},
    # --- endpoints ---
    ("GET", "/endpoints"): {"any": READ},  # lists only what the caller sees (below)
    ("POST", "/endpoints"): {"own": WRITE, "other": HIDDEN},
    ("GET", "/endpoints/{id}"): {"own": READ, "other": HIDDEN},
    ("PATCH", "/endpoints/{id}"): {"own": WRITE, "other": HIDDEN},
    ("DELETE", "/endpoints/{id}"): {"own": WRITE, "other": HIDDEN},
    ("POST", "/endpoints/{id}/access-token"): {"own": WRITE, "other": HIDDEN},
    ("GET", "/endpoints/{id}/usage"): {"own": READ, "other": HIDDEN},
    # An endpoint's LoRA adapters are the endpoint's: its project, its roles.
    ("GET", "/endpoints/{id}/adapters"): {"own": READ, "other": HIDDEN},
    ("POST", "/endpoints/{id}/adapters"): {"own": WRITE, "other": HIDDEN},
    ("GET", "/endpoints/{id}/adapters/{name}"): {"own": READ, "other": HIDDEN},
    ("DELETE", "/endpoints/{id}/adapters/{name}"): {"own": WRITE, "other": HIDDEN},
    ("GET", "/endpoints/{id}/adapters/{name}/usage"): {"own": READ, "other": HIDDEN},
    # Its client tokens likewise: members read them (by hint), developers make and revoke them.
    ("GET", "/endpoints/{id}/tokens"): {"own": READ, "other": HIDDEN},
    ("POST", "/endpoints/{id}/tokens"): {"own": WRITE, "other": HIDDEN},
    ("GET", "/endpoints/{id}/tokens/{name}"): {"own": READ, "other": HIDDEN},
    ("DELETE", "/endpoints/{id}/tokens/{name}"): {"own": WRITE, "other": HIDDEN},
    # --- models ---
    ("GET", "/models"): {"any": READ},
    ("POST", "/models"): {"own": WRITE, "other": HIDDEN},
    ("GET", "/models/{name}"): {"own": READ, "other": HIDDEN, "global": READ},
    ("DELETE", "/models/{name}"): {"own": WRITE, "other": HIDDEN, "global": OPERATOR_ONLY},
    ("GET", "/models/{name}/profiles"): {"own": READ, "other": HIDDEN, "global": READ},
    ("POST", "/models/{name}/profiles"): {
        "own": WRITE, "other": HIDDEN, "global": OPERATOR_ONLY,
    },
    # --- projects ---
    ("GET", "/projects"): {"any": READ},
    ("POST", "/projects"): {"any": OPERATOR_ONLY},
    ("GET", "/projects/{id}"): {"own": READ, "other": HIDDEN},
    ("DELETE", "/projects/{id}"): {"any": OPERATOR_ONLY},
    # What a member may see on the project itself (its quotas), they may
    # read where it is written.
    ("GET", "/projects/{id}/quota"): {"own": READ, "other": HIDDEN},
    ("PUT", "/projects/{id}/quota"): {"own": MANAGE, "other": HIDDEN},
    ("GET", "/projects/{id}/quota-limit"): {"own": READ, "other": HIDDEN},
    ("PUT", "/projects/{id}/quota-limit"): {"any": OPERATOR_ONLY},
    ("GET", "/projects/{id}/members"): {"own": READ, "other": HIDDEN},
    ("GET", "/projects/{id}/members/{userId}"): {"own": READ, "other": HIDDEN},
    ("PUT", "/projects/{id}/members/{userId}"): {"own": MANAGE, "other": HIDDEN},
    ("DELETE", "/projects/{id}/members/{userId}"): {"own": MANAGE, "other": HIDDEN},
    ("GET", "/projects/{id}/audit"): {"own": MANAGE, "other": HIDDEN},
    ("GET", "/projects/{id}/usage"): {"own": READ, "other": HIDDEN},
    # --- users and their keys ---
    ("GET", "/users"): {"any": OPERATOR_ONLY},
    ("POST", "/users"): {"any": OPERATOR_ONLY},
    **{
        key: {
            "self": (OK, OK, OK, OK),
            "member": (HIDE, HIDE, OK, OK),
            "shared": (HIDE, HIDE, OK, OK),
            "stranger": HIDDEN,
        }
        for key in [("GET", "/users/{userId}/keys"), ("POST", "/users/{userId}/keys")]
    },
    ("DELETE", "/users/{userId}/keys/{keyId}"): {
        "self": (OK, OK, OK, OK),
        "member": (HIDE, HIDE, OK, OK),
        # The key (the operator's, for all the user's projects) acts in the
        # other project too: only the user and the operator revoke it.
        "shared": (HIDE, HIDE, HIDE, OK),
        # A key of that user limited to the caller's project: its admin's.
        "shared, team's key": (HIDE, HIDE, OK, OK),
        "stranger": HIDDEN,
        "foreign-key": (HIDE, HIDE, HIDE, HIDE),
    },
}  # fmt: skip

# A valid body for each call that takes one, so that what the table sees is
# the access decision, not a validation error.
BODIES: dict[tuple[str, str], Callable[[World, str], Any]] = {
    ("POST", "/endpoints"): lambda w, project: {
        "name": unique("ep"), "modelName": "tiny-chat", "minReplicas": 0, "projectId": project,
    },
    ("PATCH", "/endpoints/{id}"): lambda w, project: {"minReplicas": 0, "maxReplicas": 2},
    ("POST", "/endpoints/{id}/adapters"): lambda w, project: {
        "name": unique("lora"), "source": w.adapter_source,
    },
    ("POST", "/endpoints/{id}/tokens"): lambda w, project: {"name": unique("client")},
    ("POST", "/projects"): lambda w, project: {"id": unique("proj")},
    ("PUT", "/projects/{id}/quota"): lambda w, project: {"replicas": 10},
    ("PUT", "/projects/{id}/quota-limit"): lambda w, project: {"replicas": 10},
    ("PUT", "/projects/{id}/members/{userId}"): lambda w, project: {"role": "viewer"},
    ("POST", "/users"): lambda w, project: {"id": unique("user")},
    ("POST", "/users/{userId}/keys"): lambda w, project: {"name": "matrix"},
    ("POST", "/models"): lambda w, project: {
        "source": w.model_source, "name": unique("model"), "projectId": project,
    },
    ("POST", "/models/{name}/profiles"): lambda w, project: {
        "gpuType": "H100-80GB", "gpuCount": 1, "promptTokens": 100, "outputTokens": 50,
        "points": [{"concurrency": 4, "requests": 8, "outputTokensPerS": 400.0}],
    },
}  # fmt: skip

QUERIES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/recommendations"): {"modelName": "tiny-chat"},
}


def project_of(whose: str) -> str:
    return OTHER if whose in ("other", "stranger") else OWN


def user_for(w: World, whose: str, caller: str) -> str:
    """The user a key route names, made fresh where the case needs one."""
    if whose in ("self", "foreign-key"):
        return f"{caller}-user" if caller != "operator" else "admin-user"
    if whose == "stranger":
        return "outsider"
    user = unique(whose.split(",")[0])
    w.add_member(OWN, user, "viewer")
    if whose.startswith("shared"):
        w.add_member(OTHER, user, "viewer")
    return user


def concrete(w: World, method: str, path: str, whose: str, caller: str) -> str:
    """The route's path naming a fresh object of the owner `whose`."""
    project = project_of(whose)
    if (method, path) == ("DELETE", "/projects/{id}"):
        # Deleting takes an empty project: a fresh one.
        return f"/projects/{w.ok('POST', '/projects', json={'id': unique('gone')})['id']}"
    if path.startswith("/endpoints/{id}/adapters"):
        endpoint_id = w.endpoint(project, engineSettings={"maxLoras": 2})["id"]
        path = path.replace("{id}", endpoint_id)
        if "{name}" in path:
            body = {"name": unique("lora"), "source": w.adapter_source}
            name = w.ok("POST", f"/endpoints/{endpoint_id}/adapters", json=body)["name"]
            path = path.replace("{name}", name)
    if path.startswith("/endpoints/{id}/tokens"):
        endpoint_id = w.endpoint(project)["id"]
        path = path.replace("{id}", endpoint_id)
        if "{name}" in path:
            body = {"name": unique("client")}
            name = w.ok("POST", f"/endpoints/{endpoint_id}/tokens", json=body)["name"]
            path = path.replace("{name}", name)
    if path.startswith("/endpoints/{id}"):
        path = path.replace("{id}", w.endpoint(project)["id"])
    path = path.replace("{id}", project)
    if path.startswith("/projects/") and "{userId}" in path:
        member = unique("member")  # a member of the project, made for this case
        w.add_member(project, member, "viewer")
        path = path.replace("{userId}", member)
    if "{userId}" in path:
        user = user_for(w, whose, caller)
        path = path.replace("{userId}", user)
        if "{keyId}" in path:
            holder = "outsider" if whose == "foreign-key" else user
            scope = {"projectId": OWN} if whose == "shared, team's key" else {}
            key = w.ok("POST", f"/users/{holder}/keys", json={"name": "spare", **scope})
            path = path.replace("{keyId}", key["id"])
    if "{name}" in path:
        if whose == "global":
            body = {"source": w.model_source, "name": unique("global")}
            name = w.ok("POST", "/models", json=body)["name"]
        else:
            name = w.model(project)["name"]
        path = path.replace("{name}", name)
    return path


_DOCS: dict[int, Any] = {}


def documented(w: World, method: str, path: str, resp: Any) -> None:
    """The answer is one the served OpenAPI document describes, schema included."""
    doc = _DOCS.get(id(w))
    if doc is None:
        doc = _DOCS[id(w)] = w.client.get("/openapi.json").json()
    spec = doc["paths"]["/inference" + path][method.lower()]["responses"]
    assert str(resp.status_code) in spec, (method, path, resp.status_code)
    content = spec[str(resp.status_code)].get("content")
    if content is None:
        assert resp.content == b""
        return
    schema = {**content["application/json"]["schema"], "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(resp.json())


def call(w: World, method: str, path: str, whose: str, caller: str) -> Any:
    key = None if caller == "operator" else w.keys[f"{caller}-user"]
    body = BODIES.get((method, path))
    kwargs: dict[str, Any] = {"json": body(w, project_of(whose))} if body else {}
    if (method, path) in QUERIES:
        kwargs["params"] = QUERIES[(method, path)]
    resp = w.op(method, concrete(w, method, path, whose, caller), key, **kwargs)
    documented(w, method, path, resp)
    return resp


def check(resp: Any, want: str, label: str) -> None:
    if want == OK:
        assert resp.status_code < 300, f"{label}: {resp.status_code} {resp.text}"
        return
    assert resp.status_code == int(want), f"{label}: {resp.status_code} {resp.text}"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if want == HIDE:
        # Nothing of the other project leaks: the answer of a missing thing.
        # (A project's model is named `<project>:<name>`: an answer may
        # repeat the name asked for, which the caller wrote.)
        message = re.sub(rf"'{OTHER}:[^']*'", "''", error["message"])
        assert OTHER not in message or "No project" in message


def served_routes(w: World) -> set[tuple[str, str]]:
    routes = w.client.app.routes  # type: ignore[attr-defined]
    mount = next(r for r in routes if isinstance(r, Mount) and r.path == "/inference")
    return {
        (method, route.path)
        for route in mount.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
        if method != "HEAD"
    }


def test_table_covers_every_route(world: World) -> None:
    """A route added to the API fails here until someone writes its row."""
    assert served_routes(world) == set(EXPECTED)
    for method, path in EXPECTED:
        if method in ("POST", "PUT", "PATCH") and path != "/endpoints/{id}/access-token":
            assert (method, path) in BODIES, f"no body for {method} {path}"


@pytest.mark.parametrize("caller", CALLERS)
def test_every_route_for_a_caller(world: World, caller: str) -> None:
    column = CALLERS.index(caller)
    seen: set[str] = set()
    for (method, path), row in EXPECTED.items():
        for whose, outcomes in row.items():
            want = outcomes[column]
            resp = call(world, method, path, whose, caller)
            check(resp, want, f"{caller} {method} {path} ({whose}'s)")
            seen.add(want)
    # Every outcome a caller can get, it got somewhere in the table.
    assert seen == ({OK, HIDE} if caller == "operator" else {OK, DENY, HIDE})


@pytest.mark.parametrize("caller", ROLES)
def test_lists_hold_only_what_the_caller_sees(world: World, caller: str) -> None:
    own, other = world.endpoint(OWN), world.endpoint(OTHER)
    mine, theirs = world.model(OWN), world.model(OTHER)
    key = world.keys[f"{caller}-user"]
    listed = {e["id"] for e in world.ok("GET", "/endpoints", key)["data"]}
    assert own["id"] in listed and other["id"] not in listed
    models = {m["name"] for m in world.ok("GET", "/models", key)["data"]}
    assert mine["name"] in models and theirs["name"] not in models
    projects = {p["id"] for p in world.ok("GET", "/projects", key)["data"]}
    assert projects == {OWN}
    # Naming the other project in a filter reveals nothing either.
    assert world.ok("GET", "/endpoints", key, params={"projectId": OTHER})["data"] == []


def test_an_admin_lists_only_the_keys_that_act_in_the_project_alone(world: World) -> None:
    """A user of both projects: the team's admin sees (and so may revoke)
    the user's keys limited to the team, not those that act in the other
    project too; the user and the operator see them all."""
    world.add_member(OWN, "both", "viewer")
    world.add_member(OTHER, "both", "viewer")
    mine = world.ok("POST", "/users/both/keys", json={"name": "team", "projectId": OWN})
    everywhere = world.ok("POST", "/users/both/keys", json={"name": "all"})
    theirs = world.ok("POST", "/users/both/keys", json={"name": "rivals", "projectId": OTHER})
    admin = world.keys["admin-user"]
    seen = {k["id"] for k in world.ok("GET", "/users/both/keys", admin)["data"]}
    assert seen == {mine["id"]}
    every = {k["id"] for k in world.ok("GET", "/users/both/keys")["data"]}
    assert {mine["id"], everywhere["id"], theirs["id"]} <= every
    own = {k["id"] for k in world.ok("GET", "/users/both/keys", everywhere["key"])["data"]}
    assert own == every


def test_every_route_needs_a_key(world: World) -> None:
    for method, path in EXPECTED:
        concrete_path = path.replace("{id}", "x").replace("{userId}", "u")
        concrete_path = concrete_path.replace("{keyId}", "k").replace("{name}", "m")
        for headers in ({}, {"Authorization": "Bearer infd_key_not-a-real-one"}):
            resp = world.client.request(method, "/inference" + concrete_path, headers=headers)
            assert resp.status_code == 401, (method, path, resp.text)


def test_endpoint_token_does_not_open_the_api(world: World) -> None:
    token = world.endpoint(OWN)["accessToken"]
    resp = world.op("GET", "/endpoints", token)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "wrong_token_kind"


@pytest.mark.parametrize("action", list(Action))
def test_role_table_is_monotonic(action: Action) -> None:
    """What a viewer may, a developer may; what a developer may, an admin may."""
    order = [Role.VIEWER, Role.DEVELOPER, Role.ADMIN]
    allowed = [action in ROLE_ACTIONS[r] for r in order]
    assert allowed == sorted(allowed)
