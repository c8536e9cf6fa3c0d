"""Every management operation x every role x own / other project, generated
from the route table (`app.state.operations`): a route added to the API is
in this matrix without anyone writing a case for it.

Expected: another project's things are 404 on every operation (never 403,
which would reveal that they exist); a role that may not act gets 403; an
allowed call succeeds. Operator-only operations are 403 for every user.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest
from starlette.routing import Mount, Route

from inferd.control.accounts.roles import ROLE_ACTIONS, Action, Role
from inferd.server.access import Operation, Target
from tests.integration.accounts_support import OTHER, OWN, ROLES, World, unique, world

__all__ = ["world"]

# A valid body for each operation that takes one, so that what the matrix
# sees is the access decision, not a validation error.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/endpoints"): lambda w, project: {
        "name": unique("ep"), "modelName": "tiny-chat", "minReplicas": 0, "projectId": project,
    },
    ("PATCH", "/endpoints/{id}"): lambda w, project: {"minReplicas": 0, "maxReplicas": 2},
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


def operations(w: World) -> list[Operation]:
    ops: list[Operation] = w.client.app.state.operations  # type: ignore[attr-defined]
    return ops


def concrete_path(w: World, op: Operation, actor: str, project: str) -> str:
    """The operation's path with fresh targets in `project` (own or other)."""
    path = op.path
    owner = (actor or "admin-user") if project == OWN else "outsider"
    if (op.method, op.path) == ("DELETE", "/projects/{id}"):
        # Deleting takes an empty project: a fresh one stands for `project`.
        return f"/projects/{w.ok('POST', '/projects', json={'id': unique('gone')})['id']}"
    if "{id}" in path:
        if op.target is Target.ENDPOINT:
            path = path.replace("{id}", w.endpoint(project)["id"])
        else:
            path = path.replace("{id}", project)
    if "{userId}" in path:
        if op.target is Target.USER:
            path = path.replace("{userId}", owner)
        else:  # a member of the project, made for this case
            member = unique("member")
            w.add_member(project, member, "viewer")
            path = path.replace("{userId}", member)
    if "{name}" in path:  # a model registered in the project
        path = path.replace("{name}", w.model(project)["name"])
    if "{keyId}" in path:
        path = path.replace("{keyId}", w.new_key(owner)["id"])
    return path


def expected(op: Operation, role: Role | None, own: bool) -> str:
    """'ok', 403 or 404 for a user with `role` in the own project."""
    if op.target is Target.OPERATOR:
        return "403" if role is not None else "ok"
    if role is None or op.target is Target.ANY:
        return "ok"
    if not own:
        return "404"
    if op.target is Target.USER:
        return "ok"  # a user's own keys
    return "ok" if op.action in ROLE_ACTIONS[role] else "403"


_DOCS: dict[int, Any] = {}


def documented(w: World, op: Operation, resp: Any) -> None:
    """The answer is one the served OpenAPI document describes, schema included."""
    doc = _DOCS.get(id(w))
    if doc is None:
        doc = _DOCS[id(w)] = w.client.get("/openapi.json").json()
    spec = doc["paths"]["/inference" + op.path][op.method.lower()]["responses"]
    assert str(resp.status_code) in spec, (op.method, op.path, resp.status_code)
    content = spec[str(resp.status_code)].get("content")
    if content is None:
        assert resp.content == b""
        return
    schema = {**content["application/json"]["schema"], "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(resp.json())


def call(w: World, op: Operation, key: str | None, project: str) -> Any:
    actor = "" if key is None else next(u for u, k in w.keys.items() if k == key)
    path = concrete_path(w, op, actor, project)
    body = BODIES.get((op.method, op.path))
    kwargs: dict[str, Any] = {"json": body(w, project)} if body else {}
    if (op.method, op.path) in QUERIES:
        kwargs["params"] = QUERIES[(op.method, op.path)]
    resp = w.op(op.method, path, key, **kwargs)
    documented(w, op, resp)
    return resp


def check(resp: Any, want: str, label: str) -> None:
    if want == "ok":
        assert resp.status_code < 300, f"{label}: {resp.status_code} {resp.text}"
    else:
        assert resp.status_code == int(want), f"{label}: {resp.status_code} {resp.text}"
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if want == "404":
            # Nothing of the other project leaks: the answer of a missing thing.
            # (A project's model is named `<project>:<name>`: an answer may
            # repeat the name asked for, which the caller wrote.)
            message = re.sub(rf"'{OTHER}:[^']*'", "''", error["message"])
            assert OTHER not in message or "No project" in message


def test_matrix_covers_every_route(world: World) -> None:
    """The routes the app serves below /inference are exactly the table's."""
    mount = next(
        r for r in world.client.app.routes if isinstance(r, Mount) and r.path == "/inference"
    )  # type: ignore[attr-defined]
    served = {
        (method, route.path)
        for route in mount.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
        if method != "HEAD"
    }
    declared = {(op.method, op.path) for op in operations(world)}
    assert served == declared
    for op in operations(world):
        if op.method in ("POST", "PUT", "PATCH") and op.path not in (
            "/endpoints/{id}/access-token",
        ):
            assert (op.method, op.path) in BODIES, f"no matrix body for {op.method} {op.path}"


@pytest.mark.parametrize("role", ROLES)
def test_every_operation_for_a_role(world: World, role: str) -> None:
    key = world.keys[f"{role}-user"]
    outcomes = []
    for op in operations(world):
        for own in (True, False):
            want = expected(op, Role(role), own)
            resp = call(world, op, key, OWN if own else OTHER)
            label = f"{role} {op.method} {op.path} {'own' if own else 'other'}"
            check(resp, want, label)
            outcomes.append(want)
    # The matrix exercised all three outcomes for the roles that have them.
    assert "404" in outcomes and "ok" in outcomes
    if role != "admin":
        assert "403" in outcomes


def test_every_operation_for_the_operator(world: World) -> None:
    for op in operations(world):
        for project in (OWN, OTHER):
            resp = call(world, op, None, project)
            check(resp, "ok", f"operator {op.method} {op.path} {project}")


def test_every_operation_needs_a_key(world: World) -> None:
    for op in operations(world):
        path = op.path.replace("{id}", "x").replace("{userId}", "u").replace("{keyId}", "k")
        path = path.replace("{name}", "m")
        for headers in ({}, {"Authorization": "Bearer infd_key_not-a-real-one"}):
            resp = world.client.request(op.method, "/inference" + path, headers=headers)
            assert resp.status_code == 401, (op.method, op.path, resp.text)


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
