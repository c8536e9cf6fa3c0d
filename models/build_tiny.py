"""Build a tiny local model into the model cache and print its directory.

    python models/build_tiny.py tiny-chat [--cache-dir DIR]
    python models/build_tiny.py tiny-sdxl

The same as `inferd models build NAME`; builds are deterministic and cached
(a second run returns at once).
"""

from __future__ import annotations

import sys

from inferd.cli import main

if __name__ == "__main__":
    sys.exit(main(["models", "build", *sys.argv[1:]]))
