"""The one place that chooses and builds an engine.

The choice follows the model's kind and what is installed: image models go
to diffusers; chat models to vLLM when it imports, else transformers. Engine
modules are imported only here and only when chosen, so that importing inferd
never pays for torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from inferd.engines.base import Engine, EngineOptions
from inferd.vocab import ModelKind

ENGINE_NAMES = ("auto", "vllm", "transformers", "diffusers", "fake")


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_engine(kind: ModelKind, requested: str) -> str:
    if requested not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {requested!r}; choose one of {', '.join(ENGINE_NAMES)}")
    if requested != "auto":
        return requested
    if kind is ModelKind.IMAGE:
        return "diffusers"
    if kind.pooling:
        return "vllm"  # the only engine with a pooling runner
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
    if kind.pooling:
        if engine != "vllm":
            raise ValueError(f"{kind.value} model {name!r} needs the vllm engine, not {engine!r}")
        from inferd.engines.vllm_pooling import VllmPoolingEngine

        return VllmPoolingEngine(name, kind, model_path, options)
    if engine == "vllm":
        from inferd.engines.vllm import VllmTextEngine

        return VllmTextEngine(name, model_path, options)
    if engine == "transformers":
        from inferd.engines.transformers import TransformersTextEngine

        return TransformersTextEngine(name, model_path, options)
    raise ValueError(f"chat model {name!r} cannot be served by the {engine!r} engine")
