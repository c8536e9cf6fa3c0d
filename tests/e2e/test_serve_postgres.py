"""`inferd serve` on PostgreSQL when the database is not there: at start (one
clear line, nonzero exit) and while serving (writes answer 503 with
Retry-After, reads and inference go on from memory, and it recovers by
itself with nothing lost). Replicas run the fake engine: this is about the
store."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.testing import ServeHandle, free_port
from inferd.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow


def chat(serve: ServeHandle, record: dict[str, Any], token: str) -> httpx.Response:
    return httpx.post(
        f"{record['url']}/openai/v1/chat/completions",
        json={"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def test_unreachable_database_at_start_is_one_line_and_exit_1(tmp_path: Path) -> None:
    url = f"postgresql://inferd:secret-password@127.0.0.1:{free_port()}/inferd"
    result = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--port", str(free_port()),
         "--state-dir", str(tmp_path), "--database-url", url],
        capture_output=True, text=True, timeout=60,  # it gives up; it does not retry forever
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("inferd serve: cannot reach PostgreSQL at postgresql://inferd:***@")
    assert "secret-password" not in result.stderr


def test_database_outage_while_serving(tmp_path: Path, postgres_server: PostgresServer) -> None:
    serve = ServeHandle(
        tmp_path,
        settings={
            "database_url": postgres_server.create_database(),
            "replica_args": "--engine fake",
            "health_period_seconds": "0.5",
            "reconcile_period_seconds": "0.2",
        },
    ).start()
    try:
        created = serve.create_endpoint(name="kept", modelName="tiny-chat", minReplicas=1)
        endpoint_id, token = created["id"], created["accessToken"]
        serve.wait_record(endpoint_id, lambda r: r["status"] == "running", timeout=60)
        assert chat(serve, created, token).status_code == 200

        postgres_server.stop()
        try:
            with serve.api() as api:
                # Reads are served from memory.
                assert api.get(f"/inference/endpoints/{endpoint_id}").status_code == 200
                assert [r["id"] for r in api.get("/inference/endpoints").json()["data"]] == [
                    endpoint_id
                ]
                # Writes say "not now", in the one error shape, with when to retry.
                refused = api.post(
                    "/inference/endpoints", json={"name": "later", "modelName": "tiny-chat"}
                )
                assert refused.status_code == 503, refused.text
                assert int(refused.headers["retry-after"]) >= 1
                error = refused.json()["error"]
                assert error["code"] == "store_unavailable" and error["type"]
                patch = api.patch(f"/inference/endpoints/{endpoint_id}", json={"maxReplicas": 2})
                assert patch.status_code == 503
            # Inference does not need the database.
            assert chat(serve, created, token).status_code == 200
        finally:
            postgres_server.start()

        # Back by itself: the next write succeeds without a restart of inferd.
        deadline = time.monotonic() + 30
        with serve.api() as api:
            while True:
                answer = api.post(
                    "/inference/endpoints", json={"name": "later", "modelName": "tiny-chat"}
                )
                if answer.status_code == 201 or time.monotonic() > deadline:
                    break
                assert answer.status_code == 503, answer.text
                time.sleep(0.5)
            assert answer.status_code == 201, answer.text
            names = [r["name"] for r in api.get("/inference/endpoints").json()["data"]]
            assert names == ["kept", "later"]
            # The refused PATCH did not happen; a new one does.
            assert api.get(f"/inference/endpoints/{endpoint_id}").json()["maxReplicas"] == 1
            patched = api.patch(f"/inference/endpoints/{endpoint_id}", json={"maxReplicas": 2})
            assert patched.status_code == 200 and patched.json()["maxReplicas"] == 2
            new_token = api.post(f"/inference/endpoints/{endpoint_id}/access-token").json()
        assert chat(serve, created, new_token["accessToken"]).status_code == 200
        assert chat(serve, created, token).status_code == 401

        # And all of it is in the database: a restarted inferd serves it.
        assert serve.stop() == 0
        serve.start()
        assert serve.record(endpoint_id)["maxReplicas"] == 2
        serve.wait_record(endpoint_id, lambda r: r["status"] == "running", timeout=60)
        assert chat(serve, created, new_token["accessToken"]).status_code == 200
    finally:
        serve.cleanup()
