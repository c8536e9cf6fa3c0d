"""Turning a model reference into a directory an engine can load.

A reference is, tried in this order:

1. a catalog name (`tiny-chat`, `llama-3.1-8b-instruct`): its `source` is
   resolved as below, and the catalog entry comes along;
2. `builtin:NAME`: a tiny local model, built on first use into the cache
   (`inferd.catalog.tiny.ensure_tiny_model`);
3. a local directory: a diffusers pipeline (`model_index.json`) is an image
   model, a transformers checkpoint (`config.json`) a chat model;
4. a Hugging Face repository id `org/name`: downloaded (or found in the
   Hugging Face cache) with `huggingface_hub.snapshot_download`.
   `HF_HUB_OFFLINE=1` means the cache only.

Anything that cannot be had raises `ModelUnavailable`, saying what was tried
and what to do instead; machines here have no network for weights.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferd.catalog.hub import download_hint, hub_unreachable
from inferd.catalog.models import ModelCatalog, ModelSpec

BUILTIN_PREFIX = "builtin:"
_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    kind: str  # "chat" | "image"
    path: Path
    spec: ModelSpec | None  # None: not a catalog model


class ModelUnavailable(Exception):
    """The reference names no model that can be loaded here; the message says why."""


def detect_kind(path: Path) -> str | None:
    if (path / "model_index.json").is_file():
        return "image"
    if (path / "config.json").is_file():
        return pooling_kind(path) or "chat"
    return None


def pooling_kind(path: Path) -> str | None:
    """ "rerank" for a cross-encoder (a sequence-classification head, as BGE's
    reranker), "embedding" for an embedder (a bare encoder such as BERT, or
    any checkpoint that carries sentence-transformers' `modules.json`, as
    Qwen3-Embedding does), None for a generative model."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    architectures = config.get("architectures") or [] if isinstance(config, dict) else []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return "rerank"
    if (path / "modules.json").is_file():
        return "embedding"
    if architectures and all(str(a).endswith("Model") for a in architectures):
        return "embedding"
    return None


def _local_dir(path: Path, ref: str) -> tuple[Path, str]:
    if not path.is_dir():
        raise ModelUnavailable(f"Model {ref!r}: directory {path} does not exist.")
    kind = detect_kind(path)
    if kind is None:
        raise ModelUnavailable(
            f"Model {ref!r}: directory {path} holds neither a diffusers pipeline "
            "(model_index.json) nor a transformers checkpoint (config.json)."
        )
    return path.resolve(), kind


def _builtin(name: str, ref: str, cache_dir: Path | None) -> Path:
    from inferd.catalog.tiny import TINY_BUILDERS, ensure_tiny_model

    if name not in TINY_BUILDERS:
        raise ModelUnavailable(
            f"Model {ref!r}: no built-in model {name!r}; built-in: {', '.join(TINY_BUILDERS)}."
        )
    try:
        return ensure_tiny_model(name, cache_dir)
    except Exception as exc:  # ImportError of diffusers, a full disk, ...
        raise ModelUnavailable(
            f"Model {ref!r}: building the built-in model {name!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _hugging_face(repo_id: str, ref: str, revision: str | None = None) -> Path:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    advice = (
        "No network access to the Hugging Face Hub and no copy in the local Hugging Face "
        "cache: this machine cannot fetch the weights. Download them where a network "
        f"exists ({download_hint(repo_id)}) and pass that local directory "
        "as the model instead (a diffusers pipeline with model_index.json, or a "
        "transformers checkpoint with config.json)."
    )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelUnavailable(
            f"Model {ref!r}: huggingface_hub is not installed, so the Hugging Face repository "
            f"{repo_id!r} cannot be fetched. Pass a local directory instead."
        ) from None
    try:
        # The env var is read here, not only at huggingface_hub's import, so a
        # setting made after import (tests, a supervisor) is honoured too.
        path = snapshot_download(repo_id, revision=revision, local_files_only=True)
        return Path(path)
    except Exception:  # not (completely) in the cache: a download, where possible
        if offline:
            raise ModelUnavailable(
                f"Model {ref!r}: Hugging Face repository {repo_id!r} is not in the local cache "
                f"(HF_HUB_OFFLINE is set: cache only). {advice}"
            ) from None
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise ModelUnavailable(
            f"Model {ref!r}: the Hugging Face Hub cannot be reached ({unreachable}). {advice}"
        )
    try:
        path = snapshot_download(repo_id, revision=revision)
    except Exception as exc:  # offline, unknown repo, gated, timeouts: all "unavailable"
        mode = " (HF_HUB_OFFLINE is set: cache only)" if offline else ""
        raise ModelUnavailable(
            f"Model {ref!r}: could not get Hugging Face repository {repo_id!r}{mode}: "
            f"{type(exc).__name__}: {exc}. {advice}"
        ) from exc
    return Path(path)


def _resolve_source(source: str, ref: str, cache_dir: Path | None) -> tuple[Path, str | None]:
    """A directory for `source` and the kind its contents show (if any)."""
    if source.startswith(BUILTIN_PREFIX):
        path = _builtin(source[len(BUILTIN_PREFIX) :], ref, cache_dir)
        return path, detect_kind(path)
    path = Path(source).expanduser()
    if path.is_absolute() or source.startswith(".") or path.is_dir():
        return _local_dir(path, ref)
    repo_id, _, revision = source.partition("@")  # org/name@revision: a pinned registration
    if _HF_REPO_ID.match(repo_id):
        path = _hugging_face(repo_id, ref, revision or None)
        return path, detect_kind(path)
    raise ModelUnavailable(
        f"Model {ref!r} is not a catalog model, a built-in model (builtin:NAME), an existing "
        "local directory, or a Hugging Face repository id (org/name)."
    )


def resolve_source(source: str, ref: str, cache_dir: Path | None = None) -> Path:
    """A directory for an already resolved model `source` (what a catalog
    entry names): built, found locally, or taken from the Hugging Face cache."""
    path, _ = _resolve_source(source, ref, cache_dir)
    return path


def resolve_model(
    ref: str, catalog: ModelCatalog | None = None, cache_dir: Path | None = None
) -> ResolvedModel:
    """Find or build the model `ref` names; see the module docstring for the order.

    `catalog` None reads the bundled catalog. `cache_dir` is where built-in
    models are built (default: `inferd.catalog.tiny.default_cache_dir()`);
    Hugging Face downloads go to the Hugging Face cache (HF_HOME).
    """
    if catalog is None:
        from inferd.catalog.models import load_models
        from inferd.paths import default_models_dir

        models_dir = default_models_dir()
        catalog = load_models(models_dir) if models_dir.is_dir() else ModelCatalog([])
    # A catalog name, or the source of a catalog entry ("Qwen/Qwen2.5-0.5B-Instruct").
    spec = (
        catalog.get(ref) if ref in catalog else next((s for s in catalog if s.source == ref), None)
    )
    if spec is not None:
        path, _ = _resolve_source(spec.source, ref, cache_dir)
        return ResolvedModel(name=spec.name, kind=spec.kind, path=path, spec=spec)
    path, kind = _resolve_source(ref, ref, cache_dir)
    if kind is None:
        raise ModelUnavailable(
            f"Model {ref!r}: {path} holds neither model_index.json nor config.json."
        )
    repo_id = ref.partition("@")[0]
    name = repo_id if _HF_REPO_ID.match(repo_id) and not Path(ref).is_dir() else path.name
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
    return ResolvedModel(name=name, kind=kind, path=path, spec=None)
