"""Where inferd finds its bundled catalog files.

The catalog YAML lives beside the package in the source tree (`models/`,
`configs/`); inferd is installed editable (`pip install -e .`, as
`scripts/install.sh` and `Dockerfile.cuda` do), so these resolve there.
Settings may point elsewhere (`--models-dir`, `--configs-dir`).
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def default_models_dir() -> Path:
    return PROJECT_ROOT / "models" / "catalog"


def default_configs_dir() -> Path:
    return PROJECT_ROOT / "configs"
