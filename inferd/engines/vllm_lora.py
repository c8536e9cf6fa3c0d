"""LoRA adapters of one vLLM engine, loaded on demand.

vLLM's own dynamic loading does the work: an adapter is registered with the
serving code's model registry (`OpenAIServingModels.load_lora_adapter`,
what vLLM's server answers `/v1/load_lora_adapter` with), which adds it to
the engine (`add_lora`), so that vLLM's completions resolve it by name as
chat does here. The engine holds at most `max_loras` adapters (its LRU
cache evicts the least recently used); one evicted and named again is
added again. What is loaded now is read back from the engine
(`list_loras`) after every change, for the replica's reports: the gateway
sends a request naming an adapter to a replica that holds it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from inferd.engines.base import AdapterRef
from inferd.errors import BadRequest, InferdError, NotFound

logger = logging.getLogger(__name__)


class VllmAdapters:
    def __init__(self, engine: Any, models: Any) -> None:
        """`engine`: the AsyncLLM (started with enable_lora); `models`: vLLM's
        `OpenAIServingModels` over it."""
        self._engine = engine
        self._models = models
        self._locks: dict[str, asyncio.Lock] = {}
        self._loaded: tuple[str, ...] = ()
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def loaded(self) -> tuple[str, ...]:
        """Names of the adapters the engine holds now (last read)."""
        return self._loaded

    async def request_for(self, adapter: AdapterRef) -> Any:
        """vLLM's `LoRARequest` for `adapter`, loaded into the engine."""
        known = self._models.lora_requests.get(adapter.name)
        fresh = known is not None and known.lora_path == adapter.source
        if fresh and adapter.name in self._loaded:
            self._refresh_soon()  # another adapter may have evicted it since
            return known
        lock = self._locks.setdefault(adapter.name, asyncio.Lock())
        async with lock:
            known = self._models.lora_requests.get(adapter.name)
            if known is not None and known.lora_path != adapter.source:
                # Removed and registered again from elsewhere: new weights.
                await self._forget(known)
                known = None
            if known is None:
                await self._load(adapter)
                known = self._models.lora_requests[adapter.name]
            elif adapter.name not in self._loaded:
                await self._engine.add_lora(known)
            await self._refresh()
        return known

    async def _load(self, adapter: AdapterRef) -> None:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        result = await self._models.load_lora_adapter(
            LoadLoRAAdapterRequest(lora_name=adapter.name, lora_path=adapter.source)
        )
        if isinstance(result, ErrorResponse):
            error = result.error
            cls: type[InferdError] = NotFound if int(error.code) == 404 else BadRequest
            raise cls(
                f"LoRA adapter '{adapter.name}' cannot be loaded from {adapter.source}: "
                f"{error.message}",
                param="model",
                code="adapter_unavailable",
            )
        logger.info("LoRA adapter %s loaded from %s", adapter.name, adapter.source)

    async def _forget(self, known: Any) -> None:
        from vllm.entrypoints.serve.lora.protocol import UnloadLoRAAdapterRequest

        await self._models.unload_lora_adapter(
            UnloadLoRAAdapterRequest(lora_name=known.lora_name, lora_int_id=known.lora_int_id)
        )
        await self._engine.remove_lora(known.lora_int_id)

    async def _refresh(self) -> None:
        held = set(await self._engine.list_loras())
        self._loaded = tuple(
            sorted(n for n, r in self._models.lora_requests.items() if r.lora_int_id in held)
        )

    def _refresh_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            await self._refresh()
        except Exception as exc:  # the engine is going away: the next report says so
            logger.debug("could not read the engine's loaded adapters: %s", exc)
