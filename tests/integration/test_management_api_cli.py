"""`inferd endpoints ...` against the in-process management API."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from inferd.cli import main
from inferd.client import cli as client_cli
from inferd.client.api import ManagementClient
from inferd.control.endpoints.tokens import is_well_formed
from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import build
from inferd.settings import load_settings

ADMIN = "cli-admin-key-0123456789"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": ADMIN})
    plane = asyncio.run(build(settings, launcher=FakeLauncher(), run_replicas=False))
    with TestClient(create_app(plane)) as http:

        def client_from_args(args: argparse.Namespace, env: object = None) -> ManagementClient:
            # The CLI's own flag handling, with the in-process app as transport.
            return ManagementClient("http://testserver", args.admin_key or ADMIN, http=http)

        monkeypatch.setattr(client_cli, "client_from_args", client_from_args)
        yield http
    asyncio.run(plane.close())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["endpoints", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_create_list_get_update_token_delete(
    api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "create", "demo", "--model", "tiny-chat", "--min-replicas", "0",
                       "--max-replicas", "2", "--retention", "30")  # fmt: skip
    assert code == 0
    assert "Access token (shown only this once" in out
    # The token just shown, as the README's $TOKEN, and the curl line using it.
    token = re.search(r"^  (infd_ep_\S+)$", out, re.M)
    assert token is not None
    assert re.search(
        rf"^  export URL=http://\S+/endpoints/[0-9a-f-]{{36}} TOKEN={token.group(1)}$", out, re.M
    )
    assert "curl $URL/openai/v1/chat/completions" in out and 'Bearer $TOKEN"' in out
    assert "<ACCESS_TOKEN>" not in out

    code, out, _ = run(capsys, "create", "pics", "--model", "tiny-sdxl", "--location", "local",
                       "--json")  # fmt: skip
    assert code == 0
    pics = json.loads(out)
    assert is_well_formed(pics["accessToken"])

    code, out, _ = run(capsys, "list")
    assert code == 0
    header, *lines = out.strip().splitlines()
    assert header.split()[:3] == ["ID", "NAME", "MODEL"]
    assert [line.split()[1] for line in lines] == ["demo", "pics"]
    assert "scaledToZero" in lines[0]

    code, out, _ = run(capsys, "list", "--json")
    assert [r["name"] for r in json.loads(out)["data"]] == ["demo", "pics"]

    # By name or by id.
    code, out, _ = run(capsys, "get", "demo")
    assert code == 0 and "tiny-chat" in out and "exampleCommand" in out
    code, out, _ = run(capsys, "get", pics["id"], "--json")
    assert json.loads(out)["name"] == "pics"

    code, out, _ = run(capsys, "update", "demo", "--max-replicas", "3", "--json")
    assert code == 0 and json.loads(out)["maxReplicas"] == 3

    code, out, _ = run(capsys, "token", "pics", "--json")
    new_token = json.loads(out)["accessToken"]
    assert is_well_formed(new_token) and new_token != pics["accessToken"]

    code, out, _ = run(capsys, "delete", "pics")
    assert code == 0 and pics["id"] in out
    code, out, _ = run(capsys, "list", "--json")
    assert [r["name"] for r in json.loads(out)["data"]] == ["demo"]


def test_list_pages_and_filters(api: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["web-1", "web-2", "batch-1", "web-3", "img-1"]
    for name in names:
        model = "tiny-sdxl" if name.startswith("img") else "tiny-chat"
        assert run(capsys, "create", name, "--model", model, "--min-replicas", "0")[0] == 0

    def listed(*argv: str) -> tuple[list[str], str]:
        code, out, err = run(capsys, "list", "--json", *argv)
        assert code == 0, err
        return [r["name"] for r in json.loads(out)["data"]], err

    # Without --limit: every page, followed by the client.
    assert listed()[0] == names
    assert listed("--name-prefix", "web-")[0] == ["web-1", "web-2", "web-3"]
    assert listed("--model", "tiny-sdxl")[0] == ["img-1"]
    assert listed("--status", "running")[0] == []
    # With --limit: one page, and the cursor of the next one.
    code, out, _ = run(capsys, "list", "--json", "--limit", "2", "--name-prefix", "web-")
    first = json.loads(out)
    assert [r["name"] for r in first["data"]] == ["web-1", "web-2"]
    rest, _ = listed("--limit", "2", "--name-prefix", "web-", "--continue", first["continue"])
    assert rest == ["web-3"]
    code, out, err = run(capsys, "list", "--limit", "2")
    assert code == 0 and len(out.strip().splitlines()) == 3  # header + 2
    assert "--continue " in err
    # The cursor belongs to its filters.
    code, _, err = run(capsys, "list", "--limit", "2", "--continue", first["continue"])
    assert code != 0 and "code: stale_cursor" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("get", "nope"), "no endpoint named 'nope'"),
        (("get", "00000000-0000-4000-8000-000000000000"), "HTTP 404"),
        (("create", "Bad_Name", "--model", "tiny-chat"), "param: name"),
        (("create", "x", "--model", "gpt-17"), "code: model_not_found"),
        (("create", "x", "--model", "tiny-chat", "--min-replicas", "3", "--max-replicas", "2"),
         "param: minReplicas"),
        (("get", "demo", "--admin-key", "wrong-key-0123456789"), "HTTP 401"),
    ],
)  # fmt: skip
def test_errors_come_from_the_error_body(
    api: TestClient, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], needle: str
) -> None:
    run(capsys, "create", "demo", "--model", "tiny-chat")
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert err.startswith("error: ")
    assert needle in err


def test_unreachable_api(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["endpoints", "list", "--api-url", "http://127.0.0.1:9", "--timeout", "2"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "cannot reach the inferd API" in err


def test_defaults_from_environment() -> None:
    args = argparse.Namespace(api_url=None, admin_key=None, timeout=5.0)
    client = client_cli.client_from_args(
        args, {"INFERD_API_URL": "http://example.test:1", "INFERD_ADMIN_KEY": "k" * 20}
    )
    assert client.api_url == "http://example.test:1"
    assert client._headers == {"Authorization": "Bearer " + "k" * 20}
    client.close()


def test_detail_names_the_replicas_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    record = {key: None for key in client_cli.DETAIL_FIELDS}
    for gpu_type, gpus, shown in (("cpu", 1, "ready (cpu)"), ("H100-80GB", 1, "ready (1 GPU)"),
                                  ("H100-80GB", 2, "ready (2 GPUs)")):  # fmt: skip
        record |= {"gpuType": gpu_type, "replicas": [{"gpus": gpus, "status": "ready"}]}
        client_cli._print_detail(record)
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("replicas ")]
        assert line.split(None, 1)[1] == shown


def test_table_formatting() -> None:
    assert client_cli.format_table([]) == "No endpoints."


def test_the_console_address_as_typed_leads_to_it(api: TestClient) -> None:
    moved = api.get("/console", follow_redirects=False)
    assert (moved.status_code, moved.headers["location"]) == (308, "/console/")
    assert api.get("/console?next=x", follow_redirects=False).headers["location"] == (
        "/console/?next=x"
    )
    assert api.get("/console").status_code == 200  # the sign-in page


def test_a_quota_on_an_unknown_gpu_type_is_refused(api: TestClient) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    assert api.post("/inference/projects", json={"id": "ml"}, headers=auth).status_code == 201
    answer = api.put("/inference/projects/ml/quota-limit", json={"gpus": {"A100": 8}}, headers=auth)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unknown_gpu_type", "gpus")
    assert "A100" in error["message"] and "A100-80GB" in error["message"]
    ok = api.put("/inference/projects/ml/quota", json={"gpus": {"A100-80GB": 4}}, headers=auth)
    assert ok.status_code == 200 and ok.json()["quota"]["gpus"] == {"A100-80GB": 4}
    created = api.post(
        "/inference/projects", json={"id": "cv", "quotaLimit": {"gpus": {"H100": 1}}},
        headers=auth,
    )  # fmt: skip
    assert created.status_code == 400 and created.json()["error"]["param"] == "quotaLimit.gpus"


def test_engine_settings_on_create_and_update(
    api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "create", "long", "--model", "tiny-chat", "--min-replicas", "0",
                       "--engine-settings", '{"maxModelLen": 1024, "maxNumSeqs": 8}')  # fmt: skip
    assert code == 0
    assert re.search(r'^engineSettings +\{"maxModelLen": 1024, "maxNumSeqs": 8\}$', out, re.M)
    change = '{"maxModelLen": null, "kvCacheDtype": "fp8"}'
    code, out, _ = run(capsys, "update", "long", "--json", "--engine-settings", change)
    assert code == 0
    assert json.loads(out)["engineSettings"] == {"kvCacheDtype": "fp8", "maxNumSeqs": 8}
    code, _, err = run(capsys, "update", "long", "--engine-settings", '{"maxModelLen": 4096}')
    assert code != 0 and "engineSettings.maxModelLen" in err
    with pytest.raises(SystemExit):
        run(capsys, "update", "long", "--engine-settings", "maxModelLen=1024")
    code, out, _ = run(capsys, "create", "plain", "--model", "tiny-chat", "--min-replicas", "0")
    assert re.search(r"^engineSettings +server defaults$", out, re.M)


def test_exports_under_a_prefix_paste_and_eval(
    api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second endpoint's exports need not be renamed by hand."""
    code, out, _ = run(capsys, "create", "pics", "--model", "tiny-sdxl", "--env-prefix", "IMAGE_")
    assert code == 0
    line = re.search(r"^  (export IMAGE_URL=\S+ IMAGE_TOKEN=(infd_ep_\S+))$", out, re.M)
    assert line is not None and "\n  " + line.group(2) + "\n" in out  # the token shown above
    assert "curl $IMAGE_URL/v1/images/generations" in out and 'Bearer $IMAGE_TOKEN"' in out

    # --env: stdout is the export line alone, for eval "$(...)".
    code, out, err = run(capsys, "create", "search", "--model", "tiny-chat", "--env",
                         "--env-prefix", "SEARCH_")  # fmt: skip
    assert code == 0
    (exported,) = out.splitlines()
    assert re.fullmatch(r"export SEARCH_URL=http://\S+ SEARCH_TOKEN=infd_ep_\S+", exported)
    assert "$SEARCH_TOKEN" in err
    token = exported.split("SEARCH_TOKEN=")[1]
    url = exported.split()[1].split("=", 1)[1]
    assert api.get(f"{url}/openai/v1/models", headers={"Authorization": f"Bearer {token}"})

    # `env`: the URL again; a token only as a new one (the old stops working).
    code, out, _ = run(capsys, "env", "search", "--env-prefix", "SEARCH_")
    assert (code, out) == (0, f"export SEARCH_URL={url}\n")
    code, out, _ = run(capsys, "env", "search", "--new-token")
    new = re.fullmatch(rf"export URL={re.escape(url)} TOKEN=(infd_ep_\S+)\n", out)
    assert new is not None and new.group(1) != token

    with pytest.raises(SystemExit):
        main(["endpoints", "env", "search", "--env-prefix", "1-BAD"])
    assert "letters, digits and _ only" in capsys.readouterr().err


def test_wait_on_an_endpoint_at_zero_says_what_would_start_it(
    api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "create", "demo", "--model", "tiny-chat", "--min-replicas", "0",
                       "--wait")  # fmt: skip
    assert code == 0 and "scaled to zero; its first request starts a replica" in err
    code, _, err = run(capsys, "wait", "demo", "--max-wait", "0")
    assert code == 1
    assert "demo             0 s  scaled to zero: a replica starts with the next request" in err
    assert "not ready after 0 s (scaled to zero)" in err
