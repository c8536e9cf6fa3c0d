"""Usage and cost of a real `inferd serve` (fake-engine replica processes,
SQLite), read with a user's management key: N requests of K tokens are
counted as N and N*K, replica-seconds follow the wall clock (within 2 s),
cost is priced from the price table, and the figures survive a restart."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferd.testing import ServeHandle

N_REQUESTS, K_TOKENS = 6, 5
PRICE_PER_HOUR = 36.0  # cpu in 'local': 0.01 per replica-second


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeHandle]:
    configs = tmp_path / "configs"
    shutil.copytree(Path(__file__).parents[2] / "configs", configs)
    locations = yaml.safe_load((configs / "locations.yaml").read_text())
    for location in locations["locations"]:
        if location["name"] == "local":
            location["offers"]["cpu"] = PRICE_PER_HOUR
    (configs / "locations.yaml").write_text(yaml.safe_dump(locations))
    handle = ServeHandle(
        tmp_path / "serve",
        settings={
            "replica_args": "--engine fake --engine-arg token_delay_s=0",
            "health_period_seconds": "0.5",
            "reconcile_period_seconds": "0.2",
            "configs_dir": str(configs),
        },
    )
    try:
        yield handle.start()
    finally:
        handle.cleanup()


def usage(serve: ServeHandle, key: str, endpoint_id: str) -> dict[str, Any]:
    response = httpx.get(
        f"{serve.url}/inference/endpoints/{endpoint_id}/usage",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_usage_against_a_known_load(serve: ServeHandle) -> None:
    with serve.api() as operator:
        assert operator.post("/inference/projects", json={"id": "team"}).status_code == 201
        added = operator.put("/inference/projects/team/members/dev", json={"role": "developer"})
        key = added.json()["createdKey"]["key"]
    user = {"Authorization": f"Bearer {key}"}
    started = time.monotonic()
    created = httpx.post(
        f"{serve.url}/inference/endpoints",
        json={"name": "metered", "modelName": "tiny-chat", "minReplicas": 1, "maxReplicas": 1},
        headers=user,
        timeout=30,
    ).json()
    endpoint_id = created["id"]
    serve.wait_record(endpoint_id, lambda r: r["status"] == "running", timeout=60)

    prompt_tokens = 0
    for _ in range(N_REQUESTS):
        answer = httpx.post(
            created["url"] + "/openai/v1/chat/completions",
            json={
                "model": "tiny-chat",
                "max_tokens": K_TOKENS,
                "messages": [{"role": "user", "content": "count with me"}],
            },
            headers={"Authorization": f"Bearer {created['accessToken']}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == K_TOKENS
        prompt_tokens += answer.json()["usage"]["prompt_tokens"]

    # Counters arrive with the replica's next reports (every 0.5 s).
    deadline = time.monotonic() + 10
    body = usage(serve, key, endpoint_id)
    while body["totals"]["requests"] < N_REQUESTS and time.monotonic() < deadline:
        time.sleep(0.2)
        body = usage(serve, key, endpoint_id)
    wall = time.monotonic() - started
    totals = body["totals"]
    assert totals["requests"] == N_REQUESTS
    assert totals["completionTokens"] == N_REQUESTS * K_TOKENS
    assert totals["promptTokens"] == prompt_tokens
    assert wall - 2 <= totals["replicaSeconds"] <= wall + 0.5, (totals, wall)
    assert body["currency"] and body["data"][0]["gpuType"] == "cpu"
    assert body["data"][0]["gpuCount"] == 1
    assert totals["cost"] == pytest.approx(
        totals["replicaSeconds"] * PRICE_PER_HOUR / 3600, rel=0.01
    )
    # The record's costSoFar: this month's cost, from the same figures.
    record = httpx.get(f"{serve.url}/inference/endpoints/{endpoint_id}", headers=user).json()
    assert record["costSoFar"] >= totals["cost"] - 0.01
    # The project's usage holds the endpoint's.
    project = httpx.get(f"{serve.url}/inference/projects/team/usage", headers=user).json()
    assert project["totals"]["requests"] == N_REQUESTS

    # A restart keeps the figures (written at shutdown, read back from SQLite).
    before = usage(serve, key, endpoint_id)["totals"]
    serve.stop()
    serve.start()
    after = usage(serve, key, endpoint_id)["totals"]
    assert after["requests"] == N_REQUESTS
    assert after["completionTokens"] == N_REQUESTS * K_TOKENS
    assert after["replicaSeconds"] >= before["replicaSeconds"] - 0.01
    # Another project's member sees none of it.
    with serve.api() as operator:
        operator.post("/inference/projects", json={"id": "other"})
        other = operator.put("/inference/projects/other/members/eve", json={"role": "admin"})
    eve = other.json()["createdKey"]["key"]
    response = httpx.get(f"{serve.url}/inference/endpoints/{endpoint_id}/usage",
                         headers={"Authorization": f"Bearer {eve}"})  # fmt: skip
    assert response.status_code == 404
