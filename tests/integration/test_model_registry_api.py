"""Registering models through the management API: a local directory and a
prepared Hugging Face cache (no network here), checked against vLLM's real
model registry and diffusers' pipelines; endpoints from a registered model;
DELETE refused while one uses it; registrations and profiles survive a
restart; recommendations for a workload use a measured profile."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import Settings, load_settings

ADMIN = "test-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(env={}, overrides={"state_dir": tmp_path / "state", "admin_key": ADMIN})


@pytest.fixture
def client(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    with TestClient(create_app(plane)) as c:
        c.headers.update(AUTH)
        yield c
    asyncio.run(plane.close())


def _hub_cache(root: Path, repo_id: str, source_dir: Path) -> Path:
    """`source_dir`'s description files as a huggingface_hub cache entry."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for name in ("config.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source_dir / name, snapshot / name)
    return root


def test_register_a_directory_use_it_and_delete_it(
    client: TestClient, settings: Settings, tiny_chat_dir: Path
) -> None:
    resp = client.post("/inference/models", json={"source": str(tiny_chat_dir), "name": "my-tiny"})
    assert resp.status_code == 201, resp.text
    model = resp.json()
    assert model["registered"] is True and model["projectId"] is None
    assert model["kind"] == "chat" and model["architectureClass"] == "LlamaForCausalLM"
    arch = model["architecture"]
    assert (arch["layers"], arch["kvHeads"], arch["headDim"], arch["dtype"]) == (2, 1, 64, "fp32")
    assert model["chatTemplate"] == "chat_template.jinja"
    assert client.get("/inference/models/my-tiny").json() == model
    assert "my-tiny" in [m["name"] for m in client.get("/inference/models").json()["data"]]

    # Taken name, unknown class, no such directory: clear 4xx answers.
    again = client.post("/inference/models", json={"source": str(tiny_chat_dir), "name": "my-tiny"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "model_name_taken"

    endpoint = client.post(
        "/inference/endpoints",
        json={"name": "uses-tiny", "modelName": "my-tiny", "locationName": "local"},
    )
    assert endpoint.status_code == 201, endpoint.text
    assert endpoint.json()["gpuType"] == "cpu"
    refused = client.delete("/inference/models/my-tiny")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "model_in_use"
    assert "uses-tiny" in refused.json()["error"]["message"]
    assert client.delete(f"/inference/endpoints/{endpoint.json()['id']}").status_code == 204
    # A draft model of speculative decoding is in use too.
    drafting = client.post(
        "/inference/endpoints",
        json={"name": "drafts-with-tiny", "modelName": "tiny-chat", "locationName": "local",
              "engineSettings": {"speculativeDecoding": {"draftModel": "my-tiny",
                                                         "numSpeculativeTokens": 2}}},
    )  # fmt: skip
    assert drafting.status_code == 201, drafting.text
    refused = client.delete("/inference/models/my-tiny")
    assert refused.status_code == 409 and "drafts-with-tiny" in refused.json()["error"]["message"]
    assert client.delete(f"/inference/endpoints/{drafting.json()['id']}").status_code == 204
    assert client.delete("/inference/models/my-tiny").status_code == 204
    assert client.get("/inference/models/my-tiny").status_code == 404
    catalog = client.delete("/inference/models/tiny-chat")
    assert catalog.status_code == 409 and catalog.json()["error"]["code"] == "catalog_model"


def test_register_from_the_hugging_face_cache_and_survive_a_restart(
    settings: Settings, tiny_chat_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = _hub_cache(tmp_path / "hub", "acme/Tiny-Chat-1B", tiny_chat_dir)
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    plane.models.hf_cache_dir = cache
    with TestClient(create_app(plane)) as c:
        c.headers.update(AUTH)
        resp = c.post("/inference/models", json={"source": "acme/Tiny-Chat-1B"})
        assert resp.status_code == 201, resp.text
        assert resp.json()["name"] == "tiny-chat-1b"
        assert resp.json()["source"] == "acme/Tiny-Chat-1B"
        missing = c.post("/inference/models", json={"source": "acme/Not-Cached"})
        assert missing.status_code == 400
        assert missing.json()["error"]["param"] == "source"
        assert "local Hugging Face cache" in missing.json()["error"]["message"]
        profile = {
            "gpuType": "H100-80GB", "gpuCount": 1, "promptTokens": 100, "outputTokens": 50,
            "points": [{"concurrency": 4, "requests": 8, "outputTokensPerS": 400.0,
                        "ttftP95S": 0.05, "tpotP95S": 0.01}],
        }  # fmt: skip
        assert c.post("/inference/models/tiny-chat-1b/profiles", json=profile).status_code == 201
    asyncio.run(plane.close())

    reopened = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    with TestClient(create_app(reopened)) as c:
        c.headers.update(AUTH)
        assert c.get("/inference/models/tiny-chat-1b").json()["registered"] is True
        rec = c.get(
            "/inference/recommendations",
            params={"modelName": "tiny-chat-1b", "locationName": "us-east",
                    "requestsPerSecond": 20, "promptTokens": 100, "outputTokens": 50,
                    "ttftP95Ms": 500, "tpotP95Ms": 50},
        )  # fmt: skip
        assert rec.status_code == 200, rec.text
        options = {(o["gpuType"], o["gpuCount"]): o for o in rec.json()["options"]}
        measured = options[("H100-80GB", 1)]
        assert measured["basis"].startswith("measured on 1 x H100-80GB, ")
        # The model refitted to the measured point sizes the option (any batch).
        assert measured["basis"].endswith("model refitted to 2 measured points")
        assert "refitted to 2 measured points" in measured["evidence"]
        assert measured["errorBand"] is not None
        assert 0.8 * measured["requestsPerS"] * measured["replicas"] >= 20
        assert options[("L4", 1)]["basis"] == "estimated"
    asyncio.run(reopened.close())


def test_unsupported_and_malformed_models_are_refused(
    client: TestClient, tmp_path: Path, tiny_chat_dir: Path
) -> None:
    bert = tmp_path / "bert"
    bert.mkdir()
    config = json.loads((tiny_chat_dir / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelX"]}))
    shutil.copy(tiny_chat_dir / "chat_template.jinja", bert / "chat_template.jinja")
    cases = [
        ({"source": str(bert)}, "not in vLLM's model registry"),
        ({"source": str(tmp_path / "absent")}, "does not exist"),
        ({"source": "no spaces allowed/x y"}, "neither"),
        ({"source": str(tiny_chat_dir), "revision": "main"}, "not a directory"),
    ]
    for body, message in cases:
        resp = client.post("/inference/models", json=body)
        assert resp.status_code == 400, body
        error = resp.json()["error"]
        assert error["code"] == "model_not_supported" and message in error["message"], error
    unknown_field = client.post("/inference/models", json={"source": "a/b", "sauce": 1})
    assert unknown_field.status_code == 400
    no_key = client.post("/inference/models", json={"source": "a/b"}, headers={"Authorization": ""})
    assert no_key.status_code == 401


def test_register_a_diffusers_pipeline(client: TestClient, tiny_sdxl_dir: Path) -> None:
    resp = client.post("/inference/models", json={"source": str(tiny_sdxl_dir), "name": "my-sdxl"})
    assert resp.status_code == 201, resp.text
    model = resp.json()
    assert model["kind"] == "image" and model["architectureClass"] == "StableDiffusionXLPipeline"
    assert model["architecture"]["components"]["unet"] > 0
    rec = client.get(
        "/inference/recommendations",
        params={"modelName": "my-sdxl", "locationName": "us-east", "imagesPerMinute": 10,
                "secondsPerImageP95": 5},
    )  # fmt: skip
    assert rec.status_code == 200 and rec.json()["best"]["costPerImage"] > 0


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"requestsPerSecond": "x", "promptTokens": 1, "outputTokens": 1}, "requestsPerSecond"),
        ({"requestsPerSecond": 1, "outputTokens": 1}, "promptTokens"),
        ({"imagesPerMinute": 1}, "imagesPerMinute"),
        ({"requestsPerSecond": -1, "promptTokens": 1, "outputTokens": 1}, "requestsPerSecond"),
    ],
)
def test_bad_workload_queries(client: TestClient, params: dict[str, object], param: str) -> None:
    resp = client.get(
        "/inference/recommendations", params={"modelName": "llama-3.1-8b-instruct", **params}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param
