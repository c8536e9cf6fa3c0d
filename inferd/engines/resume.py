"""A chat request that resumes an answer another replica began.

By token ids (`TextRequest.resume`, engines that replay them): the prompt is
the original request's prompt ids followed by the output token ids the lost
replica streamed, so greedy decoding goes on exactly as it would have. The
client may have read less than those ids decode to (the detokenizer holds
back an incomplete character, or text that may begin a stop string): that
unread text goes out first (`unread`, `first_text`). Where the replay would
not be exact, the engine goes on from the text instead (`as_text`).

By text (the gateway saw no token ids, or the replay cannot be exact): the
original messages plus the text already streamed as the final assistant
message (`continue_final`), marked `resumed`. The engine renders that prompt
and counts the final message's tokens as the answer's own.

Either way the answer's own tokens are taken off `max_tokens`/`min_tokens`
and added to the completion tokens (and off the prompt tokens) the engine
reports, so the client's usage and the meter read as if one replica had
answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from inferd.engines.base import ChatMessage, TextDelta, TextRequest

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


def unread(decoded: str, read: str, stop: Sequence[str], parsed: bool) -> str | None:
    """The text of the replayed token ids (`decoded`, as the engine's
    incremental detokenizer makes it) that the client has not read, or None
    when a replay would not continue the answer exactly:

    - `decoded` does not start with what the client read (the client's text
      is not the text of these ids);
    - the output is parsed (tool calls, reasoning) and text was held back:
      the parser held it, and whether it is content is the parser's to say;
    - the text so far ends with the start of a stop string: the stop string
      could end in the new tokens, and the new replica looks for stop
      strings in its own output only.
    """
    if not decoded.startswith(read):
        return None
    rest = decoded[len(read) :]
    if rest and parsed:
        return None
    for s in stop:
        if any(decoded.endswith(s[:k]) for k in range(1, len(s))):
            return None
    return rest


def as_text(request: TextRequest) -> TextRequest:
    """The request resumed from the text its client has read instead of
    from token ids (see the module's docstring)."""
    resume = request.resume
    if resume is None:
        return request
    if not resume.text:
        return replace(request, resume=None)
    return replace(
        request,
        messages=(*request.messages, ChatMessage(role="assistant", content=resume.text)),
        continue_final=True,
        generation_prompt=False,
        resumed=True,
        resume=None,
    )


async def first_text(
    deltas: AsyncIterator[TextDelta], text: str, regenerated: int = 0
) -> AsyncIterator[TextDelta]:
    """Deltas with `text` (the replayed tokens' unread text) before the
    first, which also says how many replayed ids are `regenerated`."""
    first = True
    async for delta in deltas:
        if first:
            delta = replace(delta, text=text + delta.text, regenerated=regenerated)
            first = False
        yield delta
