"""Tiny local models of real architectures, built on demand and cached.

`ensure_tiny_model("tiny-chat", cache_dir)` returns a directory that vLLM,
transformers or diffusers can load like any Hugging Face checkout. The
directory name carries a fingerprint of the builder's source, so a change to a
builder rebuilds instead of serving stale weights. Builds go to a temporary
directory and are renamed into place under a file lock, so replicas started
at the same moment neither race nor see half-written files.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from inferd.quiet_warnings import drop_torchvision_fallback_warning

# name -> (module, builder function). Builders take an output directory.
TINY_BUILDERS: dict[str, tuple[str, str]] = {
    "tiny-chat": ("inferd.catalog.tiny_chat", "build_tiny_chat"),
    "tiny-sdxl": ("inferd.catalog.tiny_sdxl", "build_tiny_sdxl"),
    "tiny-embed": ("inferd.catalog.tiny_pooling", "build_tiny_embed"),
    "tiny-qwen3-embed": ("inferd.catalog.tiny_pooling", "build_tiny_qwen3_embed"),
    "tiny-rerank": ("inferd.catalog.tiny_pooling", "build_tiny_rerank"),
}


def default_cache_dir() -> Path:
    base = os.environ.get("INFERD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "inferd"
    )
    return Path(base) / "models"


def _builder(name: str) -> Callable[[Path], None]:
    try:
        module_name, func_name = TINY_BUILDERS[name]
    except KeyError:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(TINY_BUILDERS)}") from None
    builder: Callable[[Path], None] = getattr(importlib.import_module(module_name), func_name)
    return builder


def fingerprint(name: str) -> str:
    module_name, _ = TINY_BUILDERS[name]
    source = inspect.getsource(importlib.import_module(module_name))
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def ensure_tiny_model(name: str, cache_dir: Path | None = None) -> Path:
    """Build `name` into the cache unless an identical build is there already."""
    build = _builder(name)
    cache_dir = cache_dir or default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"{name}-{fingerprint(name)}"
    if (target / ".complete").exists():
        return target
    with open(cache_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir))
        # Not in the builders: their source is the build's fingerprint.
        drop_torchvision_fallback_warning()
        try:
            build(tmp)
            (tmp / ".complete").write_text("ok\n")
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
