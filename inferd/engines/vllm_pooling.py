"""Embedding and reranking models through vLLM's pooling runner, in this process.

vLLM's `AsyncLLM` started with `runner="pooling"`: an embedder (BERT as in
BGE, a decoder as in Qwen3-Embedding) or a cross-encoder (XLM-RoBERTa with a
classification head as in BGE's reranker). Requests are answered by vLLM's
own serving code (`ServingEmbedding`, `ServingScores`, see
`inferd.engines.vllm_serving`); this engine only loads the model, reports
load and health, and shuts down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferd.engines.base import EngineLoad, EngineOptions, PoolingModelInfo
from inferd.engines.vllm import AsyncLLMEngine, engine_args_for, start_async_llm
from inferd.engines.vllm_serving import VllmServing
from inferd.vocab import ModelKind


class VllmPoolingEngine(AsyncLLMEngine):
    def __init__(
        self, name: str, kind: ModelKind, model_path: Path, options: EngineOptions
    ) -> None:
        super().__init__(name, model_path, options)
        self.kind = kind
        self._info: PoolingModelInfo | None = None

    @property
    def info(self) -> PoolingModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    async def start(self) -> None:
        args = pooling_engine_args(self._model_path, self._name, self._options)
        self._engine = await start_async_llm(args, self._options, self._tracker)
        self._openai = await VllmServing.build(self._engine, self._model_path, [self._name])
        self._info = PoolingModelInfo(
            name=self._name,
            context_length=int(self._engine.model_config.max_model_len),
            tasks=tuple(sorted(self._openai.tasks)),
        )

    async def warm_up(self) -> None:
        """One real request through vLLM's serving code before `ready`."""
        serving = self._openai
        assert serving is not None
        if self.kind is ModelKind.RERANK:
            await serving.score({"model": self._name, "text_1": "warm", "text_2": "up"}, None)
        else:
            await serving.embedding({"model": self._name, "input": "warm-up"}, None)

    def load(self) -> EngineLoad:
        running, waiting = self._scheduled()
        return EngineLoad(running=running, waiting=waiting)


def pooling_engine_args(model_path: Path, name: str, options: EngineOptions) -> dict[str, Any]:
    """vLLM's engine arguments for a pooling model (shared with the
    benchmarks and the compatibility tests, so vLLM's own server runs the
    same configuration): the text engine's, with the pooling runner (a
    decoder such as Qwen3-Embedding would otherwise be run to generate)."""
    args = engine_args_for(model_path, name, options)
    args.setdefault("runner", "pooling")
    return args
