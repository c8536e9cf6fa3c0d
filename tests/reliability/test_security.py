"""Items 11-13: who gets in, where a token's plaintext can be found, and what
a crash of the control plane in the middle of token changes leaves behind.

Real `inferd serve` processes with fake-engine replicas: this is about the
control plane and the gateway.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.control.endpoints.tokens import TokenVerifier, new_admin_key, new_endpoint_token
from inferd.control.stores.sql.store import SqliteStore
from inferd.testing import ServeHandle
from tests.reliability.fault_support import CHAT, IMAGES, Endpoint, wait_until
from tests.reliability.limits_support import assert_error, files_containing, list_endpoints
from tests.timings import HANG_S, record_timing

# A key of inferd's own format, as `inferd serve` generates it (an operator's
# own key is redacted in logs only where it is a bearer; see the report).
ADMIN = new_admin_key()
N = 3
HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PICTURE = {"prompt": "x", "size": "64x64"}


def body_for(kind: str) -> tuple[str, dict[str, Any]]:
    return (CHAT, HI) if kind == "chat" else (IMAGES, PICTURE)


@dataclass
class Fleet:
    """A running server, its endpoints, and every secret it ever handed out
    (or was handed), with every error body it answered."""

    serve: ServeHandle
    endpoints: list[Endpoint]
    kinds: list[str]
    secrets: set[str] = field(default_factory=set)
    error_bodies: list[bytes] = field(default_factory=list)

    def admin(self, key: str = ADMIN) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def record(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            self.error_bodies.append(response.content)
        return response

    def infer(self, index: int, token: str) -> httpx.Response:
        path, body = body_for(self.kinds[index])
        headers = {"Authorization": f"Bearer {token}"}
        return self.record(
            httpx.post(self.endpoints[index].url + path, json=body, headers=headers, timeout=30)
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    serve = ServeHandle(
        tmp_path_factory.mktemp("security"),
        admin_key=ADMIN,
        settings={
            "replica_args": "--engine fake --engine-arg token_delay_s=0",
            "health_period_seconds": "0.5",
            "reconcile_period_seconds": "0.2",
            "log_level": "debug",
        },
    ).start()
    try:
        kinds = ["chat", "chat", "image"][:N]
        endpoints = [
            Endpoint.create(
                serve,
                name=f"ep-{i}",
                modelName="tiny-chat" if kind == "chat" else "tiny-sdxl",
                minReplicas=1,
            )
            for i, kind in enumerate(kinds)
        ]
        for endpoint in endpoints:
            serve.wait_record(endpoint.id, lambda r: r["status"] == "running", timeout=60)
        found = Fleet(serve, endpoints, kinds, {ADMIN, *(e.token for e in endpoints)})
        yield found
    finally:
        serve.cleanup()


# -- item 11 ---------------------------------------------------------------------------


@pytest.mark.reliability(item=11)
def test_only_a_token_on_its_own_endpoint_gets_in(fleet: Fleet) -> None:
    """Each endpoint's token gets 200 on its own endpoint and 401
    `invalid_api_key` with `WWW-Authenticate: Bearer` on the others; every
    refusal (admin key, bad tokens, a missing endpoint) has the same body."""
    refusals = set()
    for i, endpoint in enumerate(fleet.endpoints):
        for j in range(N):
            response = fleet.infer(j, endpoint.token)
            if i == j:
                assert response.status_code == 200, (i, j, response.text)
            else:
                assert_error(response, 401, "invalid_api_key")
                assert response.headers["www-authenticate"] == "Bearer"
                refusals.add(response.content)
    # One answer for every refusal: nothing tells an endpoint that exists
    # from one that does not, or which endpoint a token belongs to.
    for token in (ADMIN, new_endpoint_token(), "x", "infd_ep_short"):
        refusals.add(fleet.infer(0, token).content)
    missing = httpx.post(
        f"{fleet.serve.url}/endpoints/no-such-endpoint{CHAT}",
        json=HI,
        headers={"Authorization": f"Bearer {fleet.endpoints[0].token}"},
    )
    refusals.add(fleet.record(missing).content)
    assert len(refusals) == 1, refusals


MANAGEMENT_CALLS = [
    ("GET", "/inference/endpoints", None),
    ("POST", "/inference/endpoints", {"name": "intruder", "modelName": "tiny-chat"}),
    ("GET", "/inference/endpoints/{id}", None),
    ("PATCH", "/inference/endpoints/{id}", {"maxReplicas": 2}),
    ("DELETE", "/inference/endpoints/{id}", None),
    ("POST", "/inference/endpoints/{id}/access-token", None),
    ("GET", "/inference/models", None),
    ("GET", "/inference/gpu-types", None),
    ("GET", "/inference/locations", None),
    ("GET", "/inference/recommendations?modelName=tiny-chat", None),
]


@pytest.mark.reliability(item=11)
def test_management_api_refuses_inference_tokens_and_wrong_admin_keys(fleet: Fleet) -> None:
    """Every management call with no key, a wrong admin key, a bad scheme, the
    key in the query or an endpoint token: 401 with its code and
    WWW-Authenticate; nothing changes and every token still works."""
    before = list_endpoints(fleet.serve)
    target = fleet.endpoints[0].id
    credentials: dict[str, tuple[dict[str, str], str]] = {
        "no key": ({}, "missing_api_key"),
        "wrong admin key": (fleet.admin(new_admin_key()), "invalid_api_key"),
        "operator key, one character off": (fleet.admin(ADMIN[:-1] + "0"), "invalid_api_key"),
        "basic scheme": ({"Authorization": f"Basic {ADMIN}"}, "invalid_authorization_header"),
        "empty bearer": ({"Authorization": "Bearer"}, "invalid_authorization_header"),
        "key in the query": ({}, "missing_api_key"),
    }
    for index, endpoint in enumerate(fleet.endpoints):
        credentials[f"token of endpoint {index}"] = (
            {"Authorization": f"Bearer {endpoint.token}"},
            "wrong_token_kind",
        )
    for name, (headers, code) in credentials.items():
        for method, path, body in MANAGEMENT_CALLS:
            url = fleet.serve.url + path.replace("{id}", target)
            if name == "key in the query":
                url += ("&" if "?" in url else "?") + f"api_key={ADMIN}"
            response = fleet.record(httpx.request(method, url, json=body, headers=headers))
            error = assert_error(response, 401, code)
            assert "www-authenticate" in response.headers, (name, method, path)
            assert error["type"] == "authentication_error", (name, method, path)
    # Nothing changed, and every token still opens its own endpoint.
    assert list_endpoints(fleet.serve) == before
    for index, endpoint in enumerate(fleet.endpoints):
        assert fleet.infer(index, endpoint.token).status_code == 200


@pytest.mark.reliability(item=11)
def test_the_registry_route_takes_no_token_and_no_admin_key(fleet: Fleet) -> None:
    """Replicas report with a secret of their own; neither kind of bearer a
    client holds can forge a report."""
    replica_id = fleet.serve.record(fleet.endpoints[0].id)["replicas"][0]["id"]
    url = f"{fleet.serve.url}/internal/registry/replicas/{replica_id}"
    report = {"status": "failed", "reason": "forged"}
    for headers in ({}, fleet.admin(), {"Authorization": f"Bearer {fleet.endpoints[0].token}"}):
        assert_error(fleet.record(httpx.post(url, json=report, headers=headers)), 401)
    assert fleet.serve.record(fleet.endpoints[0].id)["status"] == "running"


# -- item 12 ---------------------------------------------------------------------------


@pytest.mark.reliability(item=12)
def test_an_old_token_fails_once_it_is_reissued(fleet: Fleet) -> None:
    """Requests with the old token keep coming while the token is re-issued:
    none sent after the re-issue was answered gets in. How soon the first
    refusal follows (goal: within a second) is benchmarks/fault_timings.py's."""
    index = 0
    endpoint = fleet.endpoints[index]
    old = endpoint.token
    answers: list[tuple[float, float, int]] = []  # (sent, answered, status)
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(timeout=30) as client:
            path, body = body_for(fleet.kinds[index])
            while not stop.is_set() and len(answers) < 2000:
                sent = time.monotonic()
                response = client.post(
                    endpoint.url + path, json=body, headers={"Authorization": f"Bearer {old}"}
                )
                fleet.record(response)
                answers.append((sent, time.monotonic(), response.status_code))

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    wait_until(lambda: len(answers) >= 5, 10, 0.01, "requests with the old token")
    with fleet.serve.api() as api:
        response = api.post(f"/inference/endpoints/{endpoint.id}/access-token")
    reissued = time.monotonic()
    assert response.status_code == 200
    new = response.json()["accessToken"]
    fleet.secrets.add(new)
    wait_until(lambda: any(s == 401 for *_, s in answers), HANG_S, 0.005, "a 401 for the old token")
    stop.set()
    thread.join(10)
    first_refusal = min(answered for _, answered, s in answers if s == 401)
    assert all(s == 401 for sent, _, s in answers if sent > reissued), "old token got in"
    assert set(s for *_, s in answers) <= {200, 401}
    print(f"\n{len(answers)} requests with the old token")
    record_timing("re-issue: old token first refused", max(0.0, first_refusal - reissued))
    fleet.endpoints[index] = Endpoint(endpoint.id, endpoint.url, new)
    assert fleet.infer(index, new).status_code == 200
    assert_error(fleet.infer(index, old), 401)


