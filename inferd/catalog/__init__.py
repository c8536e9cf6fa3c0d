"""Model catalog, GPU types, locations and prices, the GPU recommender, and
model reference resolution.

Importing this package is cheap (PyYAML only): engines, torch and
huggingface_hub are imported where they are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferd.catalog.gpus import GpuCatalog, GpuType, Location, load_gpus
from inferd.catalog.models import (
    CatalogError,
    ChatArchitecture,
    ImageArchitecture,
    ModelCatalog,
    ModelSpec,
    load_models,
)
from inferd.catalog.recommend import GpuOption, Recommendation, recommend
from inferd.catalog.resolve import ModelUnavailable, ResolvedModel, resolve_model
from inferd.paths import default_configs_dir, default_models_dir

__all__ = [
    "Catalog",
    "CatalogError",
    "ChatArchitecture",
    "GpuCatalog",
    "GpuOption",
    "GpuType",
    "ImageArchitecture",
    "Location",
    "ModelCatalog",
    "ModelSpec",
    "ModelUnavailable",
    "Recommendation",
    "ResolvedModel",
    "load_catalog",
    "recommend",
    "resolve_model",
]


@dataclass(frozen=True)
class Catalog:
    models: ModelCatalog
    gpus: GpuCatalog


def load_catalog(models_dir: Path | None = None, configs_dir: Path | None = None) -> Catalog:
    """Read `models_dir/*.yaml` and `configs_dir/{gpus,locations}.yaml`.

    Raises `CatalogError` (a ValueError) naming the file and field at fault.
    """
    return Catalog(
        models=load_models(models_dir or default_models_dir()),
        gpus=load_gpus(configs_dir or default_configs_dir()),
    )
