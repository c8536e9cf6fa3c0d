"""Admin key provisioning and the deletion hook that issue 4's drain plugs into."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from inferd.control.endpoints.tokens import ADMIN_KEY_PREFIX, hash_token, is_well_formed
from inferd.control.fakes import FakeLauncher
from inferd.control.model import parse_rfc3339
from inferd.control.stores.sql.store import SqliteStore
from inferd.server.app import create_app
from inferd.server.auth import AdminKeyError, provision_admin_key
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from tests.support import eventually

ADMIN = "lifecycle-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore.open(tmp_path / "inferd.db")
    yield s
    asyncio.run(s.close())


# --- admin key -------------------------------------------------------------------------


def test_generated_once_then_reused(store: SqliteStore) -> None:
    first = asyncio.run(provision_admin_key(store, None))
    assert first.generated_key is not None
    assert is_well_formed(first.generated_key, ADMIN_KEY_PREFIX)
    assert asyncio.run(store.admin_key_hashes()) == [hash_token(first.generated_key)]
    again = asyncio.run(provision_admin_key(store, None))
    assert again.generated_key is None  # not generated (nor printed) a second time
    assert again.auth.is_valid(first.generated_key)


def test_rotation_revokes_the_old_key(store: SqliteStore) -> None:
    old = asyncio.run(provision_admin_key(store, None)).generated_key
    assert old is not None
    rotated = asyncio.run(provision_admin_key(store, None, rotate=True))
    assert rotated.generated_key is not None and rotated.generated_key != old
    assert rotated.auth.is_valid(rotated.generated_key)
    assert not rotated.auth.is_valid(old)


def test_operator_key_is_used_and_not_stored(store: SqliteStore) -> None:
    provisioned = asyncio.run(provision_admin_key(store, ADMIN))
    assert provisioned.generated_key is None
    assert provisioned.auth.is_valid(ADMIN)
    assert asyncio.run(store.admin_key_hashes()) == []
    with pytest.raises(AdminKeyError):
        asyncio.run(provision_admin_key(store, "short"))


# --- deletion ----------------------------------------------------------------------------


def open_plane(tmp_path: Path, launcher: FakeLauncher | None = None) -> Server:
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": ADMIN})
    if launcher is None:
        return asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    return asyncio.run(build(settings, launcher=launcher))


until = eventually


def test_delete_waits_for_the_replicas_to_end(tmp_path: Path) -> None:
    launcher = FakeLauncher(slots=2)
    plane = open_plane(tmp_path, launcher)
    app = create_app(plane)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c,
        ):
            created = await c.post(
                "/inference/endpoints",
                json={"name": "demo", "modelName": "tiny-chat", "minReplicas": 1},
            )
            endpoint_id, token = created.json()["id"], created.json()["accessToken"]
            # Creating it woke the reconciler: a replica starts at once.
            await until(lambda: len(launcher.alive) == 1)
            (replica_id,) = launcher.alive
            path = f"/inference/endpoints/{endpoint_id}"
            deleting = asyncio.create_task(c.delete(path))
            await until(lambda: replica_id in launcher.stopping)
            # While draining: visible as deleting, closed to change, token dead.
            record = (await c.get(path)).json()
            assert record["status"] == "deleting"
            assert not plane.verifier.verify(endpoint_id, token)
            patch = await c.patch(path, json={"maxReplicas": 1})
            assert patch.status_code == 409
            assert patch.json()["error"]["code"] == "endpoint_deleting"
            reissue = await c.post(path + "/access-token")
            assert reissue.status_code == 409
            assert not deleting.done()  # its replica is still draining
            launcher.exit(replica_id, 0)  # drained and ended
            assert (await deleting).status_code == 204
            assert (await c.get(path)).status_code == 404
            assert await plane.store.list_replicas() == []

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(plane.close())


def test_deletion_interrupted_by_a_crash_finishes_on_start(tmp_path: Path) -> None:
    plane = open_plane(tmp_path)
    with TestClient(create_app(plane)) as c:
        created = c.post(
            "/inference/endpoints", json={"name": "demo", "modelName": "tiny-chat"}, headers=AUTH
        ).json()
    # The process died after marking the endpoint deleting, before removing it.
    asyncio.run(plane.store.mark_deleting(created["id"], parse_rfc3339("2025-01-01T00:00:00.000Z")))
    asyncio.run(plane.close())

    plane = open_plane(tmp_path)
    try:
        assert not plane.verifier.verify(created["id"], created["accessToken"])
        with TestClient(create_app(plane)) as c:  # the lifespan finishes the deletion
            assert c.get(f"/inference/endpoints/{created['id']}", headers=AUTH).status_code == 404
        assert asyncio.run(plane.store.get_endpoint(created["id"])) is None
    finally:
        asyncio.run(plane.close())
