"""The continuation request builder and what a lost stream's client has read
(`inferd.gateway.migration`), and the replica's side of a resumed answer
(`inferd.engines.resume`): table tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from inferd.api.openai import ChunkEncoder
from inferd.api.replica import RESUME_FIELD
from inferd.engines import resume
from inferd.engines.base import ChatMessage, Resume, SamplingOptions, TextDelta, TextRequest
from inferd.gateway.migration import (
    Continuation,
    Finished,
    Refusal,
    Transcript,
    plan,
    read_transcript,
    rewrite_heads,
    split_events,
    strip_ids,
)
from inferd.replica.chat import ids_line

HELLO = [{"role": "user", "content": "Hi"}]


def chat_events(*deltas: dict[str, Any], finish: str | None = None, done: bool = False) -> bytes:
    """A chat stream as the replica writes it: role chunk, then deltas."""
    encoder = ChunkEncoder("chatcmpl-1", 1700000000, "tiny-chat")
    out = encoder.delta(0, "", None, role=True)
    for delta in deltas:
        out += encoder.delta(
            0,
            delta.get("content"),
            None,
            reasoning=delta.get("reasoning"),
            tool_calls=delta.get("tool_calls"),
        )
    if finish:
        out += encoder.delta(0, None, finish)
    if done:
        out += b"data: [DONE]\n\n"
    return out


def completion_events(*texts: str) -> bytes:
    """A completions stream as vLLM's server writes it (compact JSON)."""
    return b"".join(
        b"data: "
        + json.dumps(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1700000000,
                "model": "tiny-chat",
                "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": None}],
            },
            separators=(",", ":"),
        ).encode()
        + b"\n\n"
        for t in texts
    )


def with_ids(events: bytes, *ids: tuple[int, ...]) -> bytes:
    """`events` as a replica asked for token ids writes them: the first
    event (the role chunk) as it is, each next one after its ids line."""
    first, *rest = events.split(b"\n\n")[:-1]
    out = first + b"\n\n"
    for event, named in zip(rest, ids, strict=True):
        out += ids_line(named) + event + b"\n\n"
    return out


def completion_ids(*pieces: tuple[str, tuple[int, ...]]) -> bytes:
    return b"".join(ids_line(i) + completion_events(t) for t, i in pieces)


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# -- the continuation request -------------------------------------------------

