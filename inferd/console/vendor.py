"""The browser files vendored into the console, with where they came from.

A test recomputes each checksum; `scripts/vendor_htmx.sh` reproduces the file
from the npm registry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VENDOR_DIR = Path(__file__).parent / "static" / "vendor"


@dataclass(frozen=True)
class VendoredFile:
    name: str
    package: str
    version: str
    path_in_package: str
    sha256: str


HTMX = VendoredFile(
    name="htmx-2.0.11.min.js",
    package="htmx.org",
    version="2.0.11",
    path_in_package="package/dist/htmx.min.js",
    sha256="d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717",
)

VENDORED = (HTMX,)
