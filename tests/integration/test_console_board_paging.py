"""The endpoints board over more endpoints than one page (in-process): the
store's keyset pages with next and previous as plain links, a filter by
name and status, a project member's pages holding only their project's
endpoints, and live updates confined to the page shown."""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from inferd.console.pages.board import PAGE_SIZE
from inferd.control.fakes import FakeLauncher
from inferd.control.model import StoreUnavailable
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from tests.console_support import ADMIN, seed_projects, sign_in

BASE = "http://testserver"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
PER_PROJECT = PAGE_SIZE + 10  # alpha alone spans two pages; everything, three


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Server]:
    settings = load_settings(
        env={}, overrides={"state_dir": tmp_path / "state", "admin_key": ADMIN, "public_url": BASE}
    )
    p = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    yield p
    asyncio.run(p.close())


@pytest.fixture
def client(plane: Server) -> Iterator[TestClient]:
    with TestClient(create_app(plane), base_url=BASE) as c:
        yield c


def create_many(client: TestClient) -> dict[str, str]:
    """Projects alpha and beta (tests/console_support.py) and their endpoints,
    interleaved so that every store page mixes the two; returns name -> id
    and, under each member's name, their key."""
    ids = seed_projects(client)
    for i in range(PER_PROJECT):
        for project in ("alpha", "beta"):
            name = f"{project[0]}-{i:03d}"
            answer = client.post("/inference/endpoints", headers=AUTH, json={
                "name": name, "modelName": "tiny-chat", "locationName": "local",
                "minReplicas": 0, "maxReplicas": 1, "projectId": project,
            })  # fmt: skip
            assert answer.status_code == 201, answer.text
            ids[name] = answer.json()["id"]
    return ids


def rows(page: str) -> list[str]:
    return re.findall(r'data-testid="row-([^"]+)"', page)


def flat(pages: list[list[str]]) -> list[str]:
    return [name for page in pages for name in page]


def link(page: str, test_id: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)"[^>]*data-testid="{test_id}"', page)
    return None if found is None else html.unescape(found.group(1))


def walk(client: TestClient, url: str) -> list[list[str]]:
    """Every page from `url` on, following the next links as a browser
    without scripts would; then back again by the previous links."""
    pages, text = [], client.get(url).text
    pages.append(rows(text))
    while (following := link(text, "page-next")) is not None:
        text = client.get(following).text
        pages.append(rows(text))
    back = [rows(text)]
    while (preceding := link(text, "page-previous")) is not None:
        text = client.get(preceding).text
        back.append(rows(text))
    assert back[::-1] == pages  # previous retraces next exactly
    return pages


def poll_state(page: str) -> dict[str, str]:
    vals = re.search(r"hx-vals='([^']+)'", page)
    assert vals, page
    return {k: str(v) for k, v in json.loads(html.unescape(vals.group(1))).items()}


def test_pages_filters_and_scopes_the_board(client: TestClient) -> None:
    ids = create_many(client)
    keys = {user: ids.pop(user) for user in ("vera", "olga")}
    sign_in(client)
    pages = walk(client, "/console/endpoints")
    assert [len(p) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 2 * PER_PROJECT - 2 * PAGE_SIZE]
    assert sorted(flat(pages)) == sorted(ids)  # each endpoint once, none missing
    assert flat(pages) == list(ids)  # in the order they were created

    # A filter by name (case as typed) and by status, each paged the same way.
    assert walk(client, "/console/endpoints?name=B-01") == [[f"b-01{i}" for i in range(10)]]
    client.patch(f"/inference/endpoints/{ids['a-042']}", headers=AUTH, json={"minReplicas": 1})
    assert walk(client, "/console/endpoints?status=pending") == [["a-042"]]
    idle = walk(client, "/console/endpoints?status=scaledToZero")
    assert sorted(flat(idle)) == sorted(set(ids) - {"a-042"})
    none = client.get("/console/endpoints", params={"name": "zz", "status": "running"}).text
    assert "No endpoint matches “zz” and status running" in none
    assert client.get("/console/endpoints", params={"status": "asleep"}).status_code == 400
    assert client.get("/console/endpoints", params={"page": "9.3"}).status_code == 400

    # A project's viewer: only alpha's endpoints, on every page.
    client.cookies.clear()
    sign_in(client, keys["vera"])
    alpha = walk(client, "/console/endpoints")
    assert [len(p) for p in alpha] == [PAGE_SIZE, PER_PROJECT - PAGE_SIZE]
    assert all(name.startswith("a-") for name in flat(alpha))
    assert walk(client, "/console/endpoints?name=b-") == [[]]


