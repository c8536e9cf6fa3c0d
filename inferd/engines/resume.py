"""A chat request that resumes an answer another replica began.

The gateway sends the original messages plus the text already streamed as
the final assistant message (`continue_final`) and marks the request
`resumed`. The engine renders that prompt and counts the final message's
tokens as the answer's own: they are taken off `max_tokens`/`min_tokens`
and added to the completion tokens (and off the prompt tokens) it reports,
so the client's usage and the meter read as if one replica had answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from inferd.engines.base import TextDelta, TextRequest

Render = Callable[..., list[int]]


def prompt_ids(
    render: Render, request: TextRequest, tools: list[dict[str, Any]] | None
) -> tuple[list[int], int]:
    """(prompt token ids, how many of them the answer already produced)."""
    ids = render(
        request.messages,
        tools,
        continue_final=request.continue_final,
        generation_prompt=request.generation_prompt,
    )
    if not (request.resumed and request.continue_final):
        return ids, 0
    # The tokens after the generation prompt of the conversation without
    # the final message: the answer's first part, as this tokenizer reads it.
    base = render(request.messages[:-1], tools)
    return ids, max(0, len(ids) - len(base))


def rebased(request: TextRequest, produced: int) -> TextRequest:
    """The request with the sampling bounds left for the rest of an answer
    of which `produced` tokens exist."""
    if not produced:
        return request
    s = request.sampling
    max_tokens = None if s.max_tokens is None else max(1, s.max_tokens - produced)
    sampling = replace(s, max_tokens=max_tokens, min_tokens=max(0, s.min_tokens - produced))
    return replace(request, sampling=sampling)


async def counted(deltas: AsyncIterator[TextDelta], produced: int) -> AsyncIterator[TextDelta]:
    """Deltas whose token counts include the `produced` tokens as completion
    tokens (and not as prompt tokens)."""
    async for delta in deltas:
        yield count(delta, produced)


def count(delta: TextDelta, produced: int) -> TextDelta:
    if not produced:
        return delta
    return replace(
        delta,
        completion_tokens=delta.completion_tokens + produced,
        prompt_tokens=max(0, delta.prompt_tokens - produced),
    )