@pytest.mark.reliability(item=12)
def test_no_plaintext_token_in_the_database_logs_or_error_bodies(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Every secret handed out (admin key; live, re-issued and deleted tokens),
    also sent where it does not belong: no plaintext in the database (the
    digests are there), in any error body, or in the debug logs."""
    serve = fleet.serve
    state = serve.state_dir / "state"
    # More secrets, in more states: re-issued (revoked), deleted with its endpoint.
    with serve.api() as api:
        for endpoint in fleet.endpoints:
            fleet.secrets.add(
                api.post(f"/inference/endpoints/{endpoint.id}/access-token").json()["accessToken"]
            )
        gone = api.post("/inference/endpoints", json={"name": "gone", "modelName": "tiny-chat",
                                                      "minReplicas": 0}).json()  # fmt: skip
        fleet.secrets.add(gone["accessToken"])
        assert api.delete(f"/inference/endpoints/{gone['id']}").status_code == 204
    # Secrets sent where they do not belong, so that any echo would show.
    some = sorted(fleet.secrets)
    for secret in some:
        headers = {"Authorization": f"Bearer {secret}"}
        for method, path, body in (
            ("POST", f"/endpoints/{fleet.endpoints[0].id}{CHAT}", {**HI, "model": secret}),
            ("POST", f"/endpoints/{fleet.endpoints[2].id}{IMAGES}", {**PICTURE, "model": secret}),
            ("POST", f"/endpoints/{secret}{CHAT}", HI),
            ("GET", f"/inference/endpoints/{secret}", None),
            ("POST", "/inference/endpoints", {"name": secret, "modelName": secret}),
            ("GET", f"/inference/recommendations?modelName={secret}", None),
        ):
            for auth in (headers, fleet.admin()):
                fleet.record(
                    httpx.request(method, serve.url + path, json=body, headers=auth, timeout=30)
                )
    secrets = sorted(fleet.secrets)
    assert len(secrets) >= 2 * N + 2

    db_files = [state / "inferd.db", state / "inferd.db-wal", state / "inferd.db-shm"]
    # Sanity: these are the live files: the digests of the tokens are there.
    raw = b"".join(p.read_bytes() for p in db_files if p.exists())
    assert sum(hashlib.sha256(s.encode()).digest() in raw for s in secrets) >= N

    assert files_containing(db_files, secrets) == {}, "plaintext in the database while running"
    leaks = [b for b in fleet.error_bodies if any(s.encode() in b for s in secrets)]
    assert leaks == [], leaks[:3]

    serve.stop()
    logs = [*serve.state_dir.glob("serve-*.log"), *(state / "logs").glob("*")]
    assert any(b"DEBUG" in p.read_bytes() for p in logs), "logs are at debug"
    assert files_containing(db_files, secrets) == {}, "plaintext in the database after stop"
    assert files_containing(logs, secrets) == {}, "plaintext in the logs"
    print(f"\n{len(secrets)} secrets, {len(fleet.error_bodies)} error bodies, "
          f"{len(logs)} log files, {len(db_files)} database files checked")  # fmt: skip


# -- item 13 ---------------------------------------------------------------------------

CALLS = 1000
WORKERS = 4
REISSUES_PER_ENDPOINT = 4
KILL_AFTER = 400  # answered calls


@dataclass
class Ledger:
    """What the clients were told: every 2xx answer, in order per endpoint,
    and the calls that were on their way when the server died."""

    ids: dict[str, str] = field(default_factory=dict)  # name -> id, from a 201
    tokens: dict[str, list[str]] = field(default_factory=dict)  # id -> tokens, oldest first
    unanswered_creates: set[str] = field(default_factory=set)  # names
    unanswered_reissues: set[str] = field(default_factory=set)  # ids
    answered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def churn(url: str, worker: int, calls: int, ledger: Ledger) -> None:
    """`calls` create and re-issue calls, one endpoint at a time: a create,
    then its re-issues. Stops at the first call that gets no answer."""
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        endpoint_id = ""
        for call in range(calls):
            if call % (REISSUES_PER_ENDPOINT + 1) == 0:
                name = f"w{worker}-{call}"
                try:
                    response = client.post(
                        "/inference/endpoints",
                        json={"name": name, "modelName": "tiny-chat", "minReplicas": 0},
                    )
                except httpx.HTTPError:
                    ledger.unanswered_creates.add(name)
                    return
                assert response.status_code == 201, response.text
                endpoint_id = response.json()["id"]
                with ledger.lock:
                    ledger.ids[name] = endpoint_id
                    ledger.tokens[endpoint_id] = [response.json()["accessToken"]]
                    ledger.answered += 1
            else:
                try:
                    response = client.post(f"/inference/endpoints/{endpoint_id}/access-token")
                except httpx.HTTPError:
                    ledger.unanswered_reissues.add(endpoint_id)
                    return
                assert response.status_code == 200, response.text
                with ledger.lock:
                    ledger.tokens[endpoint_id].append(response.json()["accessToken"])
                    ledger.answered += 1


@pytest.mark.reliability(item=13)
def test_sigkill_during_create_and_reissue_loses_no_answered_call(tmp_path: Path) -> None:
    """SIGKILL amid concurrent creates and token re-issues: the database is
    intact, every answered create is there after a restart, each endpoint's
    last answered token works (unless a re-issue was in flight), no older one."""
    serve = ServeHandle(
        tmp_path,
        admin_key=ADMIN,
        settings={"replica_args": "--engine fake", "health_period_seconds": "0.5"},
    )
    db = tmp_path / "state" / "inferd.db"
    try:
        serve.start()
        ledger = Ledger()
        workers = [
            threading.Thread(target=churn, args=(serve.url, w, CALLS // WORKERS, ledger))
            for w in range(WORKERS)
        ]
        started = time.monotonic()
        for thread in workers:
            thread.start()
        wait_until(lambda: ledger.answered >= KILL_AFTER, 120, 0.001, "answered calls")
        assert serve.process is not None
        serve.process.send_signal(signal.SIGKILL)
        serve.process.wait(10)
        for thread in workers:
            thread.join(30)
        took = time.monotonic() - started
        answered = ledger.answered
        print(f"\nSIGKILL after {answered} answered calls ({took:.1f} s); in flight: "
              f"{len(ledger.unanswered_creates)} creates, {len(ledger.unanswered_reissues)} "
              f"re-issues")  # fmt: skip
        assert answered < CALLS, "the kill came after the loop"

        # What is on disk, before anything else opens it.
        store = SqliteStore.open(db)
        try:
            assert store.integrity_check() == "ok"
            verifier = TokenVerifier(store)
            asyncio.run(verifier.load())
        finally:
            asyncio.run(store.close())
        check_tokens(ledger, lambda endpoint_id, token: verifier.verify(endpoint_id, token))

        # And what the restarted server says and does.
        serve.start()
        records = list_endpoints(serve)["data"]
        by_name = {r["name"]: r["id"] for r in records}
        for name, endpoint_id in ledger.ids.items():
            assert by_name.get(name) == endpoint_id, name
        assert set(by_name) - set(ledger.ids) <= ledger.unanswered_creates

        def opens(endpoint_id: str, token: str) -> bool:
            # A chat endpoint's token on its image route: 400 (what the
            # endpoint serves instead) once the token is accepted, 401 if
            # not; no replica is woken either way.
            response = httpx.post(
                f"{serve.url}/endpoints/{endpoint_id}{IMAGES}",
                json=PICTURE,
                headers={"Authorization": f"Bearer {token}"},
            )
            assert response.status_code in (401, 400), response.text
            if response.status_code == 400:
                assert response.json()["error"]["code"] == "unsupported_route"
            return response.status_code == 400

        sample = random.Random(13).sample(sorted(ledger.tokens), min(40, len(ledger.tokens)))
        check_tokens(ledger, opens, only=set(sample))
        # The server goes on: a new endpoint and a re-issue on an old one.
        created = serve.create_endpoint(name="after-kill", modelName="tiny-chat", minReplicas=0)
        assert opens(created["id"], created["accessToken"])
        first = next(iter(ledger.ids.values()))
        with serve.api() as api:
            fresh = api.post(f"/inference/endpoints/{first}/access-token").json()["accessToken"]
        assert opens(first, fresh)
        assert not any(opens(first, token) for token in ledger.tokens[first])
    finally:
        serve.cleanup()


def check_tokens(
    ledger: Ledger, opens: Callable[[str, str], bool], only: set[str] | None = None
) -> None:
    """The last token each endpoint was answered with works, unless a later
    re-issue was in flight when the server died (then none of the answered
    ones may); no earlier token works."""
    for endpoint_id, tokens in ledger.tokens.items():
        if only is not None and endpoint_id not in only:
            continue
        *revoked, last = tokens
        if not opens(endpoint_id, last):
            assert endpoint_id in ledger.unanswered_reissues, endpoint_id
        for token in revoked:
            assert not opens(endpoint_id, token), endpoint_id
