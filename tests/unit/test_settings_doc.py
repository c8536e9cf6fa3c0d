"""docs/settings.md is what `scripts/settings_table.py` makes of the code's
settings: a setting added, renamed or given another default fails here until
the page is rebuilt."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from inferd.settings import env_name, setting_keys

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "settings_table.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_the_scripts_output(script: ModuleType) -> None:
    assert script.DOC.read_text() == script.render(), "run python scripts/settings_table.py"


def test_every_serve_setting_has_its_row(script: ModuleType) -> None:
    page = script.DOC.read_text()
    for key in setting_keys():
        assert f"| `{key}` | `--{key.replace('_', '-')}` | `{env_name(key)}` |" in page


def test_check_sees_a_stale_page(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text(script.render().replace("| 8080 |", "| 8081 |"))
    monkeypatch.setattr(script, "DOC", stale)
    assert script.main(["--check"]) == 1
    stale.write_text(script.render())
    assert script.main(["--check"]) == 0


def test_client_variables_are_read_by_the_code(script: ModuleType) -> None:
    """The hand-written client rows name variables the code reads."""
    source = "\n".join(p.read_text() for p in (ROOT / "inferd").rglob("*.py"))
    for name, _, _ in script.CLIENT_ENV:
        assert f'"{name}"' in source, name
