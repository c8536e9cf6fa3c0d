"""A real `inferd serve` process keeps every record and token across restarts.

Stops it gracefully (SIGTERM) and brutally (SIGKILL); after each restart the
records read back unchanged and every issued token still verifies against the
same SQLite file (the gateway that checks tokens on requests comes later).
"""

from __future__ import annotations

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

from inferd.control.store import Store
from inferd.control.tokens import TokenVerifier

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


def snapshot(url: str, admin_key: str) -> list[dict[str, Any]]:
    resp = httpx.get(url + "/inference/endpoints", headers={"Authorization": f"Bearer {admin_key}"})
    assert resp.status_code == 200, resp.text
    records: list[dict[str, Any]] = resp.json()["data"]
    return sorted(records, key=lambda r: r["id"])


def check_tokens(db: Path, valid: dict[str, str], revoked: dict[str, str]) -> None:
    store = Store.open(db)
    try:
        assert store.integrity_check() == "ok"
        verifier = TokenVerifier(store)
        for endpoint_id, token in valid.items():
            assert verifier.verify(endpoint_id, token), endpoint_id
        for endpoint_id, token in revoked.items():
            assert not verifier.verify(endpoint_id, token), endpoint_id
    finally:
        store.close()


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
        for body in bodies:
            resp = client.post("/inference/endpoints", json=body)
            assert resp.status_code == 201, resp.text
            tokens[resp.json()["id"]] = resp.json()["accessToken"]
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
        before = snapshot(second.url, admin_key)
    finally:
        stop(second, signal.SIGKILL)  # no shutdown at all: only what was committed
    check_tokens(db, tokens, revoked)

    third = start(workdir, port, 3)
    try:
        assert snapshot(third.url, admin_key) == before
    finally:
        assert stop(third, signal.SIGTERM) == 0

    # No token ever reached the logs or the terminal.
    for served in (first, second, third):
        text = served.stdout() + served.err.read_text(errors="replace")
        for token in (*tokens.values(), *revoked.values()):
            assert token not in text
