"""The console in-process (Starlette's TestClient): sign-in and the session
cookie, CSRF on every form, the security headers, project scoping and roles,
names rendered as text, and each page over the real service layer. The
real-browser flows are in tests/browser."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.control.replicas.registry import Replica
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from tests.console_support import ADMIN, csrf_of, seed_projects, sign_in

BASE = "http://testserver"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Server]:
    settings = load_settings(
        env={},
        overrides={
            "state_dir": tmp_path / "state",
            "admin_key": ADMIN,
            "public_url": BASE,
        },
    )
    p = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    yield p
    asyncio.run(p.close())


@pytest.fixture
def client(plane: Server) -> Iterator[TestClient]:
    with TestClient(create_app(plane), base_url=BASE) as c:
        yield c


def create(client: TestClient, csrf: str, name: str = "chat", **extra: str) -> str:
    """Creates through the console's form; returns the endpoint id."""
    answer = client.post(
        "/console/endpoints",
        data={
            "csrf": csrf,
            "name": name,
            "model": "tiny-chat",
            "location": "local",
            "option": "cpu:1",
            "minReplicas": "0",
            "maxReplicas": "2",
            "retention": "60",
            **extra,
        },
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text
    return answer.headers["location"].rsplit("/", 1)[-1]


def test_signin_sets_a_strict_httponly_cookie_and_rotates_the_session(client: TestClient) -> None:
    first = client.get("/console/signin")
    before = first.cookies["inferd_console"]
    cookie = first.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    answer = client.post(
        "/console/signin", data={"key": ADMIN, "csrf": csrf_of(first.text)}, follow_redirects=False
    )
    assert answer.status_code == 303
    after = answer.cookies["inferd_console"]
    assert after != before  # no session fixation
    assert "HttpOnly" in answer.headers["set-cookie"]
    page = client.get("/console/endpoints")
    assert page.status_code == 200 and "operator" in page.text


def test_wrong_key_is_refused_and_pages_need_a_session(client: TestClient) -> None:
    page = client.get("/console/endpoints", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/console/signin"
    form = client.get("/console/signin")
    answer = client.post("/console/signin", data={"key": "nope", "csrf": csrf_of(form.text)})
    assert answer.status_code == 401 and "not valid" in answer.text
    # htmx requests are told where to go with a header, not a redirect body.
    poll = client.get("/console/endpoints/changes", headers={"HX-Request": "true"})
    assert poll.headers.get("HX-Redirect") == "/console/signin"


def test_every_answer_carries_the_strict_csp(client: TestClient) -> None:
    for path in ("/console/signin", "/console/static/console.css", "/console/endpoints"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"


def test_pages_have_no_inline_script_or_style_and_nothing_from_elsewhere(
    client: TestClient,
) -> None:
    csrf = sign_in(client)
    endpoint_id = create(client, csrf)
    for path in (
        "/console/endpoints",
        "/console/endpoints/new",
        f"/console/endpoints/{endpoint_id}",
        f"/console/endpoints/{endpoint_id}/playground",
        f"/console/endpoints/{endpoint_id}/token",
        "/console/usage",
    ):
        html = client.get(path).text
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert " style=" not in html and "<style" not in html, path
        assert not re.search(r"\bon[a-z]+=", html), path  # no inline handlers
        for url in re.findall(r'(?:src|href)="([^"]+)"', html):
            assert url.startswith(("/console/", "#")), (path, url)


def test_a_form_without_the_csrf_token_is_refused(client: TestClient, plane: Server) -> None:
    csrf = sign_in(client)
    endpoint_id = create(client, csrf)
    for path, data in (
        ("/console/endpoints", {"name": "x", "model": "tiny-chat"}),
        (f"/console/endpoints/{endpoint_id}/delete", {"confirm_name": "chat"}),
        (f"/console/endpoints/{endpoint_id}/token", {}),
        (f"/console/endpoints/{endpoint_id}/settings", {"minReplicas": "1"}),
        ("/console/signout", {}),
    ):
        for token in (None, "forged"):
            body = dict(data) if token is None else {**data, "csrf": token}
            answer = client.post(path, data=body)
            assert answer.status_code == 403, (path, token)
    assert plane.service.find(endpoint_id) is not None  # nothing changed
    # From another origin even with the right token.
    answer = client.post(
        f"/console/endpoints/{endpoint_id}/token",
        data={"csrf": csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403


def test_create_shows_the_token_once_then_never(client: TestClient, plane: Server) -> None:
    csrf = sign_in(client)
    endpoint_id = create(client, csrf)
    page = client.get(f"/console/endpoints/{endpoint_id}")
    token = re.search(r'data-testid="token">([^<]+)<', page.text)
    assert token is not None and token.group(1).startswith("infd_ep_")
    assert plane.verifier.verify(endpoint_id, token.group(1))
    again = client.get(f"/console/endpoints/{endpoint_id}")
    assert 'data-testid="token"' not in again.text
    assert token.group(1) not in again.text


def test_request_access_token_replaces_the_old_one(client: TestClient, plane: Server) -> None:
    csrf = sign_in(client)
    endpoint_id = create(client, csrf)
    old = re.search(
        r'data-testid="token">([^<]+)<', client.get(f"/console/endpoints/{endpoint_id}").text
    )
    assert old
    confirm = client.get(f"/console/endpoints/{endpoint_id}/token")
    assert "stops working" in confirm.text
    answer = client.post(f"/console/endpoints/{endpoint_id}/token", data={"csrf": csrf})
    new = re.search(r'data-testid="token">([^<]+)<', answer.text)
    assert new and new.group(1) != old.group(1)
    assert plane.verifier.verify(endpoint_id, new.group(1))
    assert not plane.verifier.verify(endpoint_id, old.group(1))


def test_list_search_live_changes_and_empty_state(client: TestClient) -> None:
    csrf = sign_in(client)
    empty = client.get("/console/endpoints")
    assert 'data-testid="empty-state"' in empty.text and "/console/endpoints/new" in empty.text
    create(client, csrf, "alpha")
    beta = create(client, csrf, "beta")
    listed = client.get("/console/endpoints")
    assert 'data-testid="row-alpha"' in listed.text and 'data-testid="row-beta"' in listed.text
    found = client.get("/console/endpoints/rows", params={"name": "Alp"})
    assert "row-alpha" in found.text and "row-beta" not in found.text
    version = int(re.search(r'"since": (\d+)', listed.text).group(1))  # type: ignore[union-attr]
    signature = re.search(r'"signature": "([0-9a-f]+)"', listed.text).group(1)  # type: ignore[union-attr]
    quiet = client.get(
        "/console/endpoints/changes", params={"since": version, "signature": signature}
    )
    assert "row-" not in quiet.text  # nothing changed: no row sent
    client.post(
        f"/console/endpoints/{beta}/settings",
        data={"csrf": csrf, "minReplicas": "0", "maxReplicas": "3", "retention": "60"},
    )
    changed = client.get(
        "/console/endpoints/changes", params={"since": version, "signature": signature}
    )
    assert "row-beta" in changed.text and "row-alpha" not in changed.text
    assert 'hx-swap-oob="true"' in changed.text and "0 / 0 / 3" in changed.text


def test_create_form_recommends_and_explains(client: TestClient) -> None:
    sign_in(client)
    page = client.get(
        "/console/endpoints/new", params={"model": "tiny-chat", "location": "us-east"}
    )
    assert 'data-testid="best"' in page.text
    best = re.search(r'value="([^"]+)" checked', page.text)
    assert best and best.group(1) == "cpu:1"
    assert 'class="rejected"' in page.text  # options that do not fit, with their reasons
    # Each fitting option shows its error band, with what it rests on as the tooltip.
    band = re.search(r'<td class="num" title="([^"]*)" data-testid="error-band">±(\d+)%', page.text)
    assert band and "published" in band.group(1) and int(band.group(2)) > 0
    envelope = client.get(
        "/console/endpoints/new/envelope",
        params={
            "model": "tiny-chat",
            "location": "us-east",
            "option": "L4:1",
            "minReplicas": "1",
            "maxReplicas": "3",
        },
    )
    # 1 x 0.79/h x 730.5 h; 3 x 0.79/h.
    assert "577.10 USD per month" in envelope.text and "2.37 USD per hour" in envelope.text


def test_settings_preview_shows_the_cost_change(client: TestClient) -> None:
    csrf = sign_in(client)
    endpoint_id = create(client, csrf, location="us-east", option="L4:1")
    preview = client.get(
        f"/console/endpoints/{endpoint_id}/settings",
        params={"minReplicas": "1", "maxReplicas": "2", "option": "L4:1"},
    )
    assert "+577.10 USD" in preview.text  # idle floor: 0 -> 1 replica a month
    assert "0.00 USD" in preview.text


def test_names_and_typed_values_render_as_text(client: TestClient) -> None:
    csrf = sign_in(client)
    evil = '<img src=x id="pwned">'
    answer = client.post(
        "/console/endpoints",
        data={
            "csrf": csrf,
            "name": evil,
            "model": "tiny-chat",
            "location": "local",
            "option": "cpu:1",
        },
    )
    assert answer.status_code == 400
    assert evil not in answer.text and "&lt;img src=x" in answer.text
    search = client.get("/console/endpoints", params={"name": evil})
    assert evil not in search.text and "&lt;img" in search.text


def test_delete_needs_the_name_typed(client: TestClient, plane: Server) -> None:
    csrf = sign_in(client)
    endpoint_id = create(client, csrf)
    wrong = client.post(
        f"/console/endpoints/{endpoint_id}/delete", data={"csrf": csrf, "confirm_name": "chta"}
    )
    assert wrong.status_code == 400 and plane.service.find(endpoint_id) is not None
    right = client.post(
        f"/console/endpoints/{endpoint_id}/delete",
        data={"csrf": csrf, "confirm_name": "chat"},
        follow_redirects=False,
    )
    assert right.status_code == 303 and plane.service.find(endpoint_id) is None


# --- projects and roles ------------------------------------------------------------------


def create_in(client: TestClient, csrf: str, project: str, name: str) -> str:
    return create(client, csrf, name, project=project)


def test_viewer_sees_no_button_that_changes_and_the_server_refuses(
    client: TestClient, plane: Server
) -> None:
    keys = seed_projects(client)
    csrf = sign_in(client)
    endpoint_id = create_in(client, csrf, "alpha", "a-chat")
    client.cookies.clear()
    csrf = sign_in(client, keys["vera"])
    listed = client.get("/console/endpoints").text
    assert "row-a-chat" in listed and "Create endpoint" not in listed
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    for marker in (
        "request-token",
        "settings-save",
        "delete-submit",
        'method="post" action="/console/endpoints/',
    ):
        assert marker not in page, marker
    refused = [
        client.post(f"/console/endpoints/{endpoint_id}/token", data={"csrf": csrf}),
        client.post(
            f"/console/endpoints/{endpoint_id}/settings",
            data={"csrf": csrf, "minReplicas": "1", "maxReplicas": "1"},
        ),
        client.post(
            f"/console/endpoints/{endpoint_id}/delete",
            data={"csrf": csrf, "confirm_name": "a-chat"},
        ),
        client.post(
            "/console/endpoints",
            data={
                "csrf": csrf,
                "name": "a-new",
                "model": "tiny-chat",
                "option": "cpu:1",
                "project": "alpha",
            },
        ),
        client.get("/console/endpoints/new"),
        client.get(f"/console/endpoints/{endpoint_id}/token"),
    ]
    assert [r.status_code for r in refused] == [403] * 6
    row = plane.service.find(endpoint_id)
    assert row is not None and row.min_replicas == 0
    assert plane.service.find_by_name("a-new", "alpha") is None


def test_another_projects_endpoint_is_a_404(client: TestClient) -> None:
    keys = seed_projects(client)
    csrf = sign_in(client)
    alpha_id = create_in(client, csrf, "alpha", "a-chat")
    beta_id = create_in(client, csrf, "beta", "b-chat")
    client.cookies.clear()
    csrf = sign_in(client, keys["olga"])
    assert "row-a-chat" not in client.get("/console/endpoints").text
    for path in ("", "/playground", "/logs", "/logs.txt", "/charts", "/live", "/token", "/row"):
        assert client.get(f"/console/endpoints/{alpha_id}{path}").status_code == 404, path
    for path, data in (("/token", {}), ("/delete", {"confirm_name": "a-chat"})):
        answer = client.post(f"/console/endpoints/{alpha_id}{path}", data={"csrf": csrf, **data})
        assert answer.status_code == 404, path
    # Creating in a project one is not a member of: as if it did not exist.
    answer = client.post(
        "/console/endpoints",
        data={
            "csrf": csrf,
            "name": "x",
            "model": "tiny-chat",
            "option": "cpu:1",
            "project": "alpha",
        },
    )
    assert answer.status_code == 404
    assert client.get(f"/console/endpoints/{beta_id}").status_code == 200
    usage = client.get("/console/usage").text
    assert "project-beta" in usage and "project-alpha" not in usage


def test_a_revoked_key_ends_the_session_at_once(client: TestClient) -> None:
    keys = seed_projects(client)
    sign_in(client, keys["olga"])
    assert client.get("/console/endpoints").status_code == 200
    auth = {"Authorization": f"Bearer {ADMIN}"}
    (key,) = client.get("/inference/users/olga/keys", headers=auth).json()["data"]
    answer = client.delete(f"/inference/users/olga/keys/{key['id']}", headers=auth)
    assert answer.status_code == 204, answer.text
    page = client.get("/console/endpoints", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/console/signin"


def test_list_rows_agree_with_the_api_records(client: TestClient, plane: Server) -> None:
    """The list builds its rows from the stored row and replicas directly
    (cheaper than the record); both must say the same."""
    from inferd.console.views import row_view_of
    from inferd.control.endpoints.records import EndpointRuntime, ReplicaStatus, ReplicaView

    csrf = sign_in(client)
    endpoint_id = create(client, csrf, location="us-east", option="L4:1")
    row = plane.service.find(endpoint_id)
    assert row is not None
    for replicas in (
        (),
        (ReplicaView(1, ReplicaStatus.LOADING),),
        (ReplicaView(1, ReplicaStatus.READY), ReplicaView(1, ReplicaStatus.FAILED, reason="x")),
    ):
        runtime = EndpointRuntime(replicas)
        plane.service.runtime_of = lambda _id, runtime=runtime: runtime  # type: ignore[misc]
        record = plane.service.record(endpoint_id)
        view = row_view_of(row, runtime, 0.0)
        assert (view.status, view.reason, view.replicas_now) == (
            record["status"],
            record["statusReason"],
            record["currentReplicas"],
        )
        assert view.price_now == record["currentReplicas"] * record["hourlyPrice"]


def test_endpoint_page_shows_the_engines_cache_figures(client: TestClient, plane: Server) -> None:
    from inferd.control.replicas.registry import Replica, secret_digest
    from inferd.testing import replica_report

    endpoint_id = create(client, sign_in(client))
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    assert "no prompt looked up yet" in page
    for rid, hits in (("r-a", 900), ("r-b", 300)):
        plane.registry.add(Replica(rid, endpoint_id, 1, "cpu", 1, secret_digest(rid)))
        load = {"prefixCacheQueries": 1000, "prefixCacheHits": hits, "kvCacheUsage": 0.25,
                "waiting": 2}  # fmt: skip
        report = replica_report(rid, {"status": "ready", "url": "http://127.0.0.1:9", "load": load})
        plane.registry.report(rid, rid, report)
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    assert re.search(r'data-testid="live-cache-hit-rate">60\.0%<', page), page
    rates = re.findall(r'data-testid="replica-cache-hit-rate">([^<]*)<', page)
    assert sorted(rates) == ["30.0%", "90.0%"]
    assert "1200 of 2000 prompt tokens" in page


def test_the_playground_tries_embedding_and_rerank_endpoints(client: TestClient) -> None:
    csrf = sign_in(client)
    for model, form, path in (
        ("tiny-embed", 'id="pg-embed"', "Input tokens/s"),
        ("tiny-rerank", 'id="pg-rerank"', "Input tokens/s"),
    ):
        endpoint_id = create(client, csrf, name=model, model=model)
        html = client.get(f"/console/endpoints/{endpoint_id}/playground").text
        assert form in html and path in html, model
        assert 'id="pg-chat"' not in html and 'id="pg-image"' not in html
        assert f'data-kind="{model.split("-")[1].replace("embed", "embedding")}"' in html


def test_endpoint_page_shows_where_each_replica_runs(client: TestClient, plane: Server) -> None:
    from inferd.control.ports import ReplicaHandle
    from inferd.control.replicas.registry import Replica, secret_digest

    endpoint_id = create(client, sign_in(client))
    node = "10.0.0.7 (3f2a9c0d11aa)"
    handle = ReplicaHandle("r-n", node, {"actor": "inferd-replica-r-n"})
    plane.registry.add(Replica("r-n", endpoint_id, 1, "cpu", 1, secret_digest("r-n"), handle))
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    assert re.findall(r'data-testid="replica-node">([^<]*)<', page) == [node]
    (replica,) = plane.service.record(endpoint_id)["replicas"]
    assert replica["node"] == node


def test_the_log_panel_reads_each_replicas_log_through_its_launcher(
    plane: Server, client: TestClient
) -> None:
    """Whatever the launcher (local files, or a Ray actor's node): the
    console asks the launcher port, never a path of its own."""
    csrf = sign_in(client)
    endpoint_id = create(client, csrf, "logged")
    plane.registry.add(
        Replica(
            replica_id="r-logged",
            endpoint_id=endpoint_id,
            generation=1,
            gpu_type="cpu",
            gpu_count=1,
            secret_digest=b"d" * 32,
        )
    )
    launcher = plane.launcher
    assert isinstance(launcher, FakeLauncher)
    launcher.logs["r-logged"] = "loading weights\nreplica ready\n"
    download = client.get(f"/console/endpoints/{endpoint_id}/logs.txt")
    assert download.status_code == 200
    assert "==> replica r-logged <==\nloading weights\nreplica ready" in download.text
    panel = client.get(f"/console/endpoints/{endpoint_id}/logs")
    assert "replica ready" in panel.text
    del launcher.logs["r-logged"]  # none to read (its node is gone)
    assert (
        "No replica has written a log yet"
        in client.get(f"/console/endpoints/{endpoint_id}/logs.txt").text
    )


def test_the_console_lists_an_endpoints_adapters_and_the_playground_tries_them(
    client: TestClient, plane: Server, tiny_lora_dir: Path
) -> None:
    from inferd.control.replicas.registry import Replica, secret_digest
    from inferd.testing import replica_report

    sign_in(client)
    api = {"Authorization": f"Bearer {ADMIN}"}
    body = {"name": "tuned", "modelName": "tiny-chat", "minReplicas": 0,
            "engineSettings": {"maxLoras": 2}}  # fmt: skip
    endpoint_id = client.post("/inference/endpoints", json=body, headers=api).json()["id"]
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    assert "No adapter is registered." in page
    answer = client.post(f"/inference/endpoints/{endpoint_id}/adapters", headers=api,
                         json={"name": "sql", "source": str(tiny_lora_dir)})  # fmt: skip
    assert answer.status_code == 201, answer.text
    plane.registry.add(Replica("r-l", endpoint_id, 1, "cpu", 1, secret_digest("r-l")))
    load = {"adapters": ["sql"]}
    report = replica_report("r-l", {"status": "ready", "url": "http://127.0.0.1:9", "load": load})
    plane.registry.report("r-l", "r-l", report)

    live = client.get(f"/console/endpoints/{endpoint_id}/live").text
    assert re.findall(r'data-testid="adapter-name">([^<]*)<', live) == ["sql"]
    assert re.search(r'data-testid="adapter-held-by"><code>r-l</code><', live), live
    playground = client.get(f"/console/endpoints/{endpoint_id}/playground").text
    assert re.findall(r'<option value="([^"]*)"', playground.split('data-testid="pg-model"')[1])[
        :2
    ] == ["tiny-chat", "sql"]


def test_the_timeline_shows_the_gateways_stream_migrations(
    client: TestClient, plane: Server
) -> None:
    endpoint_id = create(client, sign_in(client))
    lost = "a stream's replica r-x was lost (connection_lost); continued on another"
    for _ in range(3):
        # What the server's gateway is built to call for each continued stream.
        plane.gateway._on_migration(endpoint_id, lost)
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    (event,) = re.findall(
        r'<li data-testid="scale-event" data-cause="migration">(.*?)</li>', page, re.S
    )
    text = html.unescape(event)
    assert "stream migrated" in text and lost in text and "(3 streams)" in text


def test_the_endpoint_page_lists_its_batches_with_their_progress(
    client: TestClient, plane: Server
) -> None:
    """Newest first, with status, counts and progress as the Batch API has
    them; another endpoint's batches are not on the page."""
    from inferd.control.batches.model import Capacity, RequestState, Result

    csrf = sign_in(client)
    endpoint_id, other_id = create(client, csrf, "batched"), create(client, csrf, "other")
    line = '{"custom_id": "q%d", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    content = "".join(line % i for i in range(4)).encode()

    async def make(on: str, client_name: str = "") -> str:
        # `running`: this plane's replicas never become ready, so the
        # leader's batch runner sends none of these requests (it would
        # otherwise record their failures beside the results written below).
        file = await plane.batches.upload(on, "in.jsonl", "batch", content)
        made = await plane.batches.create(
            on, file.id, "/v1/chat/completions", "24h", None, client_name, Capacity.RUNNING
        )
        return made.id

    first = asyncio.run(make(endpoint_id))
    second = asyncio.run(make(endpoint_id, "nightly-job"))
    elsewhere = asyncio.run(make(other_id))
    for idx, state in ((0, RequestState.DONE), (1, RequestState.DONE), (2, RequestState.FAILED)):
        result = Result(idx, state, "{}")
        assert asyncio.run(plane.batches.store.record_result(second, result, None))
    page = client.get(f"/console/endpoints/{endpoint_id}").text
    rows = re.findall(r'<tr data-testid="batch-row">(.*?)</tr>', page, re.S)
    assert [re.search(r"<code>(batch_\w+)</code>", r).group(1) for r in rows] == [second, first]  # type: ignore[union-attr]
    newest = rows[0]
    assert re.search(r'data-testid="batch-completed">2<', newest)
    assert re.search(r'data-testid="batch-failed">1<', newest)
    assert re.search(r'data-testid="batch-total">4<', newest)
    assert 'max="4" value="3"' in newest and "75%" in newest and "nightly-job" in newest
    assert "access token" in rows[1] and 'value="0"' in rows[1]
    assert elsewhere not in page
