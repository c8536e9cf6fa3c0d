"""Deleting an endpoint whose replicas serve launches nothing for it.

The reconciler's copy of the endpoints follows the store's change feed, so
for a moment after DELETE marks the row deleting that copy still shows it
live while the drain has already taken its replicas out of routing: a pass
in that moment saw a serving endpoint with no replica and launched one
(killed at once: a GPU taken, a process started, for nothing). The whole
server (store, change feed, reconciler, service) runs here against the fake
launcher, many times, and every launch is counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from inferd.testing import replica_report

ADMIN = "delete-loop-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
ROUNDS = 25


async def until(condition: Callable[[], bool], within_s: float = 30.0) -> None:
    """The store's writes run in threads: wait on the clock, not on loop turns."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.001)


def serve(plane: Server, launcher: FakeLauncher, replica_id: str) -> None:
    """The replica says it is ready (as its reporter would)."""
    plane.registry.report(
        replica_id,
        launcher.alive[replica_id].secret,
        replica_report(replica_id, {"status": "ready", "url": f"http://127.0.0.1/{replica_id}"}),
    )


@pytest.mark.parametrize("drains_on_stop", [True, False], ids=["ends-at-once", "ends-later"])
def test_deleting_serving_endpoints_launches_no_replica(
    tmp_path: Path, drains_on_stop: bool
) -> None:
    launcher = FakeLauncher(slots=4, drains_on_stop=drains_on_stop)
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": ADMIN})
    plane = asyncio.run(build(settings, launcher=launcher))
    app = create_app(plane)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c,
        ):
            after_delete = 0
            for round_ in range(ROUNDS):
                created = await c.post(
                    "/inference/endpoints",
                    json={"name": f"busy-{round_}", "modelName": "tiny-chat", "minReplicas": 2},
                )
                assert created.status_code == 201, created.text
                endpoint_id = created.json()["id"]
                await until(lambda: len(launcher.alive) == 2)
                for replica_id in list(launcher.alive):
                    serve(plane, launcher, replica_id)
                launched = len(launcher.launched)
                deleting = asyncio.create_task(c.delete(f"/inference/endpoints/{endpoint_id}"))
                if not drains_on_stop:
                    # Each replica drains, then ends, while the delete waits.
                    await until(lambda: launcher.stopping == set(launcher.alive) != set())
                    for replica_id in list(launcher.alive):
                        await asyncio.sleep(0)
                        launcher.exit(replica_id, 0)
                assert (await deleting).status_code == 204
                # The loop goes on a while after the delete: late launches count too.
                await asyncio.sleep(0.05)
                after_delete += len(launcher.launched) - launched
                assert launcher.alive == {}
            assert after_delete == 0, f"{after_delete} replica(s) launched for deleted endpoints"

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(plane.close())
