"""The Batch API's HTTP routes in-process on a built server (memory store, no
replica): the official `openai` client's `files` and `batches` calls against
the endpoint URL, the token check, and bad input answered with clear 4xx.
Running batches to the end is tests/integration/test_batch_failover.py's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import load_settings
from tests.support import needs

pytestmark = needs("openai")

ADMIN = "batch-api-admin-key-0123456789"
FILE_LIMIT = 4096


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    settings = load_settings(
        env={},
        overrides={
            "state_dir": tmp_path,
            "database_url": "memory://",
            "admin_key": ADMIN,
            "public_url": "http://testserver",
            "batch_max_file_bytes": FILE_LIMIT,
        },
    )
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    try:
        with TestClient(create_app(plane)) as client:
            made = client.post(
                "/inference/endpoints",
                json={"name": "chat", "modelName": "tiny-chat", "minReplicas": 0},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert made.status_code == 201, made.text
            yield client, made.json()
    finally:
        asyncio.run(plane.close())


def requests_file(n: int) -> bytes:
    rows = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "tiny-chat", "messages": [{"role": "user", "content": f"hi {i}"}],
                  "max_tokens": 4}}
        for i in range(n)
    ]  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_the_openai_client_uploads_creates_lists_and_cancels(
    served: tuple[TestClient, dict[str, Any]],
) -> None:
    client, endpoint = served
    oai = openai.OpenAI(
        base_url=f"{endpoint['url']}/openai/v1",
        api_key=endpoint["accessToken"],
        http_client=client,
        max_retries=0,
    )
    uploaded = oai.files.create(file=("in.jsonl", requests_file(3)), purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.bytes == len(requests_file(3))
    assert oai.files.retrieve(uploaded.id).filename == "in.jsonl"
    assert oai.files.content(uploaded.id).content == requests_file(3)
    assert [f.id for f in oai.files.list().data] == [uploaded.id]

    batch = oai.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
        extra_body={"capacity": "running"},  # inferd's field, as the client sends one
    )
    assert batch.status in ("validating", "in_progress")
    assert batch.to_dict()["capacity"] == "running"
    assert batch.request_counts is not None and batch.request_counts.total == 3
    assert batch.metadata == {"job": "nightly"}
    got = oai.batches.retrieve(batch.id)
    assert got.id == batch.id and got.input_file_id == uploaded.id
    assert got.to_dict()["capacity"] == "running"
    assert [b.id for b in oai.batches.list(limit=5).data] == [batch.id]
    cancelled = oai.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    # No replica answers here (min 0, none launched): the runner stops it at once.
    final = oai.batches.retrieve(batch.id)
    for _ in range(200):
        if final.status == "cancelled":
            break
        time.sleep(0.02)
        final = oai.batches.retrieve(batch.id)
    assert final.status == "cancelled" and final.cancelled_at is not None
    assert final.request_counts is not None and final.request_counts.completed == 0
    assert oai.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(uploaded.id)


def test_without_the_token_every_route_is_the_same_401(
    served: tuple[TestClient, dict[str, Any]],
) -> None:
    client, endpoint = served
    base = f"/endpoints/{endpoint['id']}/openai/v1"
    for method, path in [("GET", "/files"), ("GET", "/files/file-x"),
                         ("GET", "/files/file-x/content"), ("DELETE", "/files/file-x"),
                         ("POST", "/batches"), ("GET", "/batches"), ("GET", "/batches/b"),
                         ("POST", "/batches/b/cancel")]:  # fmt: skip
        for headers in ({}, {"Authorization": "Bearer nope"}):
            answer = client.request(method, base + path, headers=headers)
            assert answer.status_code == 401, (method, path)
            assert answer.json()["error"]["type"] == "authentication_error"
    # The same for an endpoint that does not exist.
    answer = client.get("/endpoints/00000000-0000-4000-8000-000000000000/openai/v1/batches",
                        headers={"Authorization": f"Bearer {endpoint['accessToken']}"})  # fmt: skip
    assert answer.status_code == 401


def test_bad_uploads_and_batches_get_clear_4xx(
    served: tuple[TestClient, dict[str, Any]],
) -> None:
    client, endpoint = served
    base = f"/endpoints/{endpoint['id']}/openai/v1"
    auth = {"Authorization": f"Bearer {endpoint['accessToken']}"}

    def upload(content: bytes, purpose: str = "batch") -> Any:
        form = {"purpose": purpose}
        return client.post(base + "/files", headers=auth, files={"file": ("in.jsonl", content)},
                           data=form)  # fmt: skip

    bad = upload(b'{"custom_id": "a"}\n')
    assert bad.status_code == 400
    assert "line 1: method must be 'POST'" in bad.json()["error"]["message"]
    assert upload(requests_file(1), "fine-tune").json()["error"]["param"] == "purpose"
    big = upload(requests_file(200))
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
    assert client.post(base + "/files", headers=auth, content=b"x").status_code == 415
    no_file = client.post(base + "/files", headers=auth, data={"purpose": "batch"},
                          files={"other": ("x", b"y")})  # fmt: skip
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    file_id = upload(requests_file(1)).json()["id"]
    for body, param in [
        ({"input_file_id": file_id, "endpoint": "/v1/chat/completions"}, "completion_window"),
        ({"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
         "endpoint"),
        ({"input_file_id": "file-none", "endpoint": "/v1/chat/completions",
          "completion_window": "24h"}, "input_file_id"),
    ]:  # fmt: skip
        answer = client.post(base + "/batches", headers=auth, json=body)
        assert 400 <= answer.status_code < 500 and answer.json()["error"]["param"] == param
    assert client.post(base + "/batches", headers=auth, content=b"[").status_code == 400
    assert client.get(base + "/batches?limit=0", headers=auth).status_code == 400
    assert client.get(base + "/batches?after=", headers=auth).json()["error"]["param"] == "after"
    unknown = client.get(base + "/batches?sort=x", headers=auth).json()["error"]
    assert unknown["param"] == "sort"
    # A path's methods are one route: HEAD where GET is, 405 (with Allow) elsewhere.
    assert client.head(base + "/batches", headers=auth).status_code == 200
    not_allowed = client.request("PUT", base + "/batches/batch_x/cancel", headers=auth)
    assert not_allowed.status_code == 405 and not_allowed.headers["allow"] == "POST"
    assert client.get(base + "/batches/batch_none", headers=auth).status_code == 404
