"""Which model classes the engines can serve: vLLM's model registry for chat
models, the diffusers text-to-image pipelines for images (the image engine
loads through `AutoPipelineForText2Image`).

Both libraries are imported lazily, on the first question, in the caller's
thread (registration runs in a worker thread): importing vLLM takes seconds.
Where a library is absent the answer says so instead of guessing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from inferd.catalog.inspect import InspectError


@dataclass(frozen=True)
class Supported:
    """The class names each engine serves; None: that engine is not installed."""

    chat: frozenset[str] | None
    image: frozenset[str] | None


def vllm_architectures() -> frozenset[str] | None:
    try:
        from vllm.model_executor.models import ModelRegistry
    except ImportError:
        return None
    return frozenset(ModelRegistry.get_supported_archs())


def diffusers_pipelines() -> frozenset[str] | None:
    try:
        from diffusers.pipelines.auto_pipeline import AUTO_TEXT2IMAGE_PIPELINES_MAPPING
    except ImportError:
        return None
    return frozenset(cls.__name__ for cls in AUTO_TEXT2IMAGE_PIPELINES_MAPPING.values())


class EngineSupport:
    """Answers "does an engine serve this class?", loading each list once."""

    def __init__(
        self,
        chat: Callable[[], frozenset[str] | None] = vllm_architectures,
        image: Callable[[], frozenset[str] | None] = diffusers_pipelines,
    ) -> None:
        self._loaders = {"chat": chat, "image": image}
        self._cache: dict[str, frozenset[str] | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def fixed(cls, chat: set[str] | None, image: set[str] | None) -> EngineSupport:
        """Fixed lists (for tests and for machines that pin them)."""
        return cls(
            chat=lambda: None if chat is None else frozenset(chat),
            image=lambda: None if image is None else frozenset(image),
        )

    def _names(self, kind: str) -> frozenset[str] | None:
        with self._lock:
            if kind not in self._cache:
                self._cache[kind] = self._loaders[kind]()
            return self._cache[kind]

    def check_chat(self, architecture: str) -> None:
        names = self._names("chat")
        if names is None:
            raise InspectError(
                f"vLLM is not installed on this server, so it cannot check that {architecture} "
                "is a model vLLM serves; install inferd's 'vllm' extra"
            )
        if architecture not in names:
            raise InspectError(
                f"architecture {architecture!r} is not in vLLM's model registry "
                f"({len(names)} architectures); vLLM cannot serve this model"
            )

    def check_image(self, pipeline: str) -> None:
        names = self._names("image")
        if names is None:
            raise InspectError(
                f"diffusers is not installed on this server, so it cannot check that {pipeline} "
                "is a pipeline the image engine serves; install inferd's 'diffusers' extra"
            )
        if pipeline not in names:
            raise InspectError(
                f"pipeline class {pipeline!r} is not a diffusers text-to-image pipeline; the "
                "image engine cannot serve it"
            )