def test_the_board_fragment_carries_its_own_address(client: TestClient) -> None:
    create_many(client)
    sign_in(client)
    first = client.get("/console/endpoints/rows", params={"name": "a-"})
    assert first.headers["HX-Push-Url"] == "/console/endpoints?name=a-"
    following = link(first.text, "page-next")
    assert following is not None and following.startswith("/console/endpoints?name=a-&page=")
    second = client.get(following.replace("/console/endpoints?", "/console/endpoints/rows?"))
    assert second.headers["HX-Push-Url"] == following
    assert rows(second.text) == [f"a-{i:03d}" for i in range(PAGE_SIZE, PER_PROJECT)]


def test_live_updates_stay_on_the_page_shown(client: TestClient) -> None:
    ids = create_many(client)
    csrf = sign_in(client)
    first = client.get("/console/endpoints").text
    second_url = link(first, "page-next")
    assert second_url is not None
    second = client.get(second_url).text
    on_second = rows(second)
    state = poll_state(second)

    def change(name: str, max_replicas: int) -> None:
        answer = client.post(
            f"/console/endpoints/{ids[name]}/settings",
            data={"csrf": csrf, "minReplicas": "0", "maxReplicas": str(max_replicas)},
            follow_redirects=False,
        )
        assert answer.status_code == 303, answer.text

    change(rows(first)[0], 3)  # a row of page 1: nothing for page 2
    quiet = client.get("/console/endpoints/changes", params=state).text
    assert rows(quiet) == [] and "hx-swap-oob" not in quiet
    state = poll_state(quiet)
    change(on_second[5], 4)  # a row of page 2: that row alone, in place
    changed = client.get("/console/endpoints/changes", params=state).text
    assert rows(changed) == [on_second[5]] and "0 / 0 / 4" in changed
    assert 'id="board"' not in changed

    # The last page gains a row created meanwhile: the whole board is sent.
    third_url = link(second, "page-next")
    assert third_url is not None
    third = client.get(third_url).text
    state = poll_state(third)
    client.post("/inference/endpoints", headers=AUTH, json={
        "name": "late", "modelName": "tiny-chat", "locationName": "local", "projectId": "beta",
    })  # fmt: skip
    # Made through the API, not the console: the live board's sweep (about
    # once a second while browsers poll) finds it.
    deadline = time.monotonic() + 30
    while 'id="board"' not in (
        board := client.get("/console/endpoints/changes", params=state).text
    ):
        assert time.monotonic() < deadline, "the new endpoint never reached the page"
        state = poll_state(board)
        time.sleep(0.1)
    assert 'hx-swap-oob="true"' in board and rows(board) == [*rows(third), "late"]


def test_while_the_database_is_away_the_board_says_so(
    client: TestClient, plane: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_many(client)
    sign_in(client)

    async def unreachable(*args: object) -> None:
        raise StoreUnavailable("The database is unreachable.")

    monkeypatch.setattr(plane.store, "page_endpoint_ids", unreachable)
    away = client.get("/console/endpoints")
    assert away.status_code == 503 and "database is unavailable" in away.text
    # A page that fits this instance's copy is still answered from it.
    small = client.get("/console/endpoints", params={"name": "a-00"})
    assert small.status_code == 200 and rows(small.text) == [f"a-00{i}" for i in range(10)]


def test_the_board_filters_by_model_and_location(client: TestClient) -> None:
    """The board's model and location filters select exactly, combine with
    the others, and the options list only models the caller may know of."""
    made = {}
    for name, model, location in (
        ("chat-here", "tiny-chat", "local"),
        ("image-here", "tiny-sdxl", "local"),
        ("chat-east", "tiny-chat", "us-east"),
    ):
        answer = client.post("/inference/endpoints", headers=AUTH, json={
            "name": name, "modelName": model, "locationName": location,
            "gpuType": "cpu" if location == "local" else "H100-80GB",
            "minReplicas": 0, "maxReplicas": 1,
        })  # fmt: skip
        assert answer.status_code == 201, answer.text
        made[name] = answer.json()["id"]
    sign_in(client)
    assert walk(client, "/console/endpoints?model=tiny-sdxl") == [["image-here"]]
    assert walk(client, "/console/endpoints?location=us-east") == [["chat-east"]]
    both = "/console/endpoints?model=tiny-chat&location=local"
    assert walk(client, both) == [["chat-here"]]
    assert walk(client, "/console/endpoints?model=tiny-chat&name=chat-e") == [["chat-east"]]
    none = client.get("/console/endpoints", params={"model": "tiny-sdxl", "location": "us-east"})
    assert "No endpoint matches model tiny-sdxl and location us-east" in none.text
    page = client.get("/console/endpoints").text
    assert 'data-testid="model-filter"' in page and '<option value="tiny-sdxl">' in page
    assert '<option value="us-east">' in page
    too_long = client.get("/console/endpoints", params={"model": "m" * 300})
    assert too_long.status_code == 400
