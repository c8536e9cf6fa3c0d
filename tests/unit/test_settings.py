"""Settings precedence: defaults < config file < environment < flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferd.paths import default_configs_dir, default_models_dir
from inferd.settings import (
    SettingsError,
    documented_defaults,
    env_name,
    load_settings,
    setting_keys,
)

SERVER_YAML = default_configs_dir() / "server.yaml"


def test_defaults() -> None:
    s = load_settings(env={"HOME": "/home/u"})
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert s.public_url == "http://127.0.0.1:8080"
    assert s.state_dir == Path("/home/u/.local/share/inferd")
    assert s.db_path == s.state_dir / "inferd.db"
    assert s.models_dir == default_models_dir()
    assert s.configs_dir == default_configs_dir()
    assert s.admin_key is None
    assert s.default_location == "local"


def test_xdg_data_home() -> None:
    s = load_settings(env={"XDG_DATA_HOME": "/data", "HOME": "/home/u"})
    assert s.state_dir == Path("/data/inferd")


def write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_precedence(tmp_path: Path) -> None:
    cfg = write(tmp_path, {"port": 9001, "host": "127.0.0.2", "max_replicas_cap": 3})
    env = {"INFERD_PORT": "9002", "INFERD_LOG_LEVEL": "debug"}
    assert load_settings(env={}, config_path=cfg).port == 9001
    assert load_settings(env=env, config_path=cfg).port == 9002
    s = load_settings(env=env, config_path=cfg, overrides={"port": 9003, "host": None})
    assert s.port == 9003
    assert s.host == "127.0.0.2"  # None override means "flag not given"
    assert s.log_level == "debug"
    assert s.max_replicas_cap == 3
    assert s.public_url == "http://127.0.0.2:9003"


def test_config_path_from_environment(tmp_path: Path) -> None:
    cfg = write(tmp_path, {"port": 9100})
    assert load_settings(env={"INFERD_CONFIG": str(cfg)}).port == 9100


def test_derived_values_follow_their_inputs(tmp_path: Path) -> None:
    s = load_settings(env={}, overrides={"state_dir": tmp_path, "host": "0.0.0.0", "port": 1})
    assert s.db_path == tmp_path / "inferd.db"
    assert s.database_url == f"sqlite:///{tmp_path / 'inferd.db'}"
    assert s.public_url == "http://127.0.0.1:1"  # a wildcard address is not dialable
    s = load_settings(env={}, overrides={"public_url": "https://api.example.com/"})
    assert s.public_url == "https://api.example.com"
    s = load_settings(env={}, overrides={"db_path": tmp_path / "other.db"})
    assert s.database_url == f"sqlite:///{tmp_path / 'other.db'}"
    pg = "postgresql://inferd@db:5432/inferd"
    s = load_settings(env={"INFERD_DATABASE_URL": pg}, overrides={"state_dir": tmp_path})
    assert s.database_url == pg


def test_admin_key_is_secret() -> None:
    s = load_settings(env={"INFERD_ADMIN_KEY": "operator-key-0123456789"})
    assert s.admin_key_value() == "operator-key-0123456789"
    assert "operator-key-0123456789" not in repr(s)


@pytest.mark.parametrize(
    ("env", "config", "needle"),
    [
        ({"INFERD_PORT": "eighty"}, None, "INFERD_PORT"),
        ({"INFERD_PORT": "70000"}, None, "INFERD_PORT"),
        ({}, {"port": "x"}, "config file"),
        ({}, {"no_such_key": 1}, "no_such_key"),
        ({"INFERD_LOG_LEVEL": "loud"}, None, "log_level"),
    ],
)
def test_bad_values_name_key_and_source(
    tmp_path: Path, env: dict[str, str], config: dict[str, object] | None, needle: str
) -> None:
    cfg = write(tmp_path, config) if config is not None else None
    with pytest.raises(SettingsError, match=needle):
        load_settings(env=env, config_path=cfg)


def test_unknown_override_rejected() -> None:
    with pytest.raises(SettingsError):
        load_settings(env={}, overrides={"colour": "blue"})


def test_environment_not_read_implicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERD_PORT", "9999")
    assert load_settings(env={}).port == 8080


def test_server_yaml_documents_every_key_with_its_default() -> None:
    documented = yaml.safe_load(SERVER_YAML.read_text())
    assert set(documented) == set(setting_keys())
    assert documented == documented_defaults()
    # And the file loads as a config file.
    assert load_settings(env={}, config_path=SERVER_YAML).port == 8080


def test_env_names() -> None:
    assert env_name("max_body_bytes") == "INFERD_MAX_BODY_BYTES"
