"""The engine contract: what the replica server needs from an inference engine.

Engines take engine-neutral frozen dataclasses and never see HTTP or pydantic
wire models. The replica's handlers translate the OpenAI protocol into these
and back. Every engine (vLLM, transformers, diffusers, the test fakes) is
checked by one conformance suite (`tests/integration/test_engine_conformance.py`).

Errors: an engine raises `inferd.errors.BadRequest` for input it refuses
(prompt longer than the context, `max_tokens` too large, a bad stop token, a
bad size); anything else it raises is an internal error for that request only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from inferd.api.engine_settings import NO_ENGINE_SETTINGS, EngineSettings
from inferd.vocab import ModelKind


@dataclass(frozen=True)
class ServingDefaults:
    """What the catalog says about serving a model, beyond its weights.

    Every field is optional: None means "the engine's own default" (an image
    pipeline knows its native size). Image models use the image fields; new
    per-model knobs (chat parsers, ...) join here as optional fields, so an
    older catalog entry stays valid.
    """

    default_steps: int | None = None
    default_guidance_scale: float | None = None
    max_n: int | None = None
    min_side: int | None = None
    max_side: int | None = None
    default_size: tuple[int, int] | None = None
    # Chat: vLLM's parsers for the model's output format (its server's
    # --tool-call-parser / --reasoning-parser); None: requests that need
    # one (tools, reasoning) are refused / report no reasoning.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    def given(self) -> dict[str, Any]:
        """The fields that are set."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


@dataclass(frozen=True)
class EngineOptions:
    """How to run an engine, whatever the engine: device, GPUs, precision.

    `extra` holds engine-specific settings (`--engine-arg KEY=VALUE`); each
    engine reads them into its own typed options with `engine_options`, which
    refuses keys it does not know, so a setting meant for another engine is
    an error instead of a silent no-op (or a crash deep inside vLLM).
    """

    engine: str = "auto"
    # "cpu" or "cuda"; "auto" picks cuda when torch sees a GPU.
    device: str = "auto"
    # Whole GPUs assigned to this replica (indices as this process sees them).
    gpu_ids: tuple[int, ...] = ()
    dtype: str = "auto"
    max_model_len: int | None = None
    # vLLM on CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.9
    # Fastest settings the engine knows (CUDA graphs, torch.compile, ...).
    optimize: bool = False
    serving: ServingDefaults = field(default_factory=ServingDefaults)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The endpoint's engine settings: they override every default above.
    settings: EngineSettings = NO_ENGINE_SETTINGS
    # Where the replica found the draft model the settings name (its
    # weights are on the replica's machine); None: no speculative decoding.
    draft_model_path: Path | None = None

    @property
    def context_limit(self) -> int | None:
        """The context length asked for: the endpoint's, else the server's."""
        return self.settings.maxModelLen or self.max_model_len

    @property
    def weights_dtype(self) -> str:
        """The dtype asked for: the endpoint's, else the server's."""
        return self.settings.dtype or self.dtype


# Engine settings an engine without vLLM's scheduler can honour (the
# transformers engine: context and dtype); it refuses the others.
PORTABLE_SETTINGS = frozenset({"maxModelLen", "dtype"})


def refuse_settings(options: EngineOptions, engine: str, honoured: frozenset[str]) -> None:
    """An engine that cannot apply a setting says so at start, instead of
    serving as if it had."""
    unsupported = sorted(set(options.settings.given()) - honoured)
    if unsupported:
        raise UnknownEngineOption(
            f"the {engine} engine cannot apply the engine setting(s) {', '.join(unsupported)}"
            + (f"; it applies {', '.join(sorted(honoured))}" if honoured else "")
        )


class UnknownEngineOption(ValueError):
    """An `--engine-arg` key the chosen engine does not take."""


_Options = TypeVar("_Options")