CONTINUED = [
    # (case, route, request fields, events read, the continuation's fields)
    (
        "chat: the text so far is the start of the assistant's answer",
        "chat",
        {"model": "tiny-chat", "messages": HELLO, "max_tokens": 50, "stream": True},
        chat_events({"content": "Once "}, {"content": "upon"}),
        {
            "model": "tiny-chat",
            "messages": [*HELLO, {"role": "assistant", "content": "Once upon"}],
            "max_tokens": 50,
            "stream": True,
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    (
        "chat with a LoRA adapter: the model (adapter) name stays",
        "chat",
        {"model": "my-adapter", "messages": HELLO, "stream": True},
        chat_events({"content": "a"}),
        {
            "model": "my-adapter",
            "messages": [*HELLO, {"role": "assistant", "content": "a"}],
            "stream": True,
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    (
        "chat, only the role chunk read: the request as it was",
        "chat",
        {"messages": HELLO, "stream": True},
        chat_events(),
        {"messages": HELLO, "stream": True},
    ),
    (
        "chat with tools offered but answered in text: continued",
        "chat",
        {"messages": HELLO, "stream": True, "tools": [{"type": "function"}]},
        chat_events({"content": "No tool needed"}),
        {
            "messages": [*HELLO, {"role": "assistant", "content": "No tool needed"}],
            "stream": True,
            "tools": [{"type": "function"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    (
        "chat, greedy with a seed: the seed does not matter",
        "chat",
        {"messages": HELLO, "stream": True, "seed": 3, "temperature": 0},
        chat_events({"content": "x"}),
        {
            "messages": [*HELLO, {"role": "assistant", "content": "x"}],
            "stream": True,
            "seed": 3,
            "temperature": 0,
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    (
        "chat, non-ASCII text split over chunks",
        "chat",
        {"messages": HELLO, "stream": True},
        chat_events({"content": "日本"}, {"content": "語 ✓"}),
        {
            "messages": [*HELLO, {"role": "assistant", "content": "日本語 ✓"}],
            "stream": True,
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    (
        "completions: the prompt plus the text",
        "completions",
        {"prompt": "The sky is", "max_tokens": 20, "stream": True},
        completion_events(" blue", " and"),
        {"prompt": "The sky is blue and", "max_tokens": 20, "stream": True},
    ),
    (
        "completions, a one-prompt list",
        "completions",
        {"prompt": ["Count:"], "stream": True},
        completion_events(" 1,", " 2,"),
        {"prompt": "Count: 1, 2,", "stream": True},
    ),
]


@pytest.mark.parametrize(
    ("route", "fields", "events", "expected"),
    [case[1:] for case in CONTINUED],
    ids=[case[0] for case in CONTINUED],
)
def test_continuation(
    route: str, fields: dict[str, Any], events: bytes, expected: dict[str, Any]
) -> None:
    step = plan(route, body(**fields), events)
    assert isinstance(step, Continuation)
    assert json.loads(step.body) == expected
    text = expected.get("messages", [{}])[-1].get("content") if route == "chat" else None
    if route == "chat" and expected.get("continue_final_message"):
        assert step.produced_chars == len(text)
    assert step.head is not None
    assert b"1700000000" in step.head


REFUSED = [
    # (route, request fields, events read, reason)
    ("chat", {"messages": HELLO, "n": 2}, chat_events({"content": "a"}), "n"),
    ("completions", {"prompt": "a", "best_of": 3}, completion_events("b"), "n"),
    ("completions", {"prompt": "a", "use_beam_search": True}, completion_events(), "beam_search"),
    (
        "chat",
        {"messages": HELLO, "response_format": {"type": "json_object"}},
        chat_events({"content": "{"}),
        "structured_output",
    ),
    (
        "chat",
        {"messages": HELLO, "structured_outputs": {"regex": "[a-z]+"}},
        chat_events({"content": "a"}),
        "structured_output",
    ),
    ("completions", {"prompt": "a", "guided_json": {}}, completion_events(), "structured_output"),
    ("chat", {"messages": HELLO, "logprobs": True}, chat_events({"content": "a"}), "logprobs"),
    ("completions", {"prompt": "a", "logprobs": 2}, completion_events("b"), "logprobs"),
    ("chat", {"messages": HELLO, "seed": 1}, chat_events({"content": "a"}), "seed"),
    (
        "chat",
        {"messages": HELLO, "seed": 1, "temperature": 0.7},
        chat_events({"content": "a"}),
        "seed",
    ),
    (
        "chat",
        {"messages": HELLO, "presence_penalty": 0.5},
        chat_events({"content": "a"}),
        "penalties",
    ),
    (
        "chat",
        {"messages": HELLO, "tools": [{"type": "function"}]},
        chat_events({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a'}}]}),
        "tool_call_streamed",
    ),
    (
        "chat",
        {"messages": HELLO},
        chat_events({"reasoning": "Let me think"}),
        "reasoning_streamed",
    ),
    (
        "chat",
        {"messages": HELLO},
        chat_events({"reasoning": "Hmm"}, {"content": "The answer"}),
        "reasoning_streamed",
    ),
    ("completions", {"prompt": "a", "echo": True}, completion_events("a", "b"), "echo"),
    ("completions", {"prompt": "a", "suffix": "z"}, completion_events("b"), "suffix"),
    ("completions", {"prompt": [1, 2, 3]}, completion_events("b"), "prompt_form"),
    ("completions", {"prompt": ["a", "b"]}, completion_events("b"), "prompt_form"),
    (
        "completions",
        {"prompt": "a", "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        completion_events("b"),
        "continuous_usage",
    ),
]


REPLAYED = [
    # (case, route, request fields, events read, ids and text replayed)
    (
        "chat: every chunk named its ids",
        "chat",
        {"model": "tiny-chat", "messages": HELLO, "max_tokens": 50, "stream": True},
        with_ids(chat_events({"content": "Once "}, {"content": "upon"}), (10, 11), (12,)),
        {"token_ids": [10, 11, 12], "text": "Once upon"},
    ),
    (
        "chat with a LoRA adapter: the model (adapter) name stays",
        "chat",
        {"model": "my-adapter", "messages": HELLO, "stream": True},
        with_ids(chat_events({"content": "a"}), (5,)),
        {"token_ids": [5], "text": "a"},
    ),
    (
        "chat: a step with no text (half a character) named its ids on the next chunk",
        "chat",
        {"messages": HELLO, "stream": True},
        with_ids(chat_events({"content": "caf"}, {"content": "é"}), (1,), (2, 3)),
        {"token_ids": [1, 2, 3], "text": "café"},
    ),
    (
        "chat: ids of text the client has not read (held back) are replayed with what it has",
        "chat",
        {"messages": HELLO, "stream": True},
        with_ids(chat_events({"content": ""}), (7, 8)),
        {"token_ids": [7, 8], "text": ""},
    ),
    (
        "chat with tools offered but answered in text",
        "chat",
        {"messages": HELLO, "stream": True, "tools": [{"type": "function"}]},
        with_ids(chat_events({"content": "No tool"}), (4, 9)),
        {"token_ids": [4, 9], "text": "No tool"},
    ),
    (
        "chat continued once already, whose replica generated the last id again",
        "chat",
        {"messages": HELLO, "stream": True},
        with_ids(chat_events({"content": "caf"}), (1, 2))
        + ids_line((2, 3), regenerated=1)
        + ChunkEncoder("chatcmpl-1", 1700000000, "tiny-chat").delta(0, "é", None),
        {"token_ids": [1, 2, 3], "text": "café"},
    ),
    (
        "completions: the prompt stays, the ids go with it",
        "completions",
        {"prompt": "The sky is", "max_tokens": 20, "stream": True},
        completion_ids((" blue", (3,)), (" and", (4,))),
        {"token_ids": [3, 4], "text": " blue and"},
    ),
]


@pytest.mark.parametrize(
    ("route", "fields", "events", "replayed"),
    [case[1:] for case in REPLAYED],
    ids=[case[0] for case in REPLAYED],
)
def test_replay_by_token_ids(
    route: str, fields: dict[str, Any], events: bytes, replayed: dict[str, Any]
) -> None:
    step = plan(route, body(**fields), events)
    assert isinstance(step, Continuation) and step.by == "token_ids"
    assert json.loads(step.body) == {**fields, RESUME_FIELD: replayed}
    assert step.produced_chars == len(replayed["text"])


@pytest.mark.parametrize(
    "events",
    [
        # A chunk with text named no ids (a replica that did not, or a
        # continuation that went on from the text): the text is continued.
        with_ids(chat_events({"content": "a"}), (1,))
        + ChunkEncoder("chatcmpl-1", 1700000000, "tiny-chat").delta(0, "b", None),
        chat_events({"content": "a"}, {"content": "b"}),
    ],
    ids=["one chunk without ids", "no ids at all"],
)
def test_a_stream_without_every_chunks_ids_is_continued_from_its_text(events: bytes) -> None:
    step = plan("chat", body(messages=HELLO, stream=True), events)
    assert isinstance(step, Continuation) and step.by == "text"
    continued = json.loads(step.body)
    assert RESUME_FIELD not in continued
    assert continued["messages"][-1] == {"role": "assistant", "content": "ab"}


def test_ids_do_not_lift_a_refusal() -> None:
    events = with_ids(chat_events({"reasoning": "Hmm"}, {"content": "x"}), (1,), (2,))
    step = plan("chat", body(messages=HELLO, stream=True), events)
    assert isinstance(step, Refusal) and step.reason == "reasoning_streamed"


ROLE = ChunkEncoder("chatcmpl-1", 1, "m").delta(0, "", None, role=True)
CHUNK = ChunkEncoder("chatcmpl-1", 1, "m").delta(0, "x: ids 5", None)


@pytest.mark.parametrize(
    ("events", "stripped"),
    [
        (b": ids 1 2\n" + CHUNK, CHUNK),
        (ROLE + b": ids 3\n" + CHUNK + b": ids\n" + CHUNK, ROLE + CHUNK + CHUNK),
        (CHUNK, CHUNK),  # content that reads like an ids line is not one
        (b"data: [DONE]\n\n", b"data: [DONE]\n\n"),
        (b": ids -2 7\n" + CHUNK, CHUNK),
    ],
)
def test_strip_ids_leaves_the_events_as_the_client_reads_them(
    events: bytes, stripped: bytes
) -> None:
    assert strip_ids(events) == stripped


@pytest.mark.parametrize(("route", "fields", "events", "reason"), REFUSED)
def test_refused(route: str, fields: dict[str, Any], events: bytes, reason: str) -> None:
    step = plan(route, body(stream=True, **fields), events)
    assert isinstance(step, Refusal)
    assert step.reason == reason
    assert step.why


def test_a_body_that_is_not_a_json_object_is_refused() -> None:
    assert isinstance(plan("chat", b"[1]", chat_events()), Refusal)
    assert isinstance(plan("chat", b"{", chat_events()), Refusal)


@pytest.mark.parametrize(
    "events",
    [
        chat_events({"content": "done"}, finish="stop"),
        chat_events({"content": "done"}, finish="length", done=True),
    ],
)
def test_an_answer_already_finished_needs_no_continuation(events: bytes) -> None:
    assert isinstance(plan("chat", body(messages=HELLO, stream=True), events), Finished)


# -- reading the stream -------------------------------------------------------


def test_read_transcript_of_a_chat_stream() -> None:
    seen = read_transcript(chat_events({"content": "a"}, {"content": "b"}), chat=True)
    assert (seen.text, seen.reasoning, seen.tool_calls, seen.finished, seen.choices) == (
        "ab",
        False,
        False,
        None,
        1,
    )
    assert seen.head == (
        b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000'
    )


@pytest.mark.parametrize(
    ("pending", "data", "events", "rest"),
    [
        (b"", b"data: a\n\ndata: b\n\n", b"data: a\n\ndata: b\n\n", b""),
        (b"", b"data: a\n\ndata: b", b"data: a\n\n", b"data: b"),
        (b"data: b", b"c\n\n", b"data: bc\n\n", b""),
        (b"", b"data: half", b"", b"data: half"),
        (b"", b"", b"", b""),
    ],
)
def test_split_events_keeps_a_half_event_back(
    pending: bytes, data: bytes, events: bytes, rest: bytes
) -> None:
    assert split_events(data, pending) == (events, rest)


def test_transcript_stops_keeping_past_its_limit() -> None:
    transcript = Transcript(limit=10)
    transcript.add(b"12345")
    assert transcript.data() == b"12345" and not transcript.overflow
    transcript.add(b"678901")
    assert transcript.overflow and transcript.data() == b""
    transcript.add(b"x")
    assert transcript.data() == b""


def test_rewrite_heads_gives_the_continuation_the_original_id_and_time() -> None:
    original = b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1'
    other = ChunkEncoder("chatcmpl-2", 2, "m")
    events = other.delta(0, "a", None) + other.delta(0, "b", None)
    rewritten = rewrite_heads(events, original)
    assert rewritten.count(original) == 2 and b"chatcmpl-2" not in rewritten
    assert rewrite_heads(events, None) == events


# -- the replica's side: a resumed request counts its own tokens -------------


class WordRenderer:
    """A chat template in miniature: one token per word, two per message
    header, one for the generation prompt; a continued final message is
    left open (no end-of-turn token)."""

    def __call__(
        self,
        messages: Sequence[ChatMessage],
        tools: Any = None,
        *,
        continue_final: bool = False,
        generation_prompt: bool = True,
    ) -> list[int]:
        ids: list[int] = []
        for i, m in enumerate(messages):
            ids += [1, 2] + [7] * len(m.content.split())
            if not (continue_final and i == len(messages) - 1):
                ids.append(3)
        if generation_prompt and not continue_final:
            ids += [1, 2]
        return ids


RESUMED = [
    # (case, final assistant text, continue_final, resumed, produced tokens)
    ("a resumed answer of three words", "one two three", True, True, 3),
    ("continue_final_message from a client: its text is prompt", "one two", True, False, 0),
    ("an ordinary request", None, False, False, 0),
]


@pytest.mark.parametrize(
    ("final", "continue_final", "resumed", "produced"),
    [case[1:] for case in RESUMED],
    ids=[case[0] for case in RESUMED],
)
def test_resumed_prompt_counts_the_answer_so_far(
    final: str | None, continue_final: bool, resumed: bool, produced: int
) -> None:
    messages = [ChatMessage(role="user", content="hello there")]
    if final is not None:
        messages.append(ChatMessage(role="assistant", content=final))
    request = TextRequest(
        "r",
        tuple(messages),
        SamplingOptions(max_tokens=10, min_tokens=5),
        continue_final=continue_final,
        generation_prompt=not continue_final,
        resumed=resumed,
    )
    ids, counted = resume.prompt_ids(WordRenderer(), request, None)
    assert counted == produced
    rebased = resume.rebased(request, counted).sampling
    assert (rebased.max_tokens, rebased.min_tokens) == (10 - produced, max(0, 5 - produced))
    delta = resume.count(TextDelta("x", 2, len(ids)), counted)
    assert (delta.prompt_tokens, delta.completion_tokens) == (len(ids) - produced, 2 + produced)


def test_rebased_never_leaves_less_than_one_token_to_generate() -> None:
    request = TextRequest("r", (), SamplingOptions(max_tokens=3))
    assert resume.rebased(request, 5).sampling.max_tokens == 1
    unbounded = TextRequest("r", (), SamplingOptions())
    assert resume.rebased(unbounded, 5).sampling.max_tokens is None


# -- the relay: whole events, kept, and a lost replica noticed ---------------


class FakeResponse:
    """An upstream event stream: `parts` are chunks, or an exception to raise."""

    def __init__(self, parts: list[bytes | Exception]) -> None:
        self.status = 200
        self.headers = [(b"content-type", b"text/event-stream")]
        self.complete = False
        self._parts = list(parts)

    async def next_chunk(self) -> bytes:
        if not self._parts:
            self.complete = True
            return b""
        part = self._parts.pop(0)
        if isinstance(part, Exception):
            raise part
        return part

    def close(self) -> None:
        pass


class FakeUpstream:
    def __init__(self, response: FakeResponse) -> None:
        self.response = response

    async def send(self, *args: Any) -> FakeResponse:
        return self.response

    def abort_host(self, base_url: str, reason: str) -> int:
        return 0

    async def aclose(self) -> None:
        pass


def relay(parts: list[bytes | Exception]) -> tuple[Any, bytes, Transcript]:
    import asyncio

    from inferd.gateway.proxy import Leg, forward

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    leg = Leg(Transcript(1 << 20))
    result = asyncio.run(
        forward(FakeUpstream(FakeResponse(parts)), "http://r", "POST", "/x", [], b"{}", send, leg)
    )
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return result, body, leg.transcript


def test_relay_of_a_whole_stream_ends_it() -> None:
    from inferd.gateway.proxy import Relayed

    events = chat_events({"content": "a"}, finish="stop", done=True)
    result, body, transcript = relay([events[:30], events[30:]])
    assert result == Relayed(200)
    assert body == events and transcript.data() == events


def test_relay_keeps_a_half_event_back_when_the_replica_is_lost() -> None:
    from inferd.gateway.proxy import Broken
    from inferd.gateway.upstream import UpstreamError

    whole = chat_events({"content": "a"})
    result, body, transcript = relay([whole + b'data: {"id": "chatc', UpstreamError("reset")])
    assert isinstance(result, Broken) and result.reason == "connection_lost"
    assert body == whole and transcript.data() == whole


def test_relay_stops_at_an_engine_error_event_without_relaying_it() -> None:
    from inferd.api.openai import sse_error
    from inferd.gateway.proxy import Broken

    whole = chat_events({"content": "a"})
    error = sse_error("The engine failed while generating.", "server_error", "engine_error")
    result, body, _ = relay([whole + error + b"data: [DONE]\n\n"])
    assert isinstance(result, Broken) and result.reason == "engine_failed"
    assert "engine_error" in result.detail
    assert body == whole


def test_relay_of_a_stream_cut_before_done_is_a_lost_replica() -> None:
    from inferd.gateway.proxy import Broken

    result, body, _ = relay([chat_events({"content": "a"})])
    assert body == chat_events({"content": "a"})
    assert isinstance(result, Broken) and result.reason == "connection_lost"


def test_a_continuation_leg_sends_no_second_response_start_and_takes_the_original_head() -> None:
    import asyncio

    from inferd.gateway.proxy import Leg, Relayed, forward

    original = b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1'
    other = ChunkEncoder("chatcmpl-2", 2, "tiny-chat")
    events = other.delta(0, "b", "stop") + b"data: [DONE]\n\n"
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    leg = Leg(Transcript(1 << 20), head=original, started=True)
    upstream = FakeUpstream(FakeResponse([events]))
    result = asyncio.run(forward(upstream, "http://r", "POST", "/x", [], b"{}", send, leg))
    assert result == Relayed(200)
    assert [m["type"] for m in sent].count("http.response.start") == 0
    body = b"".join(m.get("body", b"") for m in sent)
    assert b"chatcmpl-2" not in body and body.count(original) == 1


UNREAD = [
    # (case, decoded text of the ids, text read, stop strings, parsed, unread)
    ("all of it read", "Once upon", "Once upon", (), False, ""),
    ("held back for a stop string", "Once upon", "Once up", ("zzz",), False, "on"),
    ("not the text of the ids", "Once upon", "Twice", (), False, None),
    ("the text so far could begin a stop string", "Once up", "Once", ("pond",), False, None),
    ("a stop string's first letter is not its start", "Once upon", "Once", ("nope",), False, None),
    ("no stop string begins at the seam", "Once upon", "Once", ("</s>",), False, " upon"),
    ("parsed output held back: the parser's to say", "Once <to", "Once ", (), True, None),
    ("parsed output, nothing held back", "Once", "Once", (), True, ""),
]


@pytest.mark.parametrize(
    ("decoded", "read", "stop", "parsed", "expected"),
    [case[1:] for case in UNREAD],
    ids=[case[0] for case in UNREAD],
)
def test_unread_text_of_replayed_ids(
    decoded: str, read: str, stop: tuple[str, ...], parsed: bool, expected: str | None
) -> None:
    assert resume.unread(decoded, read, stop, parsed) == expected


def test_as_text_resumes_from_the_text_read() -> None:
    hello = (ChatMessage(role="user", content="hi"),)
    request = TextRequest("r", hello, resume=Resume((1, 2), "Once"))
    text = resume.as_text(request)
    assert text.messages == (*hello, ChatMessage(role="assistant", content="Once"))
    assert (text.continue_final, text.generation_prompt, text.resumed, text.resume) == (
        True,
        False,
        True,
        None,
    )
    nothing_read = resume.as_text(TextRequest("r", hello, resume=Resume((1,), "")))
    assert nothing_read == TextRequest("r", hello)


def test_first_text_goes_before_the_first_delta_only() -> None:
    import asyncio

    async def deltas() -> Any:
        yield TextDelta("a", 1, 3)
        yield TextDelta("b", 2, 3)

    async def read() -> list[str]:
        return [d.text async for d in resume.first_text(deltas(), "on")]

    assert asyncio.run(read()) == ["ona", "b"]

    async def regenerated() -> list[int]:
        return [d.regenerated async for d in resume.first_text(deltas(), "", 2)]

    assert asyncio.run(regenerated()) == [2, 0]


def test_relay_keeps_the_ids_and_sends_the_client_none() -> None:
    from inferd.gateway.proxy import Relayed

    events = with_ids(chat_events({"content": "a"}, finish="stop"), (1,), ()) + b"data: [DONE]\n\n"
    result, body, transcript = relay([events[:40], events[40:]])
    assert result == Relayed(200)
    assert body == chat_events({"content": "a"}, finish="stop", done=True)
    assert transcript.data() == events
