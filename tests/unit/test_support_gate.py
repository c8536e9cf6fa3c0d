"""The gate of tests/support.py: a component is present when it imports. One
that is not installed is a skip (a failure under CI); one that is installed
and fails to import is a failure with its import error, CI or not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import support


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("inferd_gate_broken", "inferd_gate_fine"):
        sys.modules.pop(name, None)


def test_a_package_that_imports_is_present(packages: Path) -> None:
    (packages / "inferd_gate_fine").mkdir()
    (packages / "inferd_gate_fine" / "__init__.py").write_text("")
    assert support.importable("inferd_gate_fine") is True


def test_a_missing_package_is_absent() -> None:
    assert support.importable("inferd_gate_not_installed") is False
    assert support.importable("inferd_gate_not_installed.sub") is False


def test_a_broken_install_is_a_failure_with_its_import_error(
    packages: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (packages / "inferd_gate_broken").mkdir()
    (packages / "inferd_gate_broken" / "__init__.py").write_text(
        "import inferd_gate_lost_dependency\n"
    )
    with pytest.raises(support.BrokenComponent, match="inferd_gate_lost_dependency"):
        support.importable("inferd_gate_broken")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(
        support.COMPONENTS,
        "broken",
        (lambda: support.importable("inferd_gate_broken"), "pip install it again"),
    )
    broken = r"does not import.*inferd_gate_lost_dependency"
    with pytest.raises(pytest.fail.Exception, match=broken):
        support.require("broken")