def engine_options(cls: type[_Options], extra: Mapping[str, Any], engine: str) -> _Options:
    """`extra` as the engine's typed options dataclass `cls`; unknown keys and
    values of the wrong shape are refused with a message naming them."""
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise UnknownEngineOption(
            f"the {engine} engine takes no option {', '.join(map(repr, unknown))}; "
            f"it knows {', '.join(sorted(known)) or 'none'}"
        )
    values: dict[str, Any] = {}
    for key, value in extra.items():
        default = known[key].default
        try:
            if isinstance(default, bool):
                values[key] = value if isinstance(value, bool) else str(value).lower() == "true"
            elif isinstance(default, int | float) and value is not None:
                values[key] = type(default)(value)
            else:
                values[key] = value
        except (TypeError, ValueError):
            raise UnknownEngineOption(
                f"the {engine} engine's option {key!r} must be a {type(default).__name__}, "
                f"not {value!r}"
            ) from None
    return cls(**values)


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made: whole in a message, or a piece of one
    in a stream delta (the id and name come once, the arguments in parts)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""  # JSON text, or a fragment of it


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    # An assistant turn that called tools; a tool turn answering one.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class ToolOptions:
    """The tools a request offers the model, in the OpenAI shape."""

    tools_json: str  # JSON text of the OpenAI `tools` list
    # "auto" | "none" | "required", or the name of the one function to call.
    choice: str = "auto"
    named: bool = False  # `choice` names a function
    parallel: bool = True


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None
    # The most likely tokens at this step: (token, logprob, bytes).
    top: tuple[tuple[str, float, tuple[int, ...] | None], ...] = ()


