"""OpenAI routes answered by vLLM's own serving code (`inferd.engines.vllm_serving`).

Completions on a text model; embeddings, score and rerank on a pooling
model. The replica's part is the same as for chat: admission (a draining or
loading replica refuses with 503, which the gateway retries elsewhere), the
model-name check, the per-route metrics and the token counts that the
replica's usage reports carry. Engines without vLLM's serving code (the
transformers engine, the fakes) refuse these routes with a clear 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api.replica import RESUMED_HEADER
from inferd.engines.base import AdapterRef, ServesAdapters
from inferd.engines.vllm_serving import SseStream, VllmServing, Whole
from inferd.errors import BadRequest, ServiceUnavailable
from inferd.http import parse_json_object, read_body
from inferd.replica.answering import Answering
from inferd.replica.chat import ServedModel, _unless_disconnected, requested_adapter
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState

Call = Callable[[VllmServing, dict[str, Any], Request], Awaitable[Whole | SseStream]]

# route label -> the vLLM serving call that answers it.
CALLS: dict[str, Call] = {
    "completions": lambda serving, body, request: serving.completion(body, request),
    "embeddings": lambda serving, body, request: serving.embedding(body, request),
    "score": lambda serving, body, request: serving.score(body, request),
    "rerank": lambda serving, body, request: serving.rerank(body, request),
}


class ServesOpenAI(Protocol):
    """An engine that carries vLLM's serving objects once it has loaded."""

    @property
    def openai_serving(self) -> VllmServing | None: ...


class VllmRouteHandler:
    def __init__(
        self,
        engine: object,
        route: str,
        path: str,
        state: ReplicaState,
        metrics: ReplicaMetrics,
        model: ServedModel,
        max_body_bytes: int,
    ) -> None:
        self.engine = engine
        self.route = route
        self.path = path
        self.call = CALLS[route]
        self.state = state
        self.metrics = metrics
        self.model = model
        self.max_body_bytes = max_body_bytes

    def _serving(self) -> VllmServing:
        if not hasattr(self.engine, "openai_serving"):
            raise BadRequest(
                f"This replica's engine does not serve {self.path}; it is answered by vLLM's "
                "serving code (the vllm engine).",
                code="unsupported_route",
            )
        serving: VllmServing | None = self.engine.openai_serving
        if serving is None:
            raise ServiceUnavailable(
                "The model is still loading.", code="model_loading", retry_after=1
            )
        return serving

    async def handle(self, request: Request) -> Response:
        with Answering(self.state, self.metrics, self.route, request) as answer:
            body = parse_json_object(await read_body(request, self.max_body_bytes))
            requested = body.get("model")
            adapter = requested_adapter(request, requested if isinstance(requested, str) else None)
            if adapter is not None:
                answer.adapter = adapter.name
                await self._load_adapter(adapter)
            elif isinstance(requested, str):
                self.model.check(requested)
                if requested in self.model.aliases and requested != self.model.name:
                    # vLLM knows the model by its served name only.
                    body["model"] = self.model.name
            produced = 0
            resumed = request.headers.get(RESUMED_HEADER)
            if resumed is not None and self.route == "completions":
                produced = self._resume(body, resumed)
            result = await _unless_disconnected(request, self.call(self._serving(), body, request))
            if result is None:
                answer.status = 499  # client closed the connection; nobody reads this
                return Response(status_code=499)
            if isinstance(result, SseStream):
                stream = result
                stream.produced = produced

                async def close() -> None:
                    await stream.aclose()
                    answer.count(stream.usage.prompt_tokens, stream.usage.completion_tokens)

                return answer.stream(aiter(stream), close)
            answer.count(result.usage.prompt_tokens, result.usage.completion_tokens)
            response: Response = (
                JSONResponse(result.body) if result.response is None else result.response
            )
            answer.status = response.status_code
            return response

    def _resume(self, body: dict[str, Any], resumed: str) -> int:
        """A completion the gateway resumes (its replica was lost): the last
        `resumed` characters of the prompt are the answer so far. Their
        tokens come off `max_tokens`/`min_tokens` and count as completion
        tokens; returns how many there are."""
        prompt = body.get("prompt")
        count = getattr(self.engine, "count_tokens", None)
        if not resumed.isdigit() or not isinstance(prompt, str) or count is None:
            return 0
        chars = int(resumed)
        if not 0 < chars <= len(prompt):
            return 0
        produced = max(0, count(prompt) - count(prompt[:-chars]))
        for name, least in (("max_tokens", 1), ("min_tokens", 0)):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                body[name] = max(least, value - produced)
        return produced

    async def _load_adapter(self, adapter: AdapterRef) -> None:
        """vLLM's serving code resolves an adapter's name itself once it is
        loaded into the engine."""
        if not isinstance(self.engine, ServesAdapters):
            raise BadRequest(
                f"The model '{adapter.name}' is a LoRA adapter; this replica's engine serves none.",
                param="model",
                code="lora_disabled",
            )
        self._serving()  # 503 while the model loads
        await self.engine.load_adapter(adapter)
