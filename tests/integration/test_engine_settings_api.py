"""An endpoint's engine settings through the management API, the store and
the reconciler, with the fake launcher: the record shows them, the replicas
are launched with them, and a PATCH that changes them rolls the replicas
(the old one serves until its replacement is ready)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from inferd.control.fakes import FakeLauncher
from inferd.replica.config import config_for, to_argv
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from inferd.testing import replica_report
from tests.support import eventually

ADMIN = "engine-settings-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def open_plane(tmp_path: Path, launcher: FakeLauncher) -> Server:
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": ADMIN})
    return asyncio.run(build(settings, launcher=launcher))


until = eventually


def ready(plane: Server, launcher: FakeLauncher, replica_id: str) -> None:
    secret = launcher.alive[replica_id].secret
    report = replica_report(
        replica_id, {"status": "ready", "url": f"http://127.0.0.1/{replica_id}"}
    )
    plane.registry.report(replica_id, secret, report)


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}
    return dict(body["error"])


def test_settings_reach_the_replicas_and_a_change_rolls_them(tmp_path: Path) -> None:
    launcher = FakeLauncher(slots=4)
    plane = open_plane(tmp_path, launcher)
    app = create_app(plane)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c,
        ):
            body = {
                "name": "tuned",
                "modelName": "tiny-chat",
                "minReplicas": 1,
                "engineSettings": {"maxModelLen": 1024, "maxNumSeqs": 8},
            }
            created = await c.post("/inference/endpoints", json=body)
            assert created.status_code == 201, created.text
            record = created.json()
            assert record["engineSettings"] == {"maxModelLen": 1024, "maxNumSeqs": 8}
            path = f"/inference/endpoints/{record['id']}"
            models = f"/endpoints/{record['id']}/openai/v1/models"
            bearer = {"Authorization": f"Bearer {record['accessToken']}"}
            (card,) = (await c.get(models, headers=bearer)).json()["data"]
            assert card["max_model_len"] == 1024  # as vLLM's server shows it
            await until(lambda: len(launcher.alive) == 1)
            (old,) = launcher.alive
            spec = launcher.alive[old]
            assert spec.engine_settings.given() == {"maxModelLen": 1024, "maxNumSeqs": 8}
            argv = to_argv(config_for(spec, plane.settings.replicas))
            assert argv[argv.index("--engine-settings") + 1] == (
                '{"maxModelLen":1024,"maxNumSeqs":8}'
            )
            ready(plane, launcher, old)

            # A setting the model cannot run with changes nothing.
            refused = await c.patch(path, json={"engineSettings": {"maxModelLen": 4096}})
            assert error_of(refused)["param"] == "engineSettings.maxModelLen"
            # Scaling alone restarts nothing; the same settings again neither.
            same = {"maxReplicas": 2, "engineSettings": {"maxNumSeqs": 8}}
            assert (await c.patch(path, json=same)).status_code == 200
            await plane.reconciler.tick()
            assert list(launcher.alive) == [old] and launcher.stopping == set()

            changed = await c.patch(
                path, json={"engineSettings": {"maxNumSeqs": 4, "maxModelLen": None}}
            )
            assert changed.status_code == 200, changed.text
            assert changed.json()["engineSettings"] == {"maxNumSeqs": 4}
            await until(lambda: len(launcher.alive) == 2)
            (new,) = set(launcher.alive) - {old}
            assert launcher.alive[new].engine_settings.given() == {"maxNumSeqs": 4}
            # The old replica serves until its replacement is ready.
            await plane.reconciler.tick()
            assert launcher.stopping == set()
            assert (await c.get(path)).json()["status"] == "updating"
            ready(plane, launcher, new)
            await plane.reconciler.tick()
            assert launcher.stopping == {old}

            stored = await plane.store.get_endpoint(record["id"])
            assert stored is not None and stored.engine_settings.given() == {"maxNumSeqs": 4}
            assert (await c.get(path)).json()["engineSettings"] == {"maxNumSeqs": 4}
            (card,) = (await c.get(models, headers=bearer)).json()["data"]
            assert "max_model_len" not in card  # the model's own again
            audit = await c.get(
                "/inference/projects/default/audit", params={"action": "endpoint.update"}
            )
            changes = [e for e in audit.json()["data"] if "engineSettings" in json.dumps(e)]
            assert '"maxModelLen": null' in json.dumps(changes[-1])  # the clearing is told

    asyncio.run(scenario())


def test_creates_with_settings_the_model_cannot_run_are_400s_naming_the_field(
    tmp_path: Path,
) -> None:
    plane = open_plane(tmp_path, FakeLauncher())
    app = create_app(plane)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c,
        ):
            cases = [
                ("tiny-chat", {"maxModelLen": 100_000}, "engineSettings.maxModelLen"),
                ("tiny-chat", {"quantization": "gptq"}, "engineSettings.quantization"),
                ("tiny-chat", {"speculativeDecoding": {"draftModel": "tiny-qwen3-embed",
                                                       "numSpeculativeTokens": 2}},
                 "engineSettings.speculativeDecoding.draftModel"),
                ("tiny-sdxl", {"maxNumSeqs": 2}, "engineSettings"),
                # vLLM's CPU build has no FP8 weight kernels: a CPU replica could not start.
                ("tiny-chat", {"quantization": "fp8"}, "engineSettings.quantization"),
                ("tiny-chat", {"maxModelLen": "long"}, "engineSettings.maxModelLen"),
            ]  # fmt: skip
            for model, value, param in cases:
                answer = await c.post(
                    "/inference/endpoints",
                    json={"name": "bad", "modelName": model, "engineSettings": value},
                )
                assert error_of(answer)["param"] == param, (model, value)
            assert await plane.store.list_endpoints() == []

    asyncio.run(scenario())


def test_recommendations_and_placement_size_the_model_with_the_settings(tmp_path: Path) -> None:
    plane = open_plane(tmp_path, FakeLauncher())
    app = create_app(plane)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c,
        ):
            url = "/inference/recommendations?modelName=llama-3.1-70b-instruct&locationName=us-east"
            plain = (await c.get(url)).json()
            fp8 = (await c.get(url + "&quantization=fp8&kvCacheDtype=fp8")).json()

            def h200(answer: dict[str, Any]) -> dict[str, Any]:
                every = answer["options"] + answer["rejected"]
                return next(o for o in every if (o["gpuType"], o["gpuCount"]) == ("H200", 1))

            assert not h200(plain)["fits"] and h200(fp8)["fits"]
            assert h200(fp8)["memoryNeededGb"] < h200(plain)["memoryNeededGb"]
            too_long = await c.get(url + "&maxModelLen=200000")
            assert error_of(too_long)["param"] == "maxModelLen"
            not_a_number = await c.get(url + "&maxNumSeqs=many")
            assert error_of(not_a_number)["param"] == "maxNumSeqs"
            # An embedding load, sized with a shorter context.
            embed = "/inference/recommendations?modelName=bge-base-en-v1.5&locationName=us-east"
            load = "&requestsPerSecond=50&promptTokens=256&inputsPerRequest=4&maxModelLen=256"
            sized = await c.get(embed + load)
            assert sized.status_code == 200, sized.text

            # A create is placed with its settings, and a change of settings
            # that no longer fits its GPUs is refused naming them.
            created = await c.post(
                "/inference/endpoints",
                json={"name": "big", "modelName": "llama-3.1-70b-instruct",
                      "locationName": "us-east", "gpuType": "H200", "gpuCount": 1,
                      "minReplicas": 0, "engineSettings": {"quantization": "fp8"}},
            )  # fmt: skip
            assert created.status_code == 201, created.text
            path = f"/inference/endpoints/{created.json()['id']}"
            unquantized = await c.patch(path, json={"engineSettings": {"quantization": None}})
            error = error_of(unquantized)
            assert error["param"] == "engineSettings" and error["code"] == "model_does_not_fit"
            assert (await c.get(path)).json()["engineSettings"] == {"quantization": "fp8"}

    asyncio.run(scenario())


def test_the_console_shows_an_endpoints_engine_settings(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from tests.console_support import sign_in

    plane = open_plane(tmp_path, FakeLauncher())
    with TestClient(create_app(plane), base_url="http://127.0.0.1") as client:
        ids = {}
        for name, settings in (("tuned", {"maxModelLen": 512, "enablePrefixCaching": False}),
                               ("plain", None)):  # fmt: skip
            body = {"name": name, "modelName": "tiny-chat", "minReplicas": 0}
            answer = client.post(
                "/inference/endpoints", headers=AUTH,
                json={**body, **({"engineSettings": settings} if settings else {})},
            )  # fmt: skip
            ids[name] = answer.json()["id"]
        sign_in(client, ADMIN)
        tuned = client.get(f"/console/endpoints/{ids['tuned']}").text
        assert "maxModelLen <code>512</code> · enablePrefixCaching <code>false</code>" in tuned
        plain = client.get(f"/console/endpoints/{ids['plain']}").text
        assert 'data-testid="engine-settings">the server\'s defaults</dd>' in plain
