"""Rules of the code's shape that a review would otherwise have to re-check
by hand: one vocabulary for model kinds."""

from __future__ import annotations

import re
from pathlib import Path

INFERD = Path(__file__).resolve().parents[2] / "inferd"

# A kind compared with a bare string ("chat", 'image'): a typo there is a
# silent False, where `ModelKind.CHAT` (or `kinds.CHAT` in a template) fails loudly.
BARE_KIND_COMPARISON = re.compile(r"kind ?[!=]= ?['\"]")


def test_model_kinds_are_compared_only_through_model_kind() -> None:
    found = [
        f"{path.relative_to(INFERD.parent)}:{n}: {line.strip()}"
        for path in sorted(INFERD.rglob("*"))
        if path.suffix in (".py", ".html")
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if BARE_KIND_COMPARISON.search(line)
    ]
    assert found == []


def test_the_rule_finds_what_it_is_for() -> None:
    assert BARE_KIND_COMPARISON.search('if model.kind == "chat":')
    assert BARE_KIND_COMPARISON.search("{% if row.model_kind != 'image' %}")
    assert not BARE_KIND_COMPARISON.search("if model.kind == ModelKind.CHAT:")
