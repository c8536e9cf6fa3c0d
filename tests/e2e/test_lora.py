"""LoRA adapters end to end through `inferd serve`: registered on a running
endpoint without restarting a replica, picked by the request's `model`,
loaded on demand, routed to the replica that holds them.

The control plane's part (routing, reports, no restarts) runs on fake
engines in real replica processes; one test runs the real thing on vLLM
(CPU LoRA kernels) with tiny random PEFT adapters of tiny-chat.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.catalog.tiny_lora import ensure_tiny_lora
from inferd.testing import ServeHandle
from tests.support import needs

SETTINGS = {
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "replica_drain_timeout_seconds": "20",
}


def serving(handle: ServeHandle) -> Iterator[ServeHandle]:
    handle.start()
    try:
        yield handle
    finally:
        handle.cleanup()
        assert handle.launched_pids() == []


def replica_ids(record: dict[str, Any]) -> set[str]:
    return {r["id"] for r in record["replicas"]}


def holders(record: dict[str, Any], adapter: str) -> set[str]:
    return {r["id"] for r in record["replicas"] if adapter in r["adapters"]}


def chat(url: str, token: str, model: str, content: str = "Hello there") -> httpx.Response:
    return httpx.post(
        f"{url}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=300,
    )


@pytest.fixture
def fake_serve(tmp_path: Path) -> Iterator[ServeHandle]:
    settings = {**SETTINGS, "replica_args": "--engine fake"}
    yield from serving(ServeHandle(tmp_path, settings=settings))


@needs("peft")
def test_adapters_come_and_go_without_a_restart_and_stick_to_a_replica(
    fake_serve: ServeHandle, tiny_chat_dir: Path, tiny_lora_dir: Path
) -> None:
    serve = fake_serve
    created = serve.create_endpoint(
        name="tuned", modelName="tiny-chat", minReplicas=2, maxReplicas=2,
        engineSettings={"maxLoras": 2},
    )  # fmt: skip
    endpoint_id, token, url = created["id"], created["accessToken"], created["url"]
    running = serve.wait_record(
        endpoint_id, lambda r: r["status"] == "running" and len(r["replicas"]) == 2
    )
    replicas = replica_ids(running)
    other = ensure_tiny_lora(tiny_chat_dir, rank=8, seed=2)
    with serve.api() as api:
        for name, source in (("sql", tiny_lora_dir), ("poems", other)):
            answer = api.post(f"/inference/endpoints/{endpoint_id}/adapters",
                              json={"name": name, "source": str(source)})  # fmt: skip
            assert answer.status_code == 201, answer.text

    base = chat(url, token, "tiny-chat")
    sql = chat(url, token, "sql")
    assert base.status_code == sql.status_code == 200, (base.text, sql.text)
    assert sql.json()["model"] == "sql"
    assert sql.json()["choices"][0]["message"] != base.json()["choices"][0]["message"]
    # The replica that loaded it says so; every later request naming it goes
    # there (the other replica never loads it).
    record = serve.wait_record(endpoint_id, lambda r: len(holders(r, "sql")) == 1)
    (holder,) = holders(record, "sql")
    for _ in range(6):
        assert chat(url, token, "sql").status_code == 200
    record = serve.record(endpoint_id)
    assert holders(record, "sql") == {holder}
    assert replica_ids(record) == replicas  # registering restarted nothing

    # Usage per adapter: the hourly record and the Prometheus counters.
    def served(name: str) -> int:
        with serve.api() as api:
            rows = api.get(f"/inference/endpoints/{endpoint_id}/adapters/{name}/usage").json()
        return sum(row["requests"] for row in rows["data"])

    deadline = time.monotonic() + 30
    while served("sql") < 7 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served("sql") == 7 and served("poems") == 0
    metrics = httpx.get(f"{serve.url}/metrics", timeout=30).text
    assert f'inferd_adapter_requests_total{{adapter="sql",endpoint="{endpoint_id}"}} 7.0' in metrics

    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{endpoint_id}/adapters/sql").status_code == 204
    gone = chat(url, token, "sql")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert chat(url, token, "poems").status_code == 200
    assert replica_ids(serve.record(endpoint_id)) == replicas  # nor did removing one
    assert served("sql") == 7  # usage outlives the adapter


@pytest.fixture
def vllm_serve(tmp_path: Path) -> Iterator[ServeHandle]:
    settings = {
        **SETTINGS,
        "replica_args": "--cpu-kv-cache-gib 1",
        "gateway_hold_timeout_seconds": "600",
    }
    yield from serving(ServeHandle(tmp_path, settings=settings))


@pytest.mark.slow
@needs("vllm", "peft")
def test_lora_adapters_on_vllm(
    vllm_serve: ServeHandle, tiny_chat_dir: Path, tiny_lora_dir: Path
) -> None:
    """vLLM's CPU LoRA kernels, adapters loaded at run time: each adapter
    changes the output, the least recently used is evicted past maxLoras,
    completions (vLLM's own serving code) take adapters too."""
    serve = vllm_serve
    created = serve.create_endpoint(
        name="tuned", modelName="tiny-chat", minReplicas=1, maxReplicas=1,
        engineSettings={"maxLoras": 2, "maxLoraRank": 8},
    )  # fmt: skip
    endpoint_id, token, url = created["id"], created["accessToken"], created["url"]
    sources = {
        "sql": tiny_lora_dir,
        "poems": ensure_tiny_lora(tiny_chat_dir, rank=8, seed=2),
        "legal": ensure_tiny_lora(tiny_chat_dir, rank=8, seed=3),
    }
    base = chat(url, token, "tiny-chat")  # held while vLLM starts
    assert base.status_code == 200, base.text
    (replica,) = replica_ids(serve.record(endpoint_id))
    with serve.api() as api:
        for name, source in sources.items():
            answer = api.post(f"/inference/endpoints/{endpoint_id}/adapters",
                              json={"name": name, "source": str(source)})  # fmt: skip
            assert answer.status_code == 201, answer.text

    texts = {"tiny-chat": base.json()["choices"][0]["message"]["content"]}
    for name in sources:
        answer = chat(url, token, name)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == name
        texts[name] = answer.json()["choices"][0]["message"]["content"]
    # Greedy decoding: each adapter's weights, and only they, change the text.
    assert len(set(texts.values())) == len(texts), texts
    assert chat(url, token, "sql").json()["choices"][0]["message"]["content"] == texts["sql"]

    # Three adapters, two slots: vLLM evicted the least recently used (poems).
    record = serve.wait_record(
        endpoint_id, lambda r: r["replicas"] and r["replicas"][0]["adapters"] == ["legal", "sql"]
    )
    assert replica_ids(record) == {replica}  # no replica was restarted

    completion = httpx.post(
        f"{url}/openai/v1/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={"model": "poems", "prompt": "Once upon", "max_tokens": 4, "temperature": 0},
        timeout=300,
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["model"] == "poems"
    # Metered per adapter: poems answered one chat and one completion.
    usage_path = f"/inference/endpoints/{endpoint_id}/adapters/poems/usage"
    deadline = time.monotonic() + 30
    with serve.api() as api:
        while time.monotonic() < deadline:
            rows = api.get(usage_path).json()["data"]
            if sum(r["requests"] for r in rows) >= 2:
                break
            time.sleep(0.5)
    assert sum(r["requests"] for r in rows) == 2
    assert sum(r["completionTokens"] for r in rows) == 8 + 4
    models = httpx.get(
        f"{url}/openai/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).json()
    assert {(m["id"], m.get("parent")) for m in models["data"]} == {
        ("tiny-chat", None), ("sql", "tiny-chat"), ("poems", "tiny-chat"),
        ("legal", "tiny-chat"),
    }  # fmt: skip
    unknown = chat(url, token, "nope")
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["error"]["message"]
