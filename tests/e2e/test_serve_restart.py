"""A real `inferd serve` process keeps every record and token across restarts.

Stops it gracefully (SIGTERM) and brutally (SIGKILL); after each restart the
records read back unchanged, every issued token still verifies against the
same SQLite file and still opens its endpoint through the gateway, and no
revoked token does. Replicas run the fake engine: this is about the store.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from inferd.control.endpoints.tokens import TokenVerifier
from inferd.control.launchers.local import launched_processes
from inferd.control.replicas.registry_api import REGISTRY_PATH
from inferd.control.stores.sql.store import SqliteStore
from inferd.testing import replica_processes

ADMIN_KEY_RE = re.compile(r"infd_admin_[0-9A-Za-z]{38}")
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    out: Path
    err: Path
    logs: list[Path] = field(default_factory=list)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")


def start(state_dir: Path, port: int, run: int) -> Served:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERD_")}
    env["HOME"] = str(state_dir)  # nothing of the developer's own state is touched
    if "INFERD_CACHE_DIR" in os.environ:  # the shared tiny-model cache may stay
        env["INFERD_CACHE_DIR"] = os.environ["INFERD_CACHE_DIR"]
    out, err = state_dir / f"serve-{run}.out", state_dir / f"serve-{run}.err"
    with out.open("wb") as fout, err.open("wb") as ferr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferd",
                "serve",
                "--port",
                str(port),
                "--state-dir",
                str(state_dir / "state"),
                "--log-level",
                "info",
                "--replica-args",
                "--engine fake",
                "--health-period-seconds",
                "0.5",
            ],
            stdout=fout,
            stderr=ferr,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"inferd serve exited with {proc.returncode}: {err.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return Served(proc, url, out, err)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"inferd serve did not start: {err.read_text()}")


def stop(served: Served, sig: signal.Signals) -> int:
    served.proc.send_signal(sig)
    return served.proc.wait(timeout=30)


# What a restart may change: the replicas that run now, not the settings.
RUNTIME_FIELDS = ("currentReplicas", "replicas", "status", "statusReason")


def snapshot(url: str, admin_key: str) -> list[dict[str, Any]]:
    resp = httpx.get(url + "/inference/endpoints", headers={"Authorization": f"Bearer {admin_key}"})
    assert resp.status_code == 200, resp.text
    records: list[dict[str, Any]] = resp.json()["data"]
    stored = [{k: v for k, v in r.items() if k not in RUNTIME_FIELDS} for r in records]
    return sorted(stored, key=lambda r: r["id"])


def check_gateway(
    url: str, valid: dict[str, str], revoked: dict[str, str], kinds: dict[str, str]
) -> None:
    """Each valid token opens its endpoint (held until a replica is up); a
    revoked one gets 401."""
    for endpoint_id, token in valid.items():
        if kinds[endpoint_id] == "image":
            path, body = "/v1/images/generations", {"prompt": "x", "size": "64x64"}
        else:
            path, body = (
                "/openai/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
            )
        resp = httpx.post(
            f"{url}/endpoints/{endpoint_id}{path}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
    for endpoint_id, token in revoked.items():
        resp = httpx.post(
            f"{url}/endpoints/{endpoint_id}/openai/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == 401


def check_tokens(db: Path, valid: dict[str, str], revoked: dict[str, str]) -> None:
    store = SqliteStore.open(db)
    try:
        assert store.integrity_check() == "ok"
        verifier = TokenVerifier(store)
        asyncio.run(verifier.load())
        for endpoint_id, token in valid.items():
            assert verifier.verify(endpoint_id, token), endpoint_id
        for endpoint_id, token in revoked.items():
            assert not verifier.verify(endpoint_id, token), endpoint_id
    finally:
        asyncio.run(store.close())


def test_records_and_tokens_survive_sigterm_and_sigkill(tmp_path: Path) -> None:
    workdir = tmp_path
    port = free_port()
    db = workdir / "state" / "inferd.db"

    first = start(workdir, port, 1)
    try:
        keys = set(ADMIN_KEY_RE.findall(first.stdout()))
        assert len(keys) == 1, "one admin key is generated on first start and printed"
        admin_key = keys.pop()
        auth = {"Authorization": f"Bearer {admin_key}"}
        client = httpx.Client(base_url=first.url, headers=auth)
        tokens: dict[str, str] = {}
        revoked: dict[str, str] = {}
        bodies = [
            {
                "name": "chat-a",
                "modelName": "tiny-chat",
                "minReplicas": 0,
                "maxReplicas": 2,
                "scaleToZeroRetentionPeriodSeconds": 30,
            },
            {"name": "chat-b", "modelName": "tiny-chat", "locationName": "local"},
            {"name": "image-a", "modelName": "tiny-sdxl", "minReplicas": 0},
        ]
        kinds: dict[str, str] = {}
        for body in bodies:
            resp = client.post("/inference/endpoints", json=body)
            assert resp.status_code == 201, resp.text
            tokens[resp.json()["id"]] = resp.json()["accessToken"]
            kinds[resp.json()["id"]] = "image" if "sdxl" in str(body["modelName"]) else "chat"
        some_id = next(iter(tokens))
        resp = client.post(f"/inference/endpoints/{some_id}/access-token")
        assert resp.status_code == 200
        revoked[some_id] = tokens[some_id]
        tokens[some_id] = resp.json()["accessToken"]
        resp = client.patch(f"/inference/endpoints/{some_id}", json={"maxReplicas": 3})
        assert resp.status_code == 200 and resp.json()["maxReplicas"] == 3
        # While it runs, another reader of the WAL database sees every commit.
        check_tokens(db, tokens, revoked)
        before = snapshot(first.url, admin_key)
        client.close()
    finally:
        code = stop(first, signal.SIGTERM)
    assert code == 0, first.err.read_text()
    check_tokens(db, tokens, revoked)

    second = start(workdir, port, 2)
    try:
        assert ADMIN_KEY_RE.search(second.stdout()) is None, "the admin key is printed only once"
        assert snapshot(second.url, admin_key) == before
        extra = httpx.post(
            second.url + "/inference/endpoints",
            json={"name": "after-restart", "modelName": "tiny-chat"},
            headers={"Authorization": f"Bearer {admin_key}"},
        )
        assert extra.status_code == 201
        tokens[extra.json()["id"]] = extra.json()["accessToken"]
        kinds[extra.json()["id"]] = "chat"
        check_gateway(second.url, tokens, revoked, kinds)
        before = snapshot(second.url, admin_key)
    finally:
        stop(second, signal.SIGKILL)  # no shutdown at all: only what was committed
    check_tokens(db, tokens, revoked)

    third = start(workdir, port, 3)
    try:
        assert snapshot(third.url, admin_key) == before
        check_gateway(third.url, tokens, revoked, kinds)
    finally:
        assert stop(third, signal.SIGTERM) == 0
    # Replicas orphaned by the SIGKILL were adopted by the third run and
    # stopped with it.
    assert replica_processes(port) == []
    assert launched_processes(f"http://127.0.0.1:{port}{REGISTRY_PATH}") == []

    # No token ever reached the logs or the terminal.
    for served in (first, second, third):
        text = served.stdout() + served.err.read_text(errors="replace")
        for token in (*tokens.values(), *revoked.values()):
            assert token not in text
