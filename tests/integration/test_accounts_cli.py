"""`inferd projects|members|keys|usage` and `inferd endpoints` with a user's
management key, against the in-process management API."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from inferd.cli import main
from inferd.client import cli as client_cli
from inferd.client.api import ManagementClient
from inferd.control.accounts.keys import is_user_key
from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import load_settings

OPERATOR = "cli-operator-key-0123456789"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": OPERATOR})
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    with TestClient(create_app(plane)) as http:

        def client_from_args(args: argparse.Namespace, env: object = None) -> ManagementClient:
            # The CLI's own key handling (--key, $INFERD_API_KEY), in-process transport.
            key = client_cli.key_from(args, {}) or OPERATOR
            return ManagementClient("http://testserver", key, http=http)

        monkeypatch.setattr(client_cli, "client_from_args", client_from_args)
        yield http
    asyncio.run(plane.close())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_accounts_commands_with_a_user_key(
    api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "projects", "create", "ml")[0] == 0
    code, out, _ = run(capsys, "members", "add", "ml", "ada", "--role", "admin", "--json")
    assert code == 0
    ada = json.loads(out)["createdKey"]["key"]
    assert is_user_key(ada)
    code, out, _ = run(capsys, "members", "add", "ml", "bob", "--role", "viewer", "--key", ada)
    assert code == 0 and "shown only this once" in out
    # An admin's new user is the project's own, whatever exists elsewhere.
    assert out.startswith("ml:bob is viewer in ml.")
    bob = out.strip().splitlines()[-1].strip()
    assert is_user_key(bob)

    # Endpoints with a user key; the project is the admin's only one.
    code, out, _ = run(capsys, "endpoints", "create", "chat", "--model", "tiny-chat",
                       "--min-replicas", "0", "--key", ada, "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["projectId"] == "ml"
    code, out, _ = run(capsys, "endpoints", "get", "chat", "--key", bob)
    assert code == 0 and "costSoFar" in out and "ml" in out
    code, _, err = run(capsys, "endpoints", "delete", "chat", "--key", bob)
    assert code == 1 and "HTTP 403" in err

    code, out, _ = run(capsys, "projects", "list", "--key", bob)
    assert code == 0 and "ml" in out and "viewer" in out
    code, out, _ = run(capsys, "members", "list", "ml", "--key", bob)
    assert code == 0 and "ada" in out and "bob" in out

    # Keys: own keys by default; listing shows the hint, never the key.
    code, out, _ = run(capsys, "keys", "create", "--name", "laptop", "--key", bob, "--json")
    spare = json.loads(out)
    # bob's key (minted by his admin) acts in ml only, and so does any it mints.
    assert spare["projectId"] == "ml"
    code, out, _ = run(capsys, "keys", "list", "--key", bob)
    assert code == 0 and spare["hint"] in out and spare["key"] not in out and "laptop" in out
    code, out, _ = run(capsys, "keys", "revoke", spare["id"], "--key", bob)
    assert code == 0
    code, _, err = run(capsys, "projects", "list", "--key", spare["key"])
    assert code == 1 and "HTTP 401" in err

    code, out, _ = run(capsys, "usage", "endpoint", "chat", "--key", bob)
    assert code == 0 and "total: 0" in out
    code, out, _ = run(capsys, "usage", "project", "ml", "--key", bob, "--json")
    assert code == 0 and json.loads(out)["totals"]["requests"] == 0

    code, out, _ = run(capsys, "projects", "audit", "ml", "--key", ada)
    assert code == 0 and "endpoint.create" in out and "user:ada" in out
    code, _, err = run(capsys, "projects", "audit", "ml", "--key", bob)
    assert code == 1 and "HTTP 403" in err
    code, _, err = run(
        capsys, "projects", "quota", "ml", "--limit", "--replicas", "3", "--key", ada
    )
    assert code == 1 and "operator" in err
    code, out, _ = run(
        capsys, "projects", "quota", "ml", "--limit", "--replicas", "3", "--gpus", "cpu=2"
    )
    assert code == 0 and "replicas 3" in out and "cpu GPUs 2" in out
    code, _, err = run(capsys, "projects", "quota", "ml", "--replicas", "4", "--key", ada)
    assert code == 1 and "limit 3" in err
    code, out, _ = run(
        capsys, "projects", "quota", "ml", "--replicas", "2", "--gpus", "cpu=2", "--key", ada
    )
    assert code == 0 and "replicas 2" in out
    code, out, _ = run(capsys, "projects", "get", "ml", "--key", ada)
    assert code == 0 and "replicas 2, cpu GPUs 2 (in force)" in out
