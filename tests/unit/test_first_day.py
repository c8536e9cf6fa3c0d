"""Small things a first day runs into: the banner, the access log, the
redactor on inferd's own hints, declared GPU types, `inferd --version`,
`inferd replica --help`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from inferd import __version__
from inferd.cli import build_parser, main
from inferd.control.launchers.inventory import parse_declared_gpu_types
from inferd.control.launchers.local import LocalLauncher
from inferd.redact import redact
from inferd.replica.config import ReplicaSettings
from inferd.server.access_log import QuietReplicaReports
from inferd.server.cli import _banner, admin_key_source
from inferd.settings import load_settings

GPU_TYPES = {"H100-80GB": object(), "L4": object(), "cpu": type("Cpu", (), {"is_cpu": True})()}


def test_the_redactor_keeps_a_placeholder_and_hides_a_key() -> None:
    hint = "Missing key: send 'Authorization: Bearer <your key>'."
    assert redact(hint) == hint
    assert redact("Authorization: Bearer s3cret-operator-key") == "Authorization: Bearer ***"


def access_record(method: str, path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", method, path, "1.1", status), None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "status", "logged"),
    [
        ("POST", "/internal/registry/replicas/r-1", 200, False),  # a heartbeat
        ("POST", "/internal/registry/replicas/r-1", 401, True),  # refused: worth a line
        ("GET", "/inference/endpoints", 200, True),
        # The gateway logs its requests itself, with their request id.
        ("POST", "/endpoints/e/openai/v1/chat/completions", 200, False),
    ],
)
def test_replica_reports_leave_the_access_log(
    method: str, path: str, status: int, logged: bool
) -> None:
    assert QuietReplicaReports().filter(access_record(method, path, status)) is logged


def test_declared_gpu_types() -> None:
    assert parse_declared_gpu_types("", GPU_TYPES) == {}
    assert parse_declared_gpu_types("L4", GPU_TYPES) == {-1: "L4"}
    assert parse_declared_gpu_types("0=H100-80GB, 1=L4", GPU_TYPES) == {0: "H100-80GB", 1: "L4"}
    with pytest.raises(ValueError, match="unknown GPU type 'A100'; known: H100-80GB, L4"):
        parse_declared_gpu_types("A100", GPU_TYPES)
    with pytest.raises(ValueError, match="unknown GPU type 'cpu'"):
        parse_declared_gpu_types("cpu", GPU_TYPES)
    with pytest.raises(ValueError, match="use TYPE or INDEX=TYPE"):
        parse_declared_gpu_types("first=L4", GPU_TYPES)


def test_a_pending_reason_names_the_setting_that_fixes_it(tmp_path: Path) -> None:
    settings = ReplicaSettings(registry_url="http://127.0.0.1:1")
    launcher = LocalLauncher(settings=settings, log_dir=tmp_path, location="local")
    reason = launcher._cannot_place("us-east", "H100-80GB", 1)
    assert reason is not None and "`inferd serve --default-location us-east`" in reason
    reason = launcher._cannot_place("local", "H100-80GB", 1)
    assert reason is not None and "--gpu-types" in reason and "no GPUs" in reason
    assert launcher.describe() == "location 'local': no GPUs, 4 CPU slots"


def test_the_banner_says_where_everything_is(tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={"state_dir": str(tmp_path), "port": "9123"})
    text = _banner(
        settings, "sqlite", "infd_admin_x", replicas="location 'local': no GPUs, 4 CPU slots"
    )
    assert "  web console     http://127.0.0.1:9123/console/" in text
    assert "  replicas        location 'local': no GPUs, 4 CPU slots" in text
    assert f"  replica logs    {tmp_path / 'logs'}/replica-<id>.log" in text
    assert "export INFERD_ADMIN_KEY=infd_admin_x" in text and "--rotate-admin-key" in text
    adopted = _banner(settings, "sqlite", None, admin_key_source="the environment")
    assert "admin key       the one in the environment" in adopted
    assert "printed at first start" not in adopted and "printed at first start" not in text
    # A restart prints no key: it says one exists, and how to replace a lost one.
    restarted = _banner(settings, "sqlite", None)
    assert "  admin key       the one printed at first start (only its hash is kept)" in restarted
    assert "`inferd serve --rotate-admin-key` prints a new one" in restarted


def test_where_an_operator_key_comes_from() -> None:
    flags = argparse.Namespace(admin_key=None)
    assert admin_key_source(flags, {}) is None
    assert admin_key_source(flags, {"INFERD_ADMIN_KEY": "k" * 20}) == (
        "the environment (INFERD_ADMIN_KEY)"
    )
    assert admin_key_source(argparse.Namespace(admin_key="k" * 20), {}) == "--admin-key"


def test_rotating_a_key_the_environment_sets_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERD_ADMIN_KEY", "an-operator-key-0123456789")
    status = main(["serve", "--rotate-admin-key", "--state-dir", str(tmp_path)])
    assert status == 2
    assert "unset it to use and rotate the stored one" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"inferd {__version__}\n"


def test_replica_help_explains_every_flag_and_hides_the_launchers() -> None:
    parser = build_parser()
    replica = parser._subparsers._group_actions[0].choices["replica"]  # type: ignore[union-attr]
    shown = [a for a in replica._actions if a.help != argparse.SUPPRESS]
    assert all(a.help for a in shown), [a.dest for a in shown if not a.help]
    text = replica.format_help()
    for internal in ("--registry-url", "--replica-id", "--model-source", "--report-interval"):
        assert internal not in text
    for public in ("--model", "--port", "--engine", "--device"):
        assert public in text
    # Hidden, still accepted (launchers pass them).
    args = replica.parse_args(["--model", "m", "--registry-url", "http://x", "--replica-id", "r"])
    assert (args.registry_url, args.replica_id) == ("http://x", "r")


def test_a_bench_error_is_the_endpoints_json_as_text() -> None:
    from inferd.client.bench import _answer

    body = b'{"error": {"message": "too long", "code": "context_length_exceeded"}}'
    assert _answer(400, body) == (
        'HTTP 400: {"error": {"message": "too long", "code": "context_length_exceeded"}}'
    )
    assert _answer(502, b"<html>bad gateway</html>") == "HTTP 502: <html>bad gateway</html>"


def test_a_replica_line_says_since_when_and_what_it_does() -> None:
    from datetime import UTC, datetime, timedelta

    from inferd.client.cli import _replica_line

    since = (datetime.now(UTC) - timedelta(seconds=75)).isoformat().replace("+00:00", "Z")
    line = _replica_line(
        {"status": "loading", "gpus": 1, "since": since, "engine": "vllm",
         "statusReason": "loading tiny-chat with the vllm engine"},
        "cpu",
    )  # fmt: skip
    assert line.startswith(f"loading since {since} (1 min 1")
    assert line.endswith("s ago) (vllm, cpu): loading tiny-chat with the vllm engine")


def test_an_unknown_model_points_at_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", "my-registered-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'my-registered-model'" in err and "add --server" in err


def test_relative_model_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.catalog.cli import local_source
    from inferd.catalog.inspect import InspectError
    from inferd.catalog.sources import parse_source

    (tmp_path / "models" / "x").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    # Here, the CLI: a directory that exists is sent as its absolute path ...
    assert local_source("models/x") == str(tmp_path / "models" / "x")
    assert local_source("./models/x") == str(tmp_path / "models" / "x")
    # Missing: still sent as an absolute path, so the server says it does not exist.
    assert local_source("./missing") == str(tmp_path / "missing")
    # ... anything else as given (a repository id).
    assert local_source("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    # There, the server: a relative path means nothing it could know.
    with pytest.raises(InspectError, match="relative path: give the directory's absolute path"):
        parse_source("./models/x")
    with pytest.raises(InspectError, match=f"directory {tmp_path / 'missing'} does not exist"):
        parse_source(local_source("./missing"))


def test_registering_a_hub_model_without_a_network_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferd.catalog.inspect import InspectError
    from inferd.catalog.sources import ModelSource, read_model_files

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InspectError) as info:
        read_model_files(
            ModelSource(repo_id="inferd-test/not-cached"), hf_cache_dir=tmp_path, offline=False
        )
    message = str(info.value)
    assert "the Hub cannot be reached from the server: cannot connect to 127.0.0.1:1" in message
    assert "hf download inferd-test/not-cached --local-dir DIR" in message
