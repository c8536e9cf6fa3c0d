"""Stream migration: what a lost replica's client has already read, and the
request that lets another replica go on from there.

When the replica serving a stream is lost after the first byte (its process
or node died: the connection broke; or its engine died: the replica ended
the stream with an error event), the gateway asks another replica of the
endpoint to continue the *same* answer, marked resumed (`x-inferd-resumed`):

- by token ids, when the lost replica named the token ids of every chunk
  (`x-inferd-token-ids`: a comment line `: ids 12 345` before each data
  line, stripped before the client sees it; `: ids -2 ...` when the last
  two ids named before are generated again): the original request plus
  those ids and the text the client has read (`RESUME_FIELD`). The replica
  prompts with the original prompt's ids followed by them, so greedy
  decoding goes on exactly as it would have;
- by text otherwise: the original request with the text already streamed
  as the start of the assistant's answer (chat: `continue_final_message`;
  completions: the prompt plus the text).

Either way the replica counts the answer so far as its own (usage,
`max_tokens`, `min_tokens`). The client reads one stream.

Everything here is pure: `Transcript` keeps the event-aligned bytes already
sent to the client, with their id lines (parsed only when a migration is
needed, so a stream that never fails costs one list append and one
`strip_ids` per chunk), `plan()` reads them with the original body and
returns the continuation's body or the reason it cannot be continued
faithfully (docs/migration.md lists them, with why).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from inferd.api.replica import RESUME_FIELD, TOKEN_IDS_LINE

# The start of an SSE error event as the replica (and vLLM) writes it; never
# inside a chunk's JSON otherwise (a string's quotes are escaped there).
ERROR_EVENT = b'data: {"error"'
DONE_EVENT = b"data: [DONE]\n\n"
# The fixed head of every chunk of one answer: `data: {"id": ..., "object":
# ..., "created": ...`. A continuation's chunks get the original's head, so
# the client sees one id and one creation time.
_HEAD = re.compile(rb'data: \{"id": ?"[^"]*", ?"object": ?"[^"]*", ?"created": ?\d+')
# A chunk's token-id line, the first line of its event. Unanchored (a
# literal-prefix scan, several times faster than `^` with re.M): a data
# line holds no raw newline (JSON escapes it), so this matches no data.
_IDS = re.compile(re.escape(TOKEN_IDS_LINE) + rb"[ 0-9-]*\n")


def strip_ids(events: bytes) -> bytes:
    """Whole events without their token-id lines, as the client reads them."""
    return _IDS.sub(b"", events)


class Transcript:
    """The event-aligned SSE bytes sent to a client, kept (as references to
    the relayed chunks) up to `limit` bytes; past that the stream can no
    longer be continued and nothing more is kept."""

    __slots__ = ("chunks", "limit", "overflow", "size")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.overflow = False

    def add(self, events: bytes) -> None:
        if self.overflow:
            return
        self.size += len(events)
        if self.size > self.limit:
            self.overflow = True
            self.chunks.clear()
        else:
            self.chunks.append(events)

    def data(self) -> bytes:
        return b"".join(self.chunks)


def split_events(data: bytes, pending: bytes) -> tuple[bytes, bytes]:
    """(the whole events in `pending + data`, the incomplete rest)."""
    if pending:
        data = pending + data
    end = data.rfind(b"\n\n")
    if end < 0:
        return b"", data
    end += 2
    if end == len(data):
        return data, b""
    return data[:end], data[end:]


@dataclass(frozen=True)
class Seen:
    """What the client has read of one answer (choice 0)."""

    head: bytes | None  # the chunks' fixed head (id, object, created)
    text: str  # content (chat) or text (completions) so far
    reasoning: bool  # reasoning text was streamed
    tool_calls: bool  # tool-call deltas were streamed
    finished: str | None  # a finish_reason was streamed
    choices: int  # distinct choice indexes seen
    usage: bool  # the usage chunk was streamed
    done: bool  # [DONE] was streamed
    # The output token ids so far, when every chunk with text named its
    # own; None when a chunk with text named none, or no chunk named any.
    token_ids: tuple[int, ...] | None = None


def read_transcript(data: bytes, chat: bool) -> Seen:
    head: bytes | None = None
    parts: list[str] = []
    reasoning = tool_calls = usage = done = False
    finished: str | None = None
    indexes: set[int] = set()
    ids: list[int] = []
    every_chunk_named_ids = True
    for event in data.split(b"\n\n"):
        named: list[bytes] | None = None
        if event.startswith(TOKEN_IDS_LINE):
            line, _, event = event.partition(b"\n")
            named = line[len(TOKEN_IDS_LINE) :].split()
        if not event.startswith(b"data: "):
            continue
        payload = event[6:]
        if payload == b"[DONE]":
            done = True
            continue
        if head is None:
            match = _HEAD.match(event)
            head = match.group(0) if match else None
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if chunk.get("usage"):
            usage = True
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            indexes.add(index)
            if index != 0:
                continue
            if chat:
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                reasoning = reasoning or bool(
                    delta.get("reasoning_content") or delta.get("reasoning")
                )
                tool_calls = tool_calls or bool(delta.get("tool_calls"))
            else:
                text = choice.get("text") or ""
            parts.append(text)
            if text and named is None:
                every_chunk_named_ids = False
            finished = choice.get("finish_reason") or finished
        if named:
            if named[0].startswith(b"-"):
                # The last ids named before are generated again (they ended
                # inside a character): this chunk names them anew.
                del ids[max(0, len(ids) + int(named[0])) :]
                named = named[1:]
            ids.extend(map(int, named))
    token_ids = tuple(ids) if ids and every_chunk_named_ids else None
    return Seen(
        head, "".join(parts), reasoning, tool_calls, finished, len(indexes), usage, done, token_ids
    )


@dataclass(frozen=True)
class Continuation:
    body: bytes
    head: bytes | None  # written over the continuation's chunk heads
    produced_chars: int  # characters of answer the client has (x-inferd-resumed)
    by: str = "text"  # "token_ids": the answer so far goes as token ids


@dataclass(frozen=True)
class Refusal:
    reason: str  # a short code: n, structured_output, logprobs, ...
    why: str  # a sentence for the client


@dataclass(frozen=True)
class Finished:
    """The answer was complete before the replica was lost (only its usage
    chunk or [DONE] was missing): nothing to generate."""


# Request fields that constrain decoding with a grammar: the new replica's
# grammar would start again at the root (duplicated or nested JSON).
_GUIDED = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
)


def refusal(label: str, body: dict[str, Any], seen: Seen) -> Refusal | None:
    """Why this request cannot be continued faithfully, or None. The
    reasons, and why each one holds, are in docs/migration.md."""
    chat = label == "chat"
    if (body.get("n") or 1) > 1 or (body.get("best_of") or 1) > 1 or seen.choices > 1:
        return Refusal("n", "it asks for several choices (n > 1), which continue independently")
    if body.get("use_beam_search"):
        return Refusal("beam_search", "beam search keeps beams the stream does not show")
    fmt = body.get("response_format")
    if (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")) or any(
        body.get(k) is not None for k in _GUIDED
    ):
        return Refusal(
            "structured_output",
            "its output is constrained by a grammar, which would start again at its root",
        )
    if body.get("logprobs") or body.get("top_logprobs") or body.get("prompt_logprobs"):
        return Refusal("logprobs", "it asks for log probabilities of the tokens as generated")
    if body.get("seed") is not None and body.get("temperature", 1) != 0:
        return Refusal(
            "seed", "its seeded sampling cannot be reproduced from the middle of the answer"
        )
    if body.get("presence_penalty") or body.get("frequency_penalty"):
        return Refusal(
            "penalties",
            "its presence/frequency penalties count the generated tokens, which would "
            "become prompt tokens",
        )
    if seen.tool_calls:
        return Refusal("tool_call_streamed", "a tool call's arguments were being streamed")
    if seen.reasoning:
        return Refusal(
            "reasoning_streamed",
            "the model's reasoning was being streamed, and its markers are not in the stream",
        )
    if not chat:
        if body.get("echo"):
            return Refusal("echo", "it echoes the prompt")
        if body.get("suffix") is not None:
            return Refusal("suffix", "it inserts text before a suffix")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and not (len(prompt) == 1 and isinstance(prompt[0], str)):
            return Refusal("prompt_form", "its prompt is token ids or several prompts")
        if not isinstance(prompt, (str, list)):
            return Refusal("prompt_form", "its prompt is not text")
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        return Refusal("continuous_usage", "it asks for running token counts in every chunk")
    return None


def plan(label: str, body_bytes: bytes, data: bytes) -> Continuation | Refusal | Finished:
    """What to send to another replica to continue the answer whose events
    `data` the client has read (`label`: chat or completions)."""
    try:
        body = json.loads(body_bytes)
    except ValueError:
        return Refusal("body", "its body is not JSON")
    if not isinstance(body, dict):
        return Refusal("body", "its body is not a JSON object")
    seen = read_transcript(data, label == "chat")
    refused = refusal(label, body, seen)
    if refused is not None:
        return refused
    if seen.finished is not None or seen.done:
        return Finished()
    if seen.token_ids is not None:
        continued = replay_body(body, seen.token_ids, seen.text)
        by = "token_ids"
    else:
        continued = continuation_body(label, body, seen.text)
        by = "text"
    return Continuation(json.dumps(continued).encode(), seen.head, len(seen.text), by)


def replay_body(body: dict[str, Any], token_ids: tuple[int, ...], text: str) -> dict[str, Any]:
    """The original request with the answer so far as token ids and the
    text of them the client has read: the replica prompts with the original
    prompt's ids followed by these (or goes on from the text where that
    would not be exact) and takes them off `max_tokens`."""
    return {**body, RESUME_FIELD: {"token_ids": list(token_ids), "text": text}}


def continuation_body(label: str, body: dict[str, Any], text: str) -> dict[str, Any]:
    """The original request with `text` as the start of the answer. The
    replica takes the text's tokens off `max_tokens` (it knows how many
    there are; the gateway sees only text)."""
    out = dict(body)
    if not text:
        # Nothing but the role chunk was read: the request as it was.
        return out
    if label == "chat":
        messages = list(body.get("messages") or ())
        messages.append({"role": "assistant", "content": text})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0]
        out["prompt"] = f"{prompt}{text}"
    return out


def rewrite_heads(events: bytes, head: bytes | None) -> bytes:
    """The continuation's events with the original answer's chunk head."""
    if head is None:
        return events
    return _HEAD.sub(lambda _: head, events)
