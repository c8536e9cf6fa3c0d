"""vLLM's own OpenAI serving code over the replica's running engine.

Completions (and, for pooling models, embeddings, score and rerank) are
answered by the very classes vLLM's `vllm serve` answers them with
(`OpenAIServingCompletion`, `ServingEmbedding`, `ServingScores`), built by
vLLM's own `init_app_state` from arguments parsed by vLLM's own command-line
parser: `echo`, `logprobs`, `stop`, `n`, `suffix` refusals, prompt-length
checks, base64 embeddings and `dimensions` behave exactly as in vLLM's server.
What is inferd's: the error shape (vLLM's `ErrorResponse` and its exceptions
become `inferd.errors`), and the usage count every answer reports.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from inferd.engines.client_errors import client_error, validation_error
from inferd.errors import (
    BadRequest,
    InferdError,
    InternalError,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
)

logger = logging.getLogger(__name__)

# vLLM's statuses that have an inferd error of their own. 422 (a value
# vLLM cannot process) and 501 (a feature it does not implement) are the
# client's to change: a 400, as for every refusal of a request's content.
_BY_STATUS: dict[int, type[InferdError]] = {
    400: BadRequest,
    422: BadRequest,
    501: BadRequest,
    404: NotFound,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Whole:
    """A whole (not streamed) answer and the tokens it used: `body` to send
    as JSON, or `response`, the HTTP response vLLM built itself (pooling
    answers, which vLLM encodes as JSON or as raw bytes)."""

    usage: Usage
    body: dict[str, Any] | None = None
    response: Any = None


class VllmServing:
    """The serving objects of vLLM's OpenAI server, sharing one `AsyncLLM`."""

    def __init__(self, state: Any, tasks: Sequence[str]) -> None:
        self._state = state
        self.tasks = frozenset(tasks)

    @classmethod
    async def build(
        cls,
        engine_client: Any,
        model_path: Path,
        served_names: Sequence[str],
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> VllmServing:
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        # The server-level arguments only (logging, chat template, ...); the
        # engine's own were given to AsyncLLM already.
        argv = ["--model", str(model_path), "--served-model-name", *served_names]
        if tool_call_parser:
            # Tools offered through the Messages and Responses APIs are
            # parsed as the chat route parses them (tool_choice auto).
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
        if reasoning_parser:
            argv += ["--reasoning-parser", reasoning_parser]
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        # vLLM's server keeps these on its app's `state`: any attribute bag does.
        state = SimpleNamespace()
        tasks = tuple(await engine_client.get_supported_tasks())
        await init_app_state(engine_client, state, args, tasks)
        return cls(state, tasks)

    @property
    def models(self) -> Any:
        """vLLM's `OpenAIServingModels`: the served names and LoRA adapters."""
        return self._state.openai_serving_models

    # -- the routes -----------------------------------------------------------

    async def completion(self, body: dict[str, Any], raw_request: Any) -> Whole | SseStream:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        handler = self._state.openai_serving_completion
        if handler is None:
            raise BadRequest(
                "This model does not generate text; /v1/completions is not available on it.",
                code="unsupported_route",
            )
        request = _validate(CompletionRequest, body)
        # Usage is counted for every answer, so the engine always reports it;
        # the usage chunk is kept from a client that did not ask for it.
        client_wants_usage = bool(request.stream_options and request.stream_options.include_usage)
        if request.stream:
            from vllm.entrypoints.generate.base.protocol import StreamOptions

            options = request.stream_options or StreamOptions()
            request.stream_options = options.model_copy(update={"include_usage": True})
        result = await _call(lambda: handler.create_completion(request, raw_request))
        if isinstance(result, AsyncIterator):
            return SseStream(result, forward_usage=client_wants_usage)
        body = result.model_dump()
        usage = body.get("usage") or {}
        counted = Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
        return Whole(counted, body=body)

    async def responses(self, body: dict[str, Any], raw_request: Any) -> Whole | SseStream:
        """OpenAI's Responses API, answered by vLLM's `OpenAIServingResponses`.
        Nothing is stored: a response would live in one replica's memory, so
        `GET /v1/responses/{id}` and `previous_response_id` would work only
        when the next request happened to reach the same replica. Asking for
        storage is a 400 that says so (omitting `store` works, unstored, as
        on vLLM's own server)."""
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

        handler = getattr(self._state, "openai_serving_responses", None)
        if handler is None:
            raise BadRequest(
                "This model does not generate text; /v1/responses is not available on it.",
                code="unsupported_route",
            )
        for field, why in _UNSTORED:
            if body.get(field):
                raise BadRequest(why, param=field, code="unsupported_parameter")
        request = _validate(ResponsesRequest, {**body, "store": False})
        result = await _call(lambda: handler.create_responses(request, raw_request))
        if isinstance(result, AsyncIterator):
            return SseStream(_responses_events(result), forward_usage=True, usage=_responses_usage)
        answer = result.model_dump(mode="json", by_alias=True)
        return Whole(_responses_usage(answer) or Usage(), body=answer)

    async def messages(self, body: dict[str, Any], raw_request: Any) -> Whole | SseStream:
        """Anthropic's Messages API, answered by vLLM's `AnthropicServingMessages`."""
        from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

        handler = getattr(self._state, "anthropic_serving_messages", None)
        if handler is None:
            raise BadRequest(
                "This model does not generate text; /v1/messages is not available on it.",
                code="unsupported_route",
            )
        request = _validate(AnthropicMessagesRequest, body)
        result = await _call(lambda: handler.create_messages(request, raw_request))
        if isinstance(result, AsyncIterator):
            return SseStream(result, forward_usage=True, usage=_messages_usage)
        answer = result.model_dump(exclude_none=True)
        return Whole(_messages_usage(answer) or Usage(), body=answer)

    async def embedding(self, body: dict[str, Any], raw_request: Any) -> Whole:
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest

        handler = getattr(self._state, "serving_embedding", None)
        if handler is None:
            raise BadRequest(
                "This model does not make embeddings; /v1/embeddings is not available on it.",
                code="unsupported_route",
            )
        if body.get("input") == []:
            # Refused here whatever vLLM makes of it: an empty batch is a
            # client's mistake, never a request worth a round trip.
            raise BadRequest("'input' must not be an empty list.", param="input")
        request = _validate_union(EmbeddingRequest, body)
        return _whole(await _call(lambda: handler(request, raw_request)))

    async def score(self, body: dict[str, Any], raw_request: Any) -> Whole:
        from vllm.entrypoints.pooling.scoring.protocol import ScoreRequest

        handler = self._scores("score")
        request = _validate_union(ScoreRequest, body)
        return _whole(await _call(lambda: handler(request, raw_request)))

    async def rerank(self, body: dict[str, Any], raw_request: Any) -> Whole:
        from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

        handler = self._scores("rerank")
        request = _validate(RerankRequest, body)
        return _whole(await _call(lambda: handler(request, raw_request)))

    def _scores(self, route: str) -> Any:
        handler = getattr(self._state, "serving_scores", None)
        if handler is None:
            raise BadRequest(
                f"This model does not score text pairs; /{route} is not available on it.",
                code="unsupported_route",
            )
        return handler


# What a Responses request may not ask of a replica that stores nothing.
_UNSTORED = (
    (
        "store",
        "inferd endpoints do not store responses (a stored response would live on one "
        "replica of the endpoint); send store: false or leave it out.",
    ),
    (
        "previous_response_id",
        "inferd endpoints do not store responses, so a conversation cannot continue from "
        "one; send the earlier turns in `input` instead.",
    ),
    (
        "background",
        "inferd endpoints do not run responses in the background (they are not stored); "
        "leave `background` out.",
    ),
)


def _responses_usage(data: dict[str, Any]) -> Usage | None:
    """The tokens of a Responses answer, or of its `response.completed` event."""
    response = data.get("response", data)
    counted = response.get("usage") if isinstance(response, dict) else None
    if not counted:
        return None
    return Usage(counted.get("input_tokens") or 0, counted.get("output_tokens") or 0)


def _messages_usage(data: dict[str, Any]) -> Usage | None:
    """The tokens of a Messages answer; streamed, `message_start` carries the
    input tokens and `message_delta` the output tokens so far."""
    counted = data.get("usage") or (data.get("message") or {}).get("usage")
    if not counted:
        return None
    return Usage(counted.get("input_tokens") or 0, counted.get("output_tokens") or 0)


async def _responses_events(events: AsyncIterator[Any]) -> AsyncIterator[str]:
    """vLLM's Responses stream objects as server-sent events, as vLLM's server writes them."""
    async for event in events:
        kind = getattr(event, "type", "unknown")
        yield f"event: {kind}\ndata: {event.model_dump_json(indent=None, by_alias=True)}\n\n"


class SseStream:
    """vLLM's server-sent events, relayed as they come, with the tokens used
    read from the usage chunk (which is not relayed unless the client asked
    for it). `usage`: how another API's events carry the counts (Responses,
    Messages); those streams are relayed whole."""

    def __init__(
        self,
        events: AsyncIterator[str],
        forward_usage: bool,
        usage: Callable[[dict[str, Any]], Usage | None] | None = None,
    ) -> None:
        self._events = events
        self._forward_usage = forward_usage
        self._read_usage = usage
        self.usage = Usage()
        # Tokens of the prompt that are the answer's own (a resumed answer,
        # see `inferd.engines.resume`): counted as completion tokens.
        self.produced = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._read_usage is not None:
            async for event in self._events:
                self._count(event)
                yield event.encode()
            return
        async for event in self._events:
            # Parse only a chunk that may carry counts (vLLM writes compact
            # JSON, `"usage":null` on the others).
            if '"usage"' in event and '"usage":null' not in event and event.startswith("data: {"):
                data = json.loads(event[len("data: ") :])
                counted = data.get("usage")
                if counted:
                    produced = self.produced
                    prompt = max(0, (counted.get("prompt_tokens") or 0) - produced)
                    completion = (counted.get("completion_tokens") or 0) + produced
                    self.usage = Usage(prompt, completion)
                    if produced:
                        counted["prompt_tokens"] = prompt
                        counted["completion_tokens"] = completion
                        event = "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"
                if not data.get("choices") and not self._forward_usage:
                    continue
            yield event.encode()

    def _count(self, event: str) -> None:
        if '"usage"' not in event or self._read_usage is None:
            return
        for line in event.splitlines():
            if line.startswith("data: {"):
                counted = self._read_usage(json.loads(line[len("data: ") :]))
                if counted is not None:
                    # Messages streams give input tokens first, output later.
                    self.usage = Usage(
                        counted.prompt_tokens or self.usage.prompt_tokens,
                        counted.completion_tokens or self.usage.completion_tokens,
                    )

    async def aclose(self) -> None:
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()


_PROMPT_TOKENS = re.compile(rb'"usage":\{[^}]*"prompt_tokens":(\d+)')


def _whole(response: Any) -> Whole:
    """A pooling answer (vLLM builds the response itself, as JSON or as
    bytes); its prompt tokens read from the usage it carries."""
    body = getattr(response, "body", b"")
    found = _PROMPT_TOKENS.search(body) if isinstance(body, bytes) else None
    return Whole(Usage(prompt_tokens=int(found.group(1)) if found else 0), response=response)


def _validate(model: Any, body: dict[str, Any]) -> Any:
    return _validated(lambda: model.model_validate(body))


def _validate_union(union: Any, body: dict[str, Any]) -> Any:
    """A request type that is a union of shapes (vLLM's `EmbeddingRequest`
    and `ScoreRequest` are), validated as FastAPI does for vLLM's server."""
    from pydantic import TypeAdapter

    return _validated(lambda: TypeAdapter(union).validate_python(body))


def _validated(validate: Callable[[], Any]) -> Any:
    """Validation is a function of the body alone, so whatever it raises is
    a refusal of the body: vLLM's model validators raise its own
    `VLLMValidationError` (not a `ValueError`, so pydantic lets it through),
    and a `TypeError` or `AttributeError` where a field has a type they did
    not expect (`"prompt_logprobs": "x"` compared with 0)."""
    from pydantic import ValidationError

    try:
        return validate()
    except ValidationError as exc:
        raise validation_error(exc) from None
    except Exception as exc:
        refusal = client_error(exc)
        if refusal is not None:
            raise refusal from None
        logger.info("a request body failed vLLM's validation: %r", exc)
        raise BadRequest(f"The request body is not valid: {exc}") from None


async def _call(call: Callable[[], Awaitable[Any]]) -> Any:
    """Run one vLLM serving call; its error answers and exceptions become
    inferd's errors with the status vLLM's server gives them (its own
    `create_error_response`, which its app's exception handlers use)."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.exception_handling.error_response import (
        create_error_response,
    )
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        result = await call()
    except InferdError:
        raise
    except EngineDeadError as exc:
        # Nothing was answered: the gateway may retry on another replica.
        raise ServiceUnavailable(
            f"The engine of this replica has died: {exc}", code="engine_dead", retry_after=1
        ) from None
    except Exception as exc:
        result = create_error_response(exc)
    if isinstance(result, ErrorResponse):
        error = result.error
        cls = _BY_STATUS.get(int(error.code))
        if cls is None:
            raise InternalError(error.message)
        raise cls(error.message, param=error.param)
    return result
