"""The vendored htmx is the npm registry's file, byte for byte."""

from __future__ import annotations

import hashlib

from inferd.console.vendor import VENDOR_DIR, VENDORED


def test_each_vendored_file_matches_its_recorded_checksum() -> None:
    for vendored in VENDORED:
        data = (VENDOR_DIR / vendored.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == vendored.sha256, vendored.name
        assert vendored.version in vendored.name


def test_nothing_unrecorded_is_vendored() -> None:
    recorded = {v.name for v in VENDORED} | {"README.md"}
    assert {p.name for p in VENDOR_DIR.iterdir()} == recorded


def test_the_templates_load_the_vendored_version() -> None:
    base = (VENDOR_DIR.parent.parent / "templates" / "base.html").read_text()
    (htmx,) = VENDORED
    assert f"/console/static/vendor/{htmx.name}" in base
