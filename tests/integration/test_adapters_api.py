"""LoRA adapters on an endpoint, in-process: registration checked against the
base model, stored, listed, removed; `/v1/models` and an unknown adapter
through the gateway (answered there: no replica is woken for either)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings

ADMIN = "test-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Server]:
    settings = load_settings(
        env={},
        overrides={
            "state_dir": tmp_path / "state",
            "admin_key": ADMIN,
            "public_url": "http://inferd.test:8080",
        },
    )
    p = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    yield p
    asyncio.run(p.close())


@pytest.fixture
def client(plane: Server) -> Iterator[TestClient]:
    with TestClient(create_app(plane)) as c:
        c.headers.update(AUTH)
        yield c


def create(client: TestClient, name: str = "demo", **fields: Any) -> dict[str, Any]:
    body = {"name": name, "modelName": "tiny-chat", "minReplicas": 0, **fields}
    resp = client.post("/inference/endpoints", json=body)
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


def register(client: TestClient, endpoint_id: str, name: str, source: Path | str) -> Any:
    return client.post(
        f"/inference/endpoints/{endpoint_id}/adapters", json={"name": name, "source": str(source)}
    )


def error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body: dict[str, Any] = resp.json()["error"]
    return body


def test_register_list_get_remove(client: TestClient, tiny_lora_dir: Path) -> None:
    ep = create(client, engineSettings={"maxLoras": 2, "maxLoraRank": 16})
    assert ep["engineSettings"] == {"maxLoras": 2, "maxLoraRank": 16}
    path = f"/inference/endpoints/{ep['id']}/adapters"
    assert client.get(path).json() == {"data": []}

    created = register(client, ep["id"], "sql", tiny_lora_dir)
    assert created.status_code == 201, created.text
    record = created.json()
    assert record["name"] == "sql" and record["source"] == str(tiny_lora_dir)
    assert record["rank"] == 8 and record["baseModel"]  # PEFT wrote the base's path
    assert client.get(path).json() == {"data": [record]}
    assert client.get(f"{path}/sql").json() == record
    taken = error(register(client, ep["id"], "sql", tiny_lora_dir), 409)
    assert taken["code"] == "adapter_exists" and taken["param"] == "name"

    # Through the gateway, with the endpoint's token: the base and its adapter.
    token = {"Authorization": f"Bearer {ep['accessToken']}"}
    models = client.get(f"/endpoints/{ep['id']}/openai/v1/models", headers=token)
    assert models.status_code == 200, models.text
    cards = {card["id"]: card for card in models.json()["data"]}
    assert set(cards) == {"tiny-chat", "sql"}
    # Registered from a directory on the server: its root is its name, not the path.
    assert cards["sql"]["parent"] == "tiny-chat" and cards["sql"]["root"] == "sql"
    # An adapter nobody registered: 404 naming it, before any replica is asked for.
    chat = {"model": "poems", "messages": [{"role": "user", "content": "hi"}]}
    unknown = client.post(f"/endpoints/{ep['id']}/openai/v1/chat/completions", json=chat,
                          headers=token)  # fmt: skip
    body = error(unknown, 404)
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "'poems'" in body["message"] and "'sql'" in body["message"]

    assert client.delete(f"{path}/sql").status_code == 204
    assert error(client.delete(f"{path}/sql"), 404)["code"] == "adapter_not_found"
    assert client.get(path).json() == {"data": []}
    models = client.get(f"/endpoints/{ep['id']}/openai/v1/models", headers=token).json()
    assert [card["id"] for card in models["data"]] == ["tiny-chat"]


def test_adapters_survive_a_restart_and_go_with_their_endpoint(
    tmp_path: Path, tiny_lora_dir: Path
) -> None:
    settings = load_settings(
        env={}, overrides={"state_dir": tmp_path / "state", "admin_key": ADMIN}
    )
    first = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    with TestClient(create_app(first)) as client:
        client.headers.update(AUTH)
        ep = create(client, engineSettings={"maxLoras": 1})
        assert register(client, ep["id"], "sql", tiny_lora_dir).status_code == 201
    asyncio.run(first.close())
    second = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    try:
        with TestClient(create_app(second)) as client:
            client.headers.update(AUTH)
            listed = client.get(f"/inference/endpoints/{ep['id']}/adapters").json()["data"]
            assert [a["name"] for a in listed] == ["sql"]
            assert client.delete(f"/inference/endpoints/{ep['id']}").status_code == 204
            assert asyncio.run(second.store.list_adapters()) == []
    finally:
        asyncio.run(second.close())


def edited(tiny_lora_dir: Path, tmp_path: Path, **config: Any) -> Path:
    """A copy of the tiny adapter with its adapter_config.json changed."""
    copy = tmp_path / "edited"
    shutil.copytree(tiny_lora_dir, copy)
    path = copy / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return copy


def resized(tiny_lora_dir: Path, tmp_path: Path) -> Path:
    """A copy whose matrices are those of a wider model (hidden size 256)."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "wider"
    shutil.copytree(tiny_lora_dir, copy)
    tensors = load_file(str(copy / "adapter_model.safetensors"))
    wider = {
        name: t.new_zeros((t.shape[0], 256) if ".lora_A." in name else (256, t.shape[1]))
        for name, t in tensors.items()
    }
    save_file(wider, str(copy / "adapter_model.safetensors"))
    return copy


