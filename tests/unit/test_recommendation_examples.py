"""The worked recommendation examples are `inferd recommend`'s output whole,
and `scripts/recommendation_table.py --check` sees any line that differs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "recommendation_table.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("recommendation_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_example_lists_as_many_options_as_its_header_counts(script: ModuleType) -> None:
    examples = script.render_examples()
    headers = re.findall(r": (\d+) option\(s\), (\d+) rejected", examples)
    assert len(headers) == len(script.WORKLOADS)
    rows = len(re.findall(r"^us-east \d+ x ", examples, re.M))
    assert rows == sum(int(options) for options, _ in headers)


def test_check_fails_on_a_page_whose_example_was_cut(
    script: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    whole = f"intro\n{script.BEGIN}\n{script.render_examples()}\n{script.END}\nafter\n"
    cut = "\n".join(line for line in whole.splitlines() if "4 x H200" not in line) + "\n"
    readme = tmp_path / "README.md"
    readme.write_text("# no examples here\n")
    monkeypatch.setattr(script, "README", readme)
    monkeypatch.setattr(script, "DOCS", page.parent)
    monkeypatch.setattr(script, "DOC", script.DOC)  # the generated doc itself is the repo's
    # Both checks below fit the same figures (half a minute each on 2 cores);
    # this test is about the example pages, so the second reuses the first fit.
    fits: list[object] = []
    fit = script.fitted_document

    def fit_once(dataset: object, ctx: object) -> object:
        if not fits:
            fits.append(fit(dataset, ctx))
        return fits[0]

    monkeypatch.setattr(script, "fitted_document", fit_once)
    page.write_text(whole)
    assert script.main(["--check"]) == 0
    page.write_text(cut)
    assert script.main(["--check"]) == 1
    assert f"{page} is stale" in capsys.readouterr().err
