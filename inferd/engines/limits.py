"""Request checks every text engine applies the same way (same limits, same
messages, same error parameters)."""

from __future__ import annotations

from inferd.engines.base import TextRequest
from inferd.errors import BadRequest


def check_prompt_fits(prompt_len: int, max_tokens: int | None, context_length: int) -> None:
    if prompt_len >= context_length:
        raise BadRequest(
            f"The prompt is {prompt_len} tokens; this model's context is {context_length} tokens.",
            param="messages",
            code="context_length_exceeded",
        )
    if max_tokens is not None and prompt_len + max_tokens > context_length:
        raise BadRequest(
            f"'max_tokens' is {max_tokens} and the prompt is {prompt_len} tokens; together "
            f"they exceed this model's context of {context_length} tokens "
            f"(at most {context_length - prompt_len} new tokens fit).",
            param="max_tokens",
            code="context_length_exceeded",
        )


def check_token_ids(
    stop_token_ids: tuple[int, ...],
    logit_bias: tuple[tuple[int, float], ...],
    vocab_size: int,
) -> None:
    for token_id in stop_token_ids:
        if not 0 <= token_id < vocab_size:
            raise BadRequest(
                f"stop_token_ids contains {token_id}, outside the vocabulary [0, {vocab_size}).",
                param="stop_token_ids",
            )
    for token_id, bias in logit_bias:
        if not 0 <= token_id < vocab_size:
            raise BadRequest(
                f"logit_bias has token id {token_id}, outside the vocabulary [0, {vocab_size}).",
                param="logit_bias",
            )
        if not -100.0 <= bias <= 100.0:
            raise BadRequest(
                f"logit_bias for token {token_id} is {bias}; it must be within [-100, 100].",
                param="logit_bias",
            )


def refuse_tools_and_logprobs(request: TextRequest, engine: str) -> None:
    """For engines without vLLM's parsers: a request that needs tool calls
    parsed, or logprobs, is a 400 rather than an answer that silently
    ignores them. Tools offered with tool_choice "none" are only rendered."""
    tools = request.tools
    if tools is not None and tools.choice != "none":
        raise BadRequest(
            f"Tool calling needs the vLLM engine and a tool-call parser; the {engine} engine "
            "has none.",
            param="tool_choice",
            code="tool_parser_not_configured",
        )
    if request.logprobs is not None:
        raise BadRequest(f"The {engine} engine does not report logprobs.", param="logprobs")