@pytest.mark.parametrize(
    ("case", "endpoint", "param", "code", "says"),
    [
        ("LoRA off", {}, "engineSettings.maxLoras", "lora_disabled", "runs without LoRA"),
        ("rank above maxLoraRank", {"maxLoras": 1, "maxLoraRank": 1}, "rank", "adapter_mismatch",
         "rank is 8, above the endpoint's engineSettings.maxLoraRank 1"),
        ("a module the base lacks", {"maxLoras": 1}, "targetModules", "adapter_mismatch",
         "'w_proj'"),
        ("another base's shapes", {"maxLoras": 1}, "architecture", "adapter_mismatch",
         "is 256x256, the base model"),
        ("not a LoRA adapter", {"maxLoras": 1}, "source", "adapter_mismatch", "IA3"),
        ("no such directory", {"maxLoras": 1}, "source", "invalid_source", "no such directory"),
        ("a relative path", {"maxLoras": 1}, "source", "invalid_source", "absolute directory"),
        ("the base's own name", {"maxLoras": 1}, "name", "adapter_name_is_base", "base model"),
    ],
)  # fmt: skip
def test_registration_refuses_what_cannot_serve_on_the_base(
    client: TestClient,
    tiny_lora_dir: Path,
    tmp_path: Path,
    case: str,
    endpoint: dict[str, Any],
    param: str,
    code: str,
    says: str,
) -> None:
    ep = create(client, engineSettings=endpoint)
    name, source = "sql", str(tiny_lora_dir)
    if case == "a module the base lacks":
        source = str(edited(tiny_lora_dir, tmp_path, target_modules=["q_proj", "w_proj"]))
    elif case == "another base's shapes":
        source = str(resized(tiny_lora_dir, tmp_path))
    elif case == "not a LoRA adapter":
        source = str(edited(tiny_lora_dir, tmp_path, peft_type="IA3"))
    elif case == "no such directory":
        source = str(tmp_path / "missing")
    elif case == "a relative path":
        source = "./adapters/sql"
    elif case == "the base's own name":
        name = "tiny-chat"
    body = error(register(client, ep["id"], name, source), 400)
    assert (body["param"], body["code"]) == (param, code), body
    assert says in body["message"], body["message"]
    assert client.get(f"/inference/endpoints/{ep['id']}/adapters").json() == {"data": []}


def test_lora_settings_are_checked_and_a_change_replaces_replicas(
    client: TestClient, plane: Server
) -> None:
    embed = {"name": "emb", "modelName": "tiny-embed", "engineSettings": {"maxLoras": 2}}
    refused = client.post("/inference/endpoints", json=embed)
    assert error(refused, 400)["param"] == "engineSettings.maxLoras"
    rank = {"name": "x", "modelName": "tiny-chat", "engineSettings": {"maxLoraRank": 12}}
    assert "maxLoraRank" in error(client.post("/inference/endpoints", json=rank), 400)["param"]
    ep = create(client)
    assert ep["engineSettings"] == {}
    generation = plane.service.row(ep["id"]).generation
    lora = {"engineSettings": {"maxLoras": 4}}
    patched = client.patch(f"/inference/endpoints/{ep['id']}", json=lora)
    assert patched.status_code == 200, patched.text
    assert patched.json()["engineSettings"] == {"maxLoras": 4}
    # The engines reserve LoRA room at start: the replicas are replaced.
    assert plane.service.row(ep["id"]).generation == generation + 1
