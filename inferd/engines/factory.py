"""The one place that chooses and builds an engine.

The choice follows the model's kind and what is installed: image models go
to diffusers; chat models to vLLM when it imports, else transformers. Engine
modules are imported only here and only when chosen, so that importing inferd
never pays for torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd.engines.base import Engine, ModelKind

ENGINE_NAMES = ("auto", "vllm", "transformers", "diffusers", "fake")


@dataclass(frozen=True)
class EngineOptions:
    engine: str = "auto"
    # "cpu" or "cuda"; "auto" picks cuda when torch sees a GPU.
    device: str = "auto"
    # Whole GPUs assigned to this replica (indices on this machine).
    gpu_ids: tuple[int, ...] = ()
    dtype: str = "auto"
    max_model_len: int | None = None
    # vLLM on CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.9
    # Fastest settings the engine knows (CUDA graphs, torch.compile, ...).
    optimize: bool = False
    # Chat: vLLM's parser names for tool calls and reasoning (the model's
    # catalog entry gives them; None refuses tools / reports no reasoning).
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # Engine-specific extras, passed through untouched.
    extra: dict[str, Any] = field(default_factory=dict)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_engine(kind: ModelKind, requested: str) -> str:
    if requested not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {requested!r}; choose one of {', '.join(ENGINE_NAMES)}")
    if requested != "auto":
        return requested
    if kind is ModelKind.IMAGE:
        return "diffusers"
    return "vllm" if vllm_available() else "transformers"


def create_engine(name: str, kind: ModelKind, model_path: Path, options: EngineOptions) -> Engine:
    engine = choose_engine(kind, options.engine)
    if engine == "fake":
        from inferd.engines.fake import create_fake_engine

        return create_fake_engine(name, kind, options)
    if kind is ModelKind.IMAGE:
        if engine != "diffusers":
            raise ValueError(f"image model {name!r} needs the diffusers engine, not {engine!r}")
        from inferd.engines.diffusers import DiffusersImageEngine

        return DiffusersImageEngine(name, model_path, options)
    if engine == "vllm":
        from inferd.engines.vllm import VllmTextEngine

        return VllmTextEngine(name, model_path, options)
    if engine == "transformers":
        from inferd.engines.transformers import TransformersTextEngine

        return TransformersTextEngine(name, model_path, options)
    raise ValueError(f"chat model {name!r} cannot be served by the {engine!r} engine")
