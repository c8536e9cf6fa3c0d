"""Composed calls across projects, as stateful properties (Hypothesis rule-based
state machines), on SQLite and on a real PostgreSQL.

Each example sets up two fresh projects, A and B, with an admin, a developer
and a viewer each, a user the operator made a member of both, and A's own
model, endpoints and quota. Then any sequence of actions by B's members
(with every credential they ever got hold of, or the operator's sharing of
A's users with B) runs, and after every step:

- A's endpoints, models, members, keys, quota, endpoint tokens and audit log
  are exactly what A's members and the operator made them in the setup;
- no credential B's members ever held (management keys, endpoint tokens)
  opens anything of A's: no role in A, no read of A's things, no key that
  acts in A listed, no token of A's endpoints;
- nothing B does tells B whether something of A's exists: a name A took is
  free in B, adding a user of A answers like adding a new name, a refused
  server path answers alike whatever is there, A's model is recommended like
  an unknown one.

A per-route matrix (test_access_matrix.py) cannot see an escalation that
takes two legitimate calls; these sequences can.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from inferd.testing.postgres import PostgresServer

OPERATOR_KEY = "tenancy-properties-operator-key-0123"
_examples = itertools.count()

# Who a rule acts on: a symbol, made concrete per example.
USERS = ("a-admin", "a-dev", "a-viewer", "shared", "b-admin", "b-dev", "b-viewer", "fresh")
ROLES = ("admin", "developer", "viewer")
PROJECTS = ("A", "B")
SOURCES = ("root", "/etc", "/nonexistent", "~/.ssh")


class Plane:
    """One in-process control plane (fake replicas) for all examples of a test."""

    def __init__(self, client: TestClient, server: Server, model_dir: Path) -> None:
        self.client = client
        self.server = server
        self.model_dir = model_dir

    def call(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {key or OPERATOR_KEY}"}
        return self.client.request(method, "/inference" + path, headers=headers, **kwargs)

    def ok(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
        resp = self.call(method, path, key, **kwargs)
        assert resp.status_code < 300, (method, path, resp.status_code, resp.text)
        return resp.json() if resp.content else None


def acts_in(key: dict[str, Any], project: str) -> bool:
    # A key without a project acts in every project of its user.
    return key.get("projectId") in (None, project)


class Tenancy(RuleBasedStateMachine):
    plane: Plane  # set by the test

    def __init__(self) -> None:
        super().__init__()
        p = self.plane
        n = next(_examples)
        self.a, self.b = f"a{n}", f"b{n}"
        self.users = {u: f"{u}-{n}" for u in USERS if u != "fresh"}
        self.fresh = (f"fresh-{n}-{i}" for i in itertools.count())
        for project in (self.a, self.b):
            p.ok("POST", "/projects", json={"id": project})
        self.a_keys: dict[str, str] = {}
        self.b_keys: list[str] = []  # every management key B's members ever held
        for symbol in ("a-admin", "a-dev", "a-viewer", "b-admin", "b-dev", "b-viewer"):
            project = self.a if symbol.startswith("a-") else self.b
            role = {"admin": "admin", "dev": "developer", "viewer": "viewer"}[symbol[2:]]
            added = p.ok("PUT", f"/projects/{project}/members/{self.users[symbol]}",
                         json={"role": role})  # fmt: skip
            key = added["createdKey"]["key"]
            if project == self.a:
                self.a_keys[symbol] = key
            else:
                self.b_keys.append(key)
        # A user of both projects (the operator's doing): its own key is not B's.
        shared = self.users["shared"]
        p.ok("PUT", f"/projects/{self.a}/members/{shared}", json={"role": "developer"})
        p.ok("PUT", f"/projects/{self.b}/members/{shared}", json={"role": "viewer"})
        # A's own things, made by A's members.
        a_dev = self.a_keys["a-dev"]
        self.a_model_bare = f"weights-{n}"
        self.a_model = p.ok("POST", "/models", a_dev,
                            json={"source": str(p.model_dir), "name": self.a_model_bare,
                                  "projectId": self.a})["name"]  # fmt: skip
        self.other_model = f"other-{n}"
        self.a_endpoints: dict[str, str] = {}  # id -> its access token
        for model in (self.a_model, "tiny-chat"):
            made = p.ok("POST", "/endpoints", a_dev,
                        json={"name": "served", "modelName": model, "minReplicas": 0,
                              "projectId": self.a} if model != "tiny-chat" else
                        {"name": "plain", "modelName": model, "minReplicas": 0,
                         "projectId": self.a})  # fmt: skip
            self.a_endpoints[made["id"]] = made["accessToken"]
        p.ok("PUT", f"/projects/{self.a}/quota", self.a_keys["a-admin"], json={"replicas": 5})
        self.b_endpoints: list[str] = []
        self.b_tokens: list[str] = []  # every endpoint token B's members ever held
        self.b_model_names: set[str] = set()  # bare names B registered
        self.b_put_names: set[str] = set()  # user names B's members added to B
        self.probed: set[str] = set()
        self.before = self.snapshot()

    # --- helpers ---------------------------------------------------------------------

    def project(self, symbol: str) -> str:
        return self.a if symbol == "A" else self.b

    def user(self, symbol: str) -> str:
        return next(self.fresh) if symbol == "fresh" else self.users[symbol]

    def actor(self, i: int) -> str:
        return self.b_keys[i % len(self.b_keys)]

    def collect(self, resp: Any) -> None:
        """Every credential an answer to B hands out is B's from now on."""
        if resp.status_code >= 300 or not resp.content:
            return
        body = resp.json()
        for found in _find(body, "key"):
            if isinstance(found, str) and found.startswith("infd_key_"):
                self.b_keys.append(found)
        for found in _find(body, "accessToken"):
            if isinstance(found, str):
                self.b_tokens.append(found)

    def a_members(self) -> list[str]:
        members = self.plane.ok("GET", f"/projects/{self.a}/members")["data"]
        return sorted(m["userId"] for m in members)

    def snapshot(self) -> dict[str, Any]:
        """A's state, as the operator reads it."""
        p, a = self.plane, self.a
        endpoints = p.ok("GET", "/endpoints", params={"projectId": a})["data"]
        models = [m for m in p.ok("GET", "/models")["data"] if m.get("projectId") == a]
        members = p.ok("GET", f"/projects/{a}/members")["data"]
        keys = {}
        for user in sorted({m["userId"] for m in members} | {self.users["shared"]}):
            listed = p.ok("GET", f"/users/{user}/keys")["data"]
            keys[user] = sorted(
                (k["id"], k["name"], k["revokedAt"]) for k in listed if acts_in(k, a)
            )
        project = p.ok("GET", f"/projects/{a}")
        audit = p.ok("GET", f"/projects/{a}/audit")["data"]
        verifier = p.server.verifier
        return {
            "endpoints": sorted(
                (
                    e["id"],
                    e["name"],
                    e["modelName"],
                    e["minReplicas"],
                    e["maxReplicas"],
                    e["gpuType"],
                    e["gpuCount"],
                )
                for e in endpoints
            ),
            "tokens": {i: verifier.verify(i, t) for i, t in self.a_endpoints.items()},
            "models": sorted(m["name"] for m in models),
            "members": sorted((m["userId"], m["role"]) for m in members),
            "keys": keys,
            "quota": (project["quota"], project["quotaLimit"]),
            "audit": [(e["id"], e["actor"], e["action"], e["target"]) for e in audit],
        }

    # --- B's members act ----------------------------------------------------------------

    @rule(i=st.integers(0, 99), project=st.sampled_from(PROJECTS), user=st.sampled_from(USERS),
          role=st.sampled_from(ROLES))  # fmt: skip
    def put_member(self, i: int, project: str, user: str, role: str) -> None:
        key, target = self.actor(i), self.user(user)
        b_members = self.plane.ok("GET", f"/projects/{self.b}/members")["data"]
        unseen = target not in {m["userId"] for m in b_members} | self.b_put_names
        if project == "B":
            self.b_put_names.add(target)
        resp = self.plane.call("PUT", f"/projects/{self.project(project)}/members/{target}", key,
                               json={"role": role})  # fmt: skip
        self.collect(resp)
        if project == "B" and user.startswith("a-") and unseen and resp.status_code < 300:
            # Adding A's user answers as adding a name never seen: a new user
            # with a first key, not A's user (who did not consent).
            fresh = self.plane.call("PUT", f"/projects/{self.b}/members/{next(self.fresh)}",
                                    key, json={"role": role})  # fmt: skip
            self.collect(fresh)
            assert resp.status_code == fresh.status_code, (resp.text, fresh.text)

    @rule(i=st.integers(0, 99), project=st.sampled_from(PROJECTS), user=st.sampled_from(USERS))
    def remove_member(self, i: int, project: str, user: str) -> None:
        path = f"/projects/{self.project(project)}/members/{self.user(user)}"
        self.plane.call("DELETE", path, self.actor(i))

    @rule(i=st.integers(0, 99), user=st.sampled_from(USERS),
          scope=st.sampled_from((None, "A", "B")))  # fmt: skip
    def create_key(self, i: int, user: str, scope: str | None) -> None:
        body: dict[str, Any] = {"name": "by-b"}
        if scope is not None:
            body["projectId"] = self.project(scope)
        resp = self.plane.call("POST", f"/users/{self.user(user)}/keys", self.actor(i), json=body)
        self.collect(resp)

    @rule(i=st.integers(0, 99), user=st.sampled_from(USERS))
    def list_keys(self, i: int, user: str) -> None:
        resp = self.plane.call("GET", f"/users/{self.user(user)}/keys", self.actor(i))
        in_a = self.user(user) in [*self.a_members(), self.users["shared"]]
        if resp.status_code == 200 and in_a:
            shown = [k for k in resp.json()["data"] if acts_in(k, self.a)]
            assert shown == [], ("B listed keys that act in A", shown)

    @rule(i=st.integers(0, 99), user=st.sampled_from(USERS), which=st.integers(0, 9))
    def revoke_key(self, i: int, user: str, which: int) -> None:
        target = self.user(user)
        resp = self.plane.call("GET", f"/users/{target}/keys")
        keys = resp.json()["data"] if resp.status_code == 200 else []
        if keys:
            key_id = keys[which % len(keys)]["id"]
            self.plane.call("DELETE", f"/users/{target}/keys/{key_id}", self.actor(i))

    @rule(i=st.integers(0, 99), project=st.sampled_from(PROJECTS),
          model=st.sampled_from(("a-model", "a-bare", "tiny-chat")))  # fmt: skip
    def create_endpoint(self, i: int, project: str, model: str) -> None:
        name = {"a-model": self.a_model, "a-bare": self.a_model_bare}.get(model, model)
        body = {"name": next(self.fresh), "modelName": name, "minReplicas": 0,
                "projectId": self.project(project)}  # fmt: skip
        resp = self.plane.call("POST", "/endpoints", self.actor(i), json=body)
        self.collect(resp)
        if resp.status_code < 300:
            self.b_endpoints.append(resp.json()["id"])

    def endpoint(self, which: int) -> str:
        ids = [*self.a_endpoints, *self.b_endpoints]
        return ids[which % len(ids)]

    @rule(i=st.integers(0, 99), which=st.integers(0, 9))
    def update_endpoint(self, i: int, which: int) -> None:
        self.plane.call("PATCH", f"/endpoints/{self.endpoint(which)}", self.actor(i),
                        json={"maxReplicas": 2})  # fmt: skip

    @rule(i=st.integers(0, 99), which=st.integers(0, 9))
    def reissue_token(self, i: int, which: int) -> None:
        resp = self.plane.call("POST", f"/endpoints/{self.endpoint(which)}/access-token",
                               self.actor(i))  # fmt: skip
        self.collect(resp)

    @rule(i=st.integers(0, 99), which=st.integers(0, 9))
    def delete_endpoint(self, i: int, which: int) -> None:
        self.plane.call("DELETE", f"/endpoints/{self.endpoint(which)}", self.actor(i))

    @rule(i=st.integers(0, 99), project=st.sampled_from(PROJECTS),
          name=st.sampled_from(("a-name", "other")), source=st.sampled_from(SOURCES))  # fmt: skip
    def register_model(self, i: int, project: str, name: str, source: str) -> None:
        name = self.a_model_bare if name == "a-name" else self.other_model
        where = str(self.plane.model_dir) if source == "root" else source
        body = {"source": where, "name": name, "projectId": self.project(project)}
        resp = self.plane.call("POST", "/models", self.actor(i), json=body)
        self.collect(resp)
        if resp.status_code == 201 and project == "B":
            self.b_model_names.add(name)
        if project == "B" and resp.status_code == 409:
            # A name is taken only by B's own model, never by A's.
            assert name in self.b_model_names, resp.text
        if source in ("/etc", "/nonexistent") and resp.status_code >= 400:
            # A refused path says nothing about what is there.
            other = "/nonexistent" if source == "/etc" else "/etc"
            twin = self.plane.call("POST", "/models", self.actor(i),
                                   json={**body, "source": other})  # fmt: skip
            self.collect(twin)
            assert (twin.status_code, twin.json()["error"]["message"]) == (
                resp.status_code, resp.json()["error"]["message"].replace(source, other),
            )  # fmt: skip

    @rule(i=st.integers(0, 99), model=st.sampled_from(("a-model", "a-bare")))
    def delete_model(self, i: int, model: str) -> None:
        name = self.a_model if model == "a-model" else f"{self.b}:{self.a_model_bare}"
        resp = self.plane.call("DELETE", f"/models/{name}", self.actor(i))
        if resp.status_code == 409:
            # Nothing of A's is named in B's answers.
            assert "served" not in resp.text and self.a not in resp.text, resp.text

    @rule(i=st.integers(0, 99), project=st.sampled_from(PROJECTS), replicas=st.integers(0, 9))
    def set_quota(self, i: int, project: str, replicas: int) -> None:
        self.plane.call("PUT", f"/projects/{self.project(project)}/quota", self.actor(i),
                        json={"replicas": replicas})  # fmt: skip

    @rule(i=st.integers(0, 99))
    def recommend_a_model(self, i: int) -> None:
        key = self.actor(i)
        known = self.plane.call("GET", "/recommendations", key,
                                params={"modelName": self.a_model})  # fmt: skip
        unknown = self.plane.call("GET", "/recommendations", key,
                                  params={"modelName": f"{self.a}:no-such-model"})  # fmt: skip
        # The same answer as for a name that exists nowhere (400; 401 for a
        # key revoked meanwhile).
        assert known.status_code == unknown.status_code in (400, 401), known.text[:300]
        assert known.json()["error"]["code"] == unknown.json()["error"]["code"]

    # --- the operator acts (legitimately, never granting B anything of A's) ---------

    @rule(user=st.sampled_from(("a-admin", "a-dev", "a-viewer")))
    def operator_shares_a_user_with_b(self, user: str) -> None:
        self.plane.ok("PUT", f"/projects/{self.b}/members/{self.users[user]}",
                      json={"role": "viewer"})  # fmt: skip

    @rule(i=st.integers(0, 99))
    def operator_mints_a_key_for_a_b_member(self, i: int) -> None:
        user = self.users[("b-admin", "b-dev", "b-viewer")[i % 3]]
        created = self.plane.ok("POST", f"/users/{user}/keys", json={"name": "from-operator"})
        self.b_keys.append(created["key"])

    # --- what must hold after every step ----------------------------------------------

    @invariant()
    def a_is_what_its_members_made_it(self) -> None:
        assert self.snapshot() == self.before

    @invariant()
    def no_credential_of_b_opens_anything_of_a(self) -> None:
        p, a = self.plane, self.a
        for key in self.b_keys:
            who = p.call("GET", "/whoami", key)
            if who.status_code == 401:
                continue  # revoked: opens nothing
            assert a not in who.json()["roles"], ("B's key has a role in A", who.json())
            if key in self.probed:
                continue
            self.probed.add(key)
            assert p.call("GET", f"/projects/{a}", key).status_code == 404
            assert p.call("GET", f"/models/{self.a_model}", key).status_code == 404
            for endpoint_id in self.a_endpoints:
                assert p.call("GET", f"/endpoints/{endpoint_id}", key).status_code == 404
            listed = p.ok("GET", "/models", key)["data"]
            assert self.a_model not in [m["name"] for m in listed]
            seen = p.ok("GET", "/endpoints", key)["data"]
            assert not set(self.a_endpoints) & {e["id"] for e in seen}
        verifier = p.server.verifier
        for token in self.b_tokens:
            for endpoint_id in self.a_endpoints:
                assert not verifier.verify(endpoint_id, token), "B holds a token of A's"


