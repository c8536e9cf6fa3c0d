"""Wire models of the OpenAI-compatible surface (requests), and response builders.

Requests are validated strictly (a string where a number belongs is a 400,
not a silent coercion). Fields the OpenAI clients send that inferd does not
act on are ignored rather than refused, as OpenAI itself does for unknown
fields (and vLLM's server for the same ones: metadata, store, service_tier...).
Tools are checked against vLLM's own request model by the engine.

Responses are built as plain dicts: on the streaming hot path a pydantic
model per chunk costs more than the rest of the replica's work.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Request bounds (spec section 8 leaves them to us).
MAX_MESSAGES = 256
MAX_MESSAGE_CHARS = 200_000
MAX_STOP_SEQUENCES = 16
MAX_CHAT_N = 8
MAX_PROMPT_CHARS = 4_000
MAX_TOOLS = 128


REQUEST_ID_PATTERN = r"^[!-~]+$"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCallIn(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)]


class ToolCallIn(_Strict):
    id: Annotated[str, Field(max_length=256)]
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)] | list[TextContentPart] | None
    name: str | None = None
    # An assistant turn's calls; a tool turn's answer to one of them.
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None

    @model_validator(mode="after")
    def _bounded(self) -> ChatMessageIn:
        # The same cap whether the content is a string or a list of parts.
        parts = self.content if isinstance(self.content, list) else ()
        if sum(len(part.text) for part in parts) > MAX_MESSAGE_CHARS:
            raise ValueError(f"a message's content must be at most {MAX_MESSAGE_CHARS} characters")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class FunctionDefinition(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's extension: exactly one of these constrains the output."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None


class ChatCompletionRequest(_Strict):
    model: str | None = None
    messages: Annotated[list[ChatMessageIn], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHAT_N)] = 1
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tools: Annotated[list[ToolIn], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    user: str | None = None
    # vLLM extensions, accepted under the same names as vLLM's own server.
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stop_token_ids: list[int] | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's chat-template switches: continue the final (assistant) message
    # instead of starting a new turn after it.
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    # Echoed in the X-Request-Id response header, so it must be a valid one:
    # visible ASCII only (a CJK or emoji id was a 500, a newline a dropped
    # connection, when the header was encoded).
    request_id: (
        Annotated[str, Field(min_length=1, max_length=128, pattern=REQUEST_ID_PATTERN)] | None
    ) = None

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else value or []
        if any(item == "" for item in items):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _integer_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not re.fullmatch(r"-?\d{1,10}", key):
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        return value

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        # The same rules, in the same words, as vLLM's server.
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools:
            names = {tool.function.name for tool in self.tools}
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    "The tool specified in `tool_choice` does not match any of the "
                    "specified `tools`"
                )
        max_tokens = self.effective_max_tokens
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        self.structured()  # raises on a contradictory combination
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                )
            if self.messages[-1].role != "assistant":
                raise ValueError(
                    "`continue_final_message` needs the final message to be the assistant's."
                )
        return self

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_tokens is None else self.max_tokens

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def structured(self) -> tuple[str | None, str | None, bool]:
        """(json schema text, regex, json_object) from response_format or
        vLLM's structured_outputs."""
        if self.structured_outputs is not None:
            so = self.structured_outputs
            if (so.json_ is None) == (so.regex is None):
                raise ValueError("structured_outputs needs exactly one of 'json' or 'regex'")
            schema = (
                so.json_ if so.json_ is None or isinstance(so.json_, str) else json.dumps(so.json_)
            )
            return schema, so.regex, False
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None, None, False
        if fmt.type == "json_object":
            return None, None, True
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ValueError("response_format json_schema needs 'json_schema.schema'")
        return json.dumps(fmt.json_schema.schema_), None, False


_SIZE = re.compile(r"^([1-9][0-9]{1,4})x([1-9][0-9]{1,4})$")


class ImageGenerationRequest(_Strict):
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
    model: str | None = None
    n: Annotated[int, Field(ge=1)] = 1
    size: str | None = None
    response_format: Literal["b64_json", "url"] = "b64_json"
    quality: str | None = None
    style: str | None = None
    user: str | None = None
    # Diffusers extensions.
    negative_prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | None = None
    num_inference_steps: Annotated[int, Field(ge=1, le=200)] | None = None
    guidance_scale: Annotated[float, Field(ge=0.0, le=50.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None

    @field_validator("size")
    @classmethod
    def _size_format(cls, value: str | None) -> str | None:
        if value is not None and value != "auto" and not _SIZE.match(value):
            raise ValueError("size must be written WIDTHxHEIGHT, for example 1024x1024")
        return value

    @field_validator("response_format")
    @classmethod
    def _only_b64(cls, value: str) -> str:
        if value != "b64_json":
            raise ValueError("only response_format 'b64_json' is supported")
        return value

    def dimensions(self, default: tuple[int, int]) -> tuple[int, int]:
        if self.size is None or self.size == "auto":
            return default
        match = _SIZE.match(self.size)
        assert match is not None  # checked by the validator
        return int(match.group(1)), int(match.group(2))


# -- responses ---------------------------------------------------------------


def chat_completion(
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """`choices` as `choice` builds them, in index order."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def choice(
    index: int,
    content: str | None,
    finish_reason: str,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        # `reasoning_content` is the name DeepSeek's API and most clients
        # read; `reasoning` is vLLM's own current name for the same text.
        message["reasoning_content"] = message["reasoning"] = reasoning
    return {
        "index": index,
        "message": message,
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": finish_reason,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ChunkEncoder:
    """Encodes one completion's SSE events. The fixed part of each chunk is
    serialised once; per-token work is one small json.dumps."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        head = json.dumps(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
            }
        )
        self._prefix = b"data: " + head[:-1].encode() + b', "choices": ['

    def delta(
        self,
        index: int,
        content: str | None,
        finish_reason: str | None,
        role: bool = False,
        reasoning: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> bytes:
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if content is not None:
            delta["content"] = content
        if reasoning:
            delta["reasoning_content"] = delta["reasoning"] = reasoning
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": None if logprobs is None else {"content": logprobs},
            "finish_reason": finish_reason,
        }
        return self._prefix + json.dumps(choice).encode() + b"]}\n\n"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        body = json.dumps(usage(prompt_tokens, completion_tokens)).encode()
        return self._prefix + b'], "usage": ' + body + b"}\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(message: str, type: str, code: str | None) -> bytes:
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
