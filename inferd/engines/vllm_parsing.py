"""Tool calls, reasoning and logprobs the way vLLM's own OpenAI server does them.

Nothing here parses model output itself: the request is rebuilt as vLLM's
own `ChatCompletionRequest` (so vLLM validates `tools` and `tool_choice`),
vLLM's `Parser` (the tool parser and reasoning parser named in the model's
catalog entry, composed by vLLM's `ParserManager`) adjusts it (a forced or
required tool call becomes a structured-output constraint) and reads the
output, per delta when streaming, whole otherwise. What comes back is mapped
to inferd's engine-neutral `TextDelta` fields.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd.engines.base import TextRequest, TokenLogprob, ToolCall
from inferd.engines.chat_template import message_dict
from inferd.errors import BadRequest

# Where the parser names come from, for the errors that say one is missing.
TOOL_PARSER_SETTING = "toolCallParser"


def parser_class(
    tool_call_parser: str | None, reasoning_parser: str | None, model_name: str, tokenizer: Any
) -> Any:
    """vLLM's composed parser class for these names (None when neither is set).
    An unknown name fails here, at start-up, not on the first request."""
    if not tool_call_parser and not reasoning_parser:
        return None
    from vllm.parser import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=tool_call_parser,
        reasoning_parser_name=reasoning_parser or "",
        enable_auto_tools=bool(tool_call_parser),
        model_name=model_name,
        is_harmony=False,
        tokenizer=tokenizer,
    )


@dataclass
class RequestParsing:
    """vLLM's request model and parser for one generation."""

    vllm_request: Any
    parser: Any  # vllm.parser.abstract_parser.Parser | None
    named_function: str | None

    def structured_outputs(self) -> Any:
        """The request's output constraint after vLLM's parser adjusted it (a
        forced or required call replaces the request's own, as in vLLM)."""
        return self.vllm_request.extract_structured_outputs()

    @property
    def skip_special_tokens(self) -> bool:
        return bool(self.vllm_request.skip_special_tokens)

    def reasoning_kwargs(self, prompt_ids: list[int]) -> dict[str, Any]:
        """`reasoning_ended` / `reasoning_parser_kwargs` for vLLM's generate,
        as vLLM's chat server passes them."""
        if self.parser is None or self.parser.reasoning_parser is None:
            return {}
        return {
            "reasoning_ended": self.vllm_request.resolve_reasoning_ended(self.parser, prompt_ids),
            "reasoning_parser_kwargs": {"chat_template_kwargs": {}},
        }

    def delta(
        self, text: str, token_ids: Sequence[int], prompt_ids: list[int], finished: bool
    ) -> tuple[str, str, tuple[ToolCall, ...]]:
        """(content, reasoning, tool-call pieces) of one streamed delta."""
        if self.parser is None:
            return text, "", ()
        message = self.parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(token_ids),
            request=self.vllm_request,
            prompt_token_ids=prompt_ids,
            finished=finished,
        )
        if message is None:
            return "", "", ()
        calls = tuple(
            ToolCall(
                index=call.index,
                id=call.id,
                name=call.function.name if call.function else None,
                arguments=(call.function.arguments or "") if call.function else "",
            )
            for call in message.tool_calls or ()
        )
        return message.content or "", message.reasoning or "", self._parallel(calls)

    def whole(self, text: str, token_ids: Sequence[int]) -> tuple[str, str, tuple[ToolCall, ...]]:
        """(content, reasoning, tool calls) of a whole output."""
        if self.parser is None:
            return text, "", ()
        reasoning, content, calls = self.parser.parse(
            text, self.vllm_request, enable_auto_tools=True, model_output_token_ids=token_ids
        )
        from vllm.renderers.chat_utils import make_tool_call_id

        tool_calls = tuple(
            ToolCall(
                index=i, id=call.id or make_tool_call_id(), name=call.name, arguments=call.arguments
            )
            for i, call in enumerate(calls or ())
        )
        return content or "", reasoning or "", self._parallel(tool_calls)

    def _parallel(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        # As vLLM's server: parallel_tool_calls=false keeps the first call only.
        if self.vllm_request.parallel_tool_calls is False:
            return tuple(call for call in calls if call.index == 0)
        return calls

    def finish_reason(self, reason: str, called_tools: bool) -> str:
        """OpenAI's finish reasons: "tool_calls" when the model called tools
        on its own choice (auto) or because it had to (required); a named
        function's call ends with "stop"."""
        if called_tools and self.named_function is None and reason == "stop":
            return "tool_calls"
        return reason


def request_parsing(
    request: TextRequest, parser_cls: Any, tokenizer: Any, model_config: Any, model_name: str
) -> RequestParsing | None:
    """The parsing a request needs, or None when its output is plain text
    (no tools offered, no reasoning parser): the fast path."""
    tools = request.tools
    wants_tools = tools is not None and tools.choice != "none"
    has_reasoning = parser_cls is not None and parser_cls.reasoning_parser_cls is not None
    if not wants_tools and not has_reasoning and request.logprobs is None:
        return None
    has_tool_parser = parser_cls is not None and parser_cls.tool_parser_cls is not None
    if wants_tools and not has_tool_parser:
        assert tools is not None
        what = f'function "{tools.choice}"' if tools.named else f'"{tools.choice}"'
        raise BadRequest(
            f"tool_choice={what} needs a tool-call parser, and none is configured for this "
            f"model: set '{TOOL_PARSER_SETTING}' in its catalog entry (vLLM's server: "
            "--enable-auto-tool-choice --tool-call-parser).",
            param="tool_choice",
            code="tool_parser_not_configured",
        )
    vllm_request = _vllm_request(request, model_name)
    parser = None
    if parser_cls is not None and (wants_tools or has_reasoning):
        parser = parser_cls(
            tokenizer, vllm_request.tools, model_config=model_config, chat_template_kwargs={}
        )
        vllm_request = parser.adjust_request(request=vllm_request)
    return RequestParsing(
        vllm_request=vllm_request,
        parser=parser,
        named_function=tools.choice if tools is not None and tools.named else None,
    )


def _vllm_request(request: TextRequest, model_name: str) -> Any:
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMClientError

    body: dict[str, Any] = {
        "model": model_name,
        "messages": [message_dict(m) for m in request.messages],
        "stream": request.stream,
    }
    if request.tools is not None:
        tools = request.tools
        body["tools"] = json.loads(tools.tools_json)
        body["tool_choice"] = (
            {"type": "function", "function": {"name": tools.choice}}
            if tools.named
            else tools.choice
        )
        body["parallel_tool_calls"] = tools.parallel
    if request.logprobs is not None:
        body.update(logprobs=True, top_logprobs=request.logprobs)
    sampling = request.sampling
    if sampling.regex is not None:
        body["structured_outputs"] = {"regex": sampling.regex}
    elif sampling.json_schema is not None:
        body["structured_outputs"] = {"json": sampling.json_schema}
    elif sampling.json_object:
        body["response_format"] = {"type": "json_object"}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        cause = error.get("ctx", {}).get("error")
        message = str(cause) if cause is not None else error.get("msg", str(exc))
        raise BadRequest(message, param=getattr(cause, "parameter", None)) from None
    except VLLMClientError as exc:
        raise BadRequest(str(exc), param=getattr(exc, "parameter", None)) from None


def token_logprobs(
    token_ids: Sequence[int], steps: Sequence[Any] | None, top: int, tokenizer: Any
) -> tuple[TokenLogprob, ...]:
    """OpenAI's per-token logprobs from vLLM's (one {token id: Logprob} per
    step), as vLLM's server shapes them."""
    if not steps:
        return ()
    out = []
    for token_id, step in zip(token_ids, steps, strict=False):
        chosen = step.get(token_id) if step else None
        if chosen is None:
            token = tokenizer.decode(token_id)
            out.append(TokenLogprob(token, -9999.0, tuple(token.encode())))
            continue
        ranked = sorted(step.items(), key=lambda item: item[1].rank or 0)[:top]
        out.append(
            TokenLogprob(
                token=_decoded(chosen, token_id, tokenizer),
                logprob=max(chosen.logprob, -9999.0),
                bytes=_bytes(chosen),
                top=tuple(
                    (_decoded(p, tid, tokenizer), max(p.logprob, -9999.0), _bytes(p))
                    for tid, p in ranked
                    if top > 0
                ),
            )
        )
    return tuple(out)


def _decoded(logprob: Any, token_id: int, tokenizer: Any) -> str:
    if logprob.decoded_token is not None:
        return str(logprob.decoded_token)
    return str(tokenizer.decode(token_id))


def _bytes(logprob: Any) -> tuple[int, ...] | None:
    decoded = logprob.decoded_token
    return None if decoded is None else tuple(decoded.encode("utf-8", errors="replace"))
