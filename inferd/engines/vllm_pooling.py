"""Embedding and reranking models through vLLM's pooling runner, in this process.

vLLM's `AsyncLLM` started with `runner="pooling"`: an embedder (BERT as in
BGE, a decoder as in Qwen3-Embedding) or a cross-encoder (XLM-RoBERTa with a
classification head as in BGE's reranker). Requests are answered by vLLM's
own serving code (`ServingEmbedding`, `ServingScores`, see
`inferd.engines.vllm_serving`); this engine only loads the model, reports
load and health, and shuts down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from inferd.engines.base import EngineLoad, EngineOptions, PoolingModelInfo
from inferd.engines.vllm import (
    _LoadTracker,
    engine_args_for,
    start_async_llm,
    vllm_engine_args,
)
from inferd.engines.vllm_serving import VllmServing
from inferd.vocab import ModelKind


class VllmPoolingEngine:
    def __init__(
        self, name: str, kind: ModelKind, model_path: Path, options: EngineOptions
    ) -> None:
        self.kind = kind
        self._name = name
        self._model_path = model_path
        self._options = options
        vllm_engine_args(options.extra)  # refuse unknown options now, not at start
        self._engine: Any = None
        self._openai: VllmServing | None = None
        self._info: PoolingModelInfo | None = None
        self._tracker = _LoadTracker()

    @property
    def info(self) -> PoolingModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    @property
    def openai_serving(self) -> VllmServing | None:
        return self._openai

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
        unfinished = self._engine.get_num_unfinished_requests() if self._engine else 0
        running = min(unfinished, self._tracker.running) if unfinished else 0
        return EngineLoad(running=running, waiting=max(0, unfinished - running))

    async def check_health(self) -> None:
        if self._engine is None:
            raise RuntimeError("engine not started")
        await self._engine.check_health()

    async def shutdown(self) -> None:
        self._openai = None
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await asyncio.to_thread(engine.shutdown)


def pooling_engine_args(model_path: Path, name: str, options: EngineOptions) -> dict[str, Any]:
    """vLLM's engine arguments for a pooling model (shared with the
    benchmarks and the compatibility tests, so vLLM's own server runs the
    same configuration): the text engine's, with the pooling runner (a
    decoder such as Qwen3-Embedding would otherwise be run to generate)."""
    args = engine_args_for(model_path, name, options)
    args.setdefault("runner", "pooling")
    return args
