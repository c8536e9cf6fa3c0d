"""Chat completions: the OpenAI protocol translated to `TextEngine` calls.

Errors surface as HTTP statuses because the first delta of every choice is
pulled before the response starts: engines raise their validation errors
there. After the first byte of a stream, an error can only be reported in
band, as an SSE `error` event followed by the end of the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api.openai import (
    SSE_DONE,
    ChatCompletionRequest,
    ChatMessageIn,
    ChunkEncoder,
    NamedToolChoice,
    chat_completion,
    choice,
)
from inferd.api.replica import (
    ADAPTER_SOURCE_HEADER,
    RESUME_FIELD,
    RESUMED_HEADER,
    TOKEN_IDS_HEADER,
    TOKEN_IDS_LINE,
    ResumeIn,
)
from inferd.engines.base import (
    AdapterRef,
    ChatMessage,
    Resume,
    SamplingOptions,
    TextDelta,
    TextEngine,
    TextRequest,
    TokenLogprob,
    ToolCall,
    ToolOptions,
)
from inferd.engines.resume import as_text as resume_from_text
from inferd.errors import BadRequest, NotFound
from inferd.http import parse_json_object, read_body, validate
from inferd.replica.answering import Answering
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState

logger = logging.getLogger(__name__)

ROUTE = "chat"


def requested_adapter(request: Request, model: str | None) -> AdapterRef | None:
    """The LoRA adapter a request is for: the gateway names where it is when
    the request's `model` is one of the endpoint's adapters."""
    source = request.headers.get(ADAPTER_SOURCE_HEADER)
    if source is None or not model:
        return None
    return AdapterRef(model, unquote(source))


@dataclass(frozen=True)
class ServedModel:
    name: str
    aliases: frozenset[str]

    def check(self, requested: str | None) -> None:
        if requested is not None and requested != self.name and requested not in self.aliases:
            raise NotFound(
                f"The model '{requested}' does not exist on this endpoint; it serves "
                f"'{self.name}'.",
                param="model",
                code="model_not_found",
            )


def to_message(message: ChatMessageIn) -> ChatMessage:
    calls = tuple(
        ToolCall(index=i, id=c.id, name=c.function.name, arguments=c.function.arguments)
        for i, c in enumerate(message.tool_calls or ())
    )
    return ChatMessage(
        role="system" if message.role == "developer" else message.role,
        content=message.text(),
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
    )


def to_tool_options(body: ChatCompletionRequest) -> ToolOptions | None:
    if not body.tools:
        return None
    tools_json = json.dumps([tool.model_dump(exclude_none=True) for tool in body.tools])
    named = isinstance(body.tool_choice, NamedToolChoice)
    if isinstance(body.tool_choice, NamedToolChoice):
        chosen = body.tool_choice.function.name
    else:
        # OpenAI's default with tools is "auto".
        chosen = body.tool_choice or "auto"
    return ToolOptions(
        tools_json=tools_json,
        choice=chosen,
        named=named,
        parallel=body.parallel_tool_calls is not False,
    )


def to_text_requests(
    body: ChatCompletionRequest,
    request_id: str,
    adapter: AdapterRef | None = None,
    trace_headers: tuple[tuple[str, str], ...] = (),
    *,
    resumed: bool = False,
    resume: Resume | None = None,
) -> list[TextRequest]:
    messages = tuple(to_message(m) for m in body.messages)
    tools = to_tool_options(body)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    json_schema, regex, json_object = body.structured()
    try:
        logit_bias = tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items())
    except ValueError:
        raise BadRequest("logit_bias keys must be token ids.", param="logit_bias") from None
    requests = []
    for index in range(body.n):
        sampling = SamplingOptions(
            max_tokens=body.effective_max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            stop=body.stop_list(),
            # Distinct but reproducible seeds for the n choices.
            seed=None if body.seed is None else body.seed + index,
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            logit_bias=logit_bias,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            json_schema=json_schema,
            regex=regex,
            json_object=json_object,
        )
        rid = request_id if body.n == 1 else f"{request_id}-{index}"
        requests.append(
            TextRequest(
                request_id=rid,
                messages=messages,
                sampling=sampling,
                tools=tools,
                logprobs=logprobs,
                stream=body.stream,
                adapter=adapter,
                continue_final=body.continue_final_message,
                generation_prompt=body.add_generation_prompt,
                resumed=resumed,
                resume=resume,
                trace_headers=trace_headers,
            )
        )
    return requests


class ChatHandler:
    def __init__(
        self,
        engine: TextEngine,
        state: ReplicaState,
        metrics: ReplicaMetrics,
        model: ServedModel,
        max_body_bytes: int,
    ) -> None:
        self.engine = engine
        self.state = state
        self.metrics = metrics
        self.model = model
        self.max_body_bytes = max_body_bytes

    async def handle(self, request: Request) -> Response:
        with Answering(self.state, self.metrics, ROUTE, request) as answer:
            raw = parse_json_object(await read_body(request, self.max_body_bytes))
            # A resumed answer's stream goes on where the gateway's client
            # already is: no second role chunk.
            resuming = RESUMED_HEADER in request.headers
            resume = _resume_of(raw.pop(RESUME_FIELD, None)) if resuming else None
            body = validate(ChatCompletionRequest, raw)
            adapter = requested_adapter(request, body.model)
            if adapter is None:
                self.model.check(body.model)
            else:
                answer.adapter = adapter.name
            request_id = (
                body.request_id
                or request.headers.get("x-request-id")
                or (f"chatcmpl-{uuid.uuid4().hex}")
            )
            traced = tuple((answer.trace_headers or {}).items())
            resumed = resuming and body.continue_final_message and resume is None
            requests = to_text_requests(
                body, request_id, adapter, trace_headers=traced, resumed=resumed, resume=resume
            )
            if resume is not None and not self.engine.replays_token_ids:
                requests = [resume_from_text(r) for r in requests]
            streams = [self.engine.generate(r) for r in requests]
            # The gateway may continue this stream elsewhere: it reads each
            # chunk's token ids (one answer only: n > 1 is never continued).
            token_ids = body.n == 1 and request.headers.get(TOKEN_IDS_HEADER) == "1"
            try:
                # All choices enter the engine together (one batch), and any
                # validation error surfaces here, before a status is sent.
                firsts = list(await asyncio.gather(*(anext(s) for s in streams)))
            except BaseException:
                await _close_all(streams)
                raise
            answer.first_output()
            model_name = body.model or self.model.name
            created = int(time.time())
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                encoder = ChunkEncoder(request_id, created, model_name)
                completion = [0] * len(streams)

                async def close() -> None:
                    await _close_all(streams)
                    answer.count(firsts[0].prompt_tokens, sum(completion))

                return answer.stream(
                    _sse(
                        encoder,
                        streams,
                        firsts,
                        completion,
                        include_usage,
                        role=not resuming,
                        token_ids=token_ids,
                    ),
                    close,
                    headers={"X-Request-Id": request_id},
                )
            result = await _unless_disconnected(
                request, _collect(streams, firsts, bool(body.logprobs))
            )
            if result is None:
                answer.status = 499  # client closed the connection; nobody reads this
                return Response(status_code=499)
            choices, prompt_tokens, completion_tokens = result
            answer.count(prompt_tokens, completion_tokens)
            answer.status = 200
            return JSONResponse(
                chat_completion(
                    request_id, created, model_name, choices, prompt_tokens, completion_tokens
                ),
                headers={"X-Request-Id": request_id},
            )


async def _sse(
    encoder: ChunkEncoder,
    streams: list[AsyncIterator[TextDelta]],
    firsts: list[TextDelta],
    completion: list[int],
    include_usage: bool,
    role: bool = True,
    token_ids: bool = False,
) -> AsyncIterator[bytes]:
    """The chunks of a streamed chat completion; `completion` keeps each
    choice's token count as it grows (the tokens counted however it ends).
    `token_ids`: each chunk is preceded by a comment line with the token ids
    it carries (and those of steps that made no chunk before it)."""
    for index in range(len(streams) if role else 0):
        yield encoder.delta(index, "", None, role=True)
    pending: list[int] = []
    regenerated = 0
    async for index, delta in _merge(streams, firsts):
        completion[index] = delta.completion_tokens
        event: bytes | None = None
        if delta.tool_calls or delta.reasoning or delta.logprobs:
            event = encoder.delta(
                index,
                delta.text or None,
                delta.finish_reason,
                reasoning=delta.reasoning or None,
                tool_calls=[call_delta(c) for c in delta.tool_calls] or None,
                logprobs=logprob_content(delta.logprobs) if delta.logprobs else None,
            )
        elif delta.text or delta.finish_reason:
            event = encoder.delta(index, delta.text or None, delta.finish_reason)
        if token_ids:
            regenerated = regenerated or delta.regenerated
            pending += delta.token_ids
            if event is not None:
                event = ids_line(pending, regenerated) + event
                pending, regenerated = [], 0
        if event is not None:
            yield event
    if include_usage:
        yield encoder.usage(firsts[0].prompt_tokens, sum(completion))
    yield SSE_DONE


def ids_line(ids: Sequence[int], regenerated: int = 0) -> bytes:
    """The SSE comment line naming a chunk's token ids (`TOKEN_IDS_HEADER`),
    after `-n` when the last n ids named before are generated again."""
    drop = [b"-%d" % regenerated] if regenerated else []
    return b" ".join([TOKEN_IDS_LINE, *drop, *(str(i).encode() for i in ids)]) + b"\n"


def _resume_of(field: Any) -> Resume | None:
    """The answer so far of a request resumed by token ids (the gateway's
    `RESUME_FIELD`), or None when it is resumed from its text."""
    if field is None:
        return None
    given = validate(ResumeIn, field)
    return Resume(tuple(given.token_ids), given.text)


async def _collect(
    streams: list[AsyncIterator[TextDelta]], firsts: list[TextDelta], logprobs: bool
) -> tuple[list[dict[str, Any]], int, int]:
    async def one(
        index: int, stream: AsyncIterator[TextDelta], first: TextDelta
    ) -> tuple[dict[str, Any], int]:
        deltas = [first]
        async for delta in stream:
            deltas.append(delta)
        last = deltas[-1]
        return whole_choice(index, deltas, logprobs), last.completion_tokens

    try:
        if len(streams) == 1:
            results = [await one(0, streams[0], firsts[0])]
        else:
            results = list(await asyncio.gather(*map(one, range(len(streams)), streams, firsts)))
    finally:
        await _close_all(streams)
    choices = [c for c, _ in results]
    return choices, firsts[0].prompt_tokens, sum(tokens for _, tokens in results)


def whole_choice(index: int, deltas: list[TextDelta], logprobs: bool) -> dict[str, Any]:
    """One non-streamed choice from all of its deltas."""
    content = "".join(d.text for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for call in delta.tool_calls:
            merged = calls.setdefault(
                call.index,
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                },
            )
            merged["id"] = merged["id"] or call.id
            merged["function"]["name"] = merged["function"]["name"] or call.name
            merged["function"]["arguments"] += call.arguments
    tool_calls = [calls[i] for i in sorted(calls)]
    return choice(
        index,
        # A turn that only calls tools has no content (null, as OpenAI's).
        content if content or not tool_calls else None,
        deltas[-1].finish_reason or "stop",
        reasoning=reasoning or None,
        tool_calls=tool_calls or None,
        logprobs=logprob_content([lp for d in deltas for lp in d.logprobs]) if logprobs else None,
    )


def call_delta(call: ToolCall) -> dict[str, Any]:
    """A tool-call piece in OpenAI's stream shape: id, type and name come
    with the call's first piece, the arguments in parts."""
    out: dict[str, Any] = {"index": call.index}
    function: dict[str, Any] = {}
    if call.id is not None:
        out["id"] = call.id
        out["type"] = "function"
    if call.name is not None:
        function["name"] = call.name
    if call.arguments or call.name is not None:
        function["arguments"] = call.arguments
    out["function"] = function
    return out


def logprob_content(items: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            "token": item.token,
            "logprob": item.logprob,
            "bytes": None if item.bytes is None else list(item.bytes),
            "top_logprobs": [
                {"token": t, "logprob": lp, "bytes": None if b is None else list(b)}
                for t, lp, b in item.top
            ],
        }
        for item in items
    ]


async def _merge(
    streams: list[AsyncIterator[TextDelta]], firsts: list[TextDelta]
) -> AsyncIterator[tuple[int, TextDelta]]:
    """Deltas of all choices as they come: (choice index, delta)."""
    for index, first in enumerate(firsts):
        yield index, first
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, TextDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[TextDelta]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
            await queue.put((index, None))
        except Exception as exc:
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _close_all(streams: list[AsyncIterator[TextDelta]]) -> None:
    for stream in streams:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """Run `work`; if the client disconnects first, cancel it (which aborts
    the engine requests) and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    return None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