def _find(body: Any, name: str) -> Iterator[Any]:
    if isinstance(body, dict):
        for k, v in body.items():
            if k == name:
                yield v
            yield from _find(v, name)
    elif isinstance(body, list):
        for item in body:
            yield from _find(item, name)


# Bounded: two backends, each under a minute on a 2-core box.
RUNS = settings(
    max_examples=12,
    stateful_step_count=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(params=["sqlite", "postgres"])
def plane(request: pytest.FixtureRequest, tmp_path: Path, tiny_chat_dir: Path) -> Iterator[Plane]:
    more: dict[str, Any] = {}
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        more["database_url"] = server.create_database()
    settings_ = load_settings(
        env={},
        overrides={
            "state_dir": tmp_path / "state",
            "admin_key": OPERATOR_KEY,
            # Members register the test model's directory from here.
            "model_roots": str(tiny_chat_dir.parent),
            **more,
        },
    )
    plane = asyncio.run(build(settings_, launcher=FakeLauncher(), run_replicas=False))
    try:
        with TestClient(create_app(plane)) as client:
            yield Plane(client, plane, tiny_chat_dir)
    finally:
        asyncio.run(plane.close())


def test_nothing_project_b_does_reaches_project_a(plane: Plane) -> None:
    Tenancy.plane = plane
    run_state_machine_as_test(Tenancy, settings=RUNS)