@dataclass(frozen=True)
class SamplingOptions:
    # None: as many as the context leaves after the prompt.
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # Extensions vLLM's own server accepts; benchmarks need fixed lengths.
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # token id -> bias in [-100, 100]
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Structured output: at most one of these.
    json_schema: str | None = None  # JSON text of a schema
    regex: str | None = None
    json_object: bool = False


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter a request names: its name (the request's `model`) and
    where the replica loads it from (a directory or a repository id, as the
    gateway says)."""

    name: str
    source: str


@runtime_checkable
class ServesAdapters(Protocol):
    """An engine that serves LoRA adapters, loading each on demand."""

    async def load_adapter(self, adapter: AdapterRef) -> None:
        """Have `adapter` loaded (at once if it is); 4xx if it cannot be."""
        ...


@dataclass(frozen=True)
class Resume:
    """An answer another replica began, to go on with by token ids: the
    output token ids it produced, and the text of them its client has read
    (a prefix of their decoded text: the engine's detokenizer may have held
    back the text of the last ones)."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class TextRequest:
    request_id: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    tools: ToolOptions | None = None
    # None: no logprobs; n: each token's logprob and the n likeliest.
    logprobs: int | None = None
    # False: the client reads the answer whole, so an engine may parse the
    # output (tool calls, reasoning) once at the end instead of per delta.
    stream: bool = True
    # The LoRA adapter to generate with; None: the base model.
    adapter: AdapterRef | None = None
    # The chat template's switches (vLLM's names): continue the final
    # assistant message rather than open a new turn.
    continue_final: bool = False
    generation_prompt: bool = True
    # The final assistant message is this request's own earlier output (the
    # gateway resumes an answer whose replica died): its tokens are counted
    # as completion tokens and against max_tokens/min_tokens.
    resumed: bool = False
    # Go on with an answer another replica began, from its token ids: the
    # prompt is this request's own followed by them (engines that replay
    # token ids; see `inferd.engines.resume`).
    resume: Resume | None = None
    # W3C trace context of the replica's span (`traceparent`), for engines
    # that trace their own steps; () when the request is not traced.
    trace_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """One step of a generation, yielded by `TextEngine.generate`.

    `text` is the newly decoded text (may be empty while a multi-byte
    character is incomplete). The last delta has `finish_reason` set
    ("stop" or "length") and carries the final token counts.
    """

    text: str
    completion_tokens: int  # cumulative
    prompt_tokens: int
    finish_reason: str | None = None  # also "tool_calls"
    # Parsed out of the output when the model has parsers: its reasoning
    # (apart from `text`, the answer) and the tool calls it made.
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    # The output token ids of this step (engines that report them; the
    # gateway replays them to continue the answer on another replica).
    token_ids: tuple[int, ...] = ()
    # Of a resumed answer's replayed ids, how many last ones this engine
    # generates again instead (they ended inside a character): the ids
    # named so far lose that many (`resume.first_text`).
    regenerated: int = 0


@dataclass(frozen=True)
class EngineLoad:
    """Point-in-time load, reported to the registry and in /metrics."""

    running: int
    waiting: int
    # Fraction of the KV cache in use (vLLM); None where not meaningful.
    kv_cache_usage: float | None = None
    # Tokens the KV cache holds; None where not meaningful.
    kv_cache_tokens: int | None = None
    # Prompt tokens looked up in the prefix cache since start, and how many
    # were found there (vLLM's automatic prefix caching); the hit rate over
    # any period is the ratio of their differences.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # LoRA adapters loaded now (a request naming one prefers this replica).
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class TextModelInfo:
    name: str
    context_length: int
    vocab_size: int


@dataclass(frozen=True)
class PoolingModelInfo:
    name: str
    context_length: int
    # vLLM's pooling tasks the model supports ("embed", "classify", ...).
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageRequest:
    request_id: str
    prompt: str
    n: int = 1
    width: int = 1024
    height: int = 1024
    negative_prompt: str | None = None
    num_inference_steps: int | None = None  # None: the model's default
    guidance_scale: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class ImageModelInfo:
    name: str
    default_size: tuple[int, int]
    max_n: int
    min_side: int
    max_side: int
    # Both sides must be a multiple of this (the VAE's downsampling factor
    # times the UNet's).
    side_multiple: int
    default_steps: int


@runtime_checkable
class TextEngine(Protocol):
    kind: ModelKind  # ModelKind.CHAT
    # Whether it resumes a request by replaying token ids (`TextRequest.resume`);
    # one that does not is given the text continuation instead.
    replays_token_ids: bool

    @property
    def info(self) -> TextModelInfo: ...

    async def start(self) -> None:
        """Load the model. Called once before any request."""

    def generate(self, request: TextRequest) -> AsyncIterator[TextDelta]:
        """Stream deltas. Validation errors raise before the first delta.

        Closing the iterator early (client went away) aborts the request
        in the engine: the engine's running count drops.
        """
        ...

    def load(self) -> EngineLoad: ...

    async def check_health(self) -> None:
        """Raise if the engine can no longer serve (dead worker, ...)."""

    async def shutdown(self) -> None: ...


@runtime_checkable
class ImageEngine(Protocol):
    kind: ModelKind  # ModelKind.IMAGE

    @property
    def info(self) -> ImageModelInfo: ...

    async def start(self) -> None: ...

    async def generate(self, request: ImageRequest) -> list[bytes]:
        """Return `request.n` PNG-encoded images."""
        ...

    def load(self) -> EngineLoad: ...

    async def check_health(self) -> None: ...

    async def shutdown(self) -> None: ...


@runtime_checkable
class PoolingEngine(Protocol):
    """An embedding or reranking model. Its requests are answered by vLLM's
    own serving code (`openai_serving`), not through engine-neutral requests:
    only the vLLM engine serves these kinds."""

    kind: ModelKind  # ModelKind.EMBEDDING | ModelKind.RERANK

    @property
    def info(self) -> PoolingModelInfo: ...

    async def start(self) -> None: ...

    async def warm_up(self) -> None: ...

    def load(self) -> EngineLoad: ...

    async def check_health(self) -> None: ...

    async def shutdown(self) -> None: ...


Engine = TextEngine | ImageEngine | PoolingEngine


def validate_image_request(info: ImageModelInfo, request: ImageRequest) -> None:
    """Shared size/n checks, so every image engine refuses the same inputs."""
    from inferd.errors import BadRequest

    if not 1 <= request.n <= info.max_n:
        raise BadRequest(
            f"'n' must be between 1 and {info.max_n} for model {info.name}.", param="n"
        )
    for side in (request.width, request.height):
        if not info.min_side <= side <= info.max_side or side % info.side_multiple:
            raise BadRequest(
                f"'size' {request.width}x{request.height} is not supported by model "
                f"{info.name}: each side must be between {info.min_side} and "
                f"{info.max_side} and a multiple of {info.side_multiple}.",
                param="size",
            )
    if request.num_inference_steps is not None and not 1 <= request.num_inference_steps <= 200:
        raise BadRequest("'steps' must be between 1 and 200.", param="steps")
