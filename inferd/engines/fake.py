"""Fake engines for control-plane tests: timing and faults, no model.

They honour the engine contract (the conformance suite runs against them too)
so the replica server, gateway and autoscaler can be exercised with real
processes in milliseconds. They never stand in for the real engines' own
tests. Behaviour is set through `FakeOptions`, read from `EngineOptions.extra`
(the replica CLI's `--engine-arg key=value`):

- `load_delay_s`: seconds `start()` takes (simulates weight loading).
- `token_delay_s`: seconds between tokens (default 0.002).
- `image_delay_s`: seconds per image (default 0.01).
- `fail_load`: if set, `start()` raises with this message.
- `context_length`: default 4096.
- `kind`: `chat` or `image`, for a fake replica started by hand on a model
  name the catalog does not know (it loads nothing, so nothing says).
- LoRA adapters (with `EngineOptions.settings.maxLoras`): loaded on demand,
  the least recently used of more than `maxLoras` evicted, reported loaded,
  and each one's text starts at another word (outputs differ by adapter).
- `child_process`: if set, `start()` starts a child process that ignores
  SIGTERM, as vLLM's engine core does (named `FAKE_ENGINE_CORE`), and
  `shutdown()` stops it: what a replica's process tree must not leak.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import sys
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from inferd.engines import resume
from inferd.engines.base import (
    AdapterRef,
    Engine,
    EngineLoad,
    EngineOptions,
    ImageModelInfo,
    ImageRequest,
    TextDelta,
    TextModelInfo,
    TextRequest,
    engine_options,
    validate_image_request,
)
from inferd.engines.limits import check_prompt_fits, check_token_ids, refuse_tools_and_logprobs
from inferd.errors import BadRequest, Conflict
from inferd.vocab import ModelKind

FAKE_VOCAB = 1000
WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")


@dataclass(frozen=True)
class FakeOptions:
    load_delay_s: float = 0.0
    token_delay_s: float = 0.002
    image_delay_s: float = 0.01
    fail_load: str | None = None
    context_length: int = 4096
    kind: str | None = None
    child_process: bool = False


FAKE_ENGINE_CORE = "inferd-fake-engine-core"
_CORE = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(1e9)"


class _EngineCore:
    """A stand-in for vLLM's engine core process."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _CORE, FAKE_ENGINE_CORE,
            stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()


def fake_options(options: EngineOptions) -> FakeOptions:
    return engine_options(FakeOptions, options.extra, "fake")


def create_fake_engine(name: str, kind: ModelKind, options: EngineOptions) -> Engine:
    if kind is ModelKind.IMAGE:
        return FakeImageEngine(name, options)
    return FakeTextEngine(name, options)


class FakeTextEngine:
    kind = ModelKind.CHAT
    replays_token_ids = True

    def __init__(self, name: str, options: EngineOptions) -> None:
        self._options = fake_options(options)
        self._info = TextModelInfo(
            name=name,
            context_length=self._options.context_length,
            vocab_size=FAKE_VOCAB,
        )
        self._token_delay = self._options.token_delay_s
        self._running: set[str] = set()
        self._core = _EngineCore() if self._options.child_process else None
        self._max_loras = options.settings.maxLoras or 0
        # Adapter name -> source, least recently used first.
        self._adapters: OrderedDict[str, str] = OrderedDict()

    @property
    def info(self) -> TextModelInfo:
        return self._info

    async def load_adapter(self, adapter: AdapterRef) -> None:
        if self._max_loras == 0:
            raise BadRequest(
                f"The model '{adapter.name}' is a LoRA adapter, and this replica runs without "
                "LoRA (engineSettings.maxLoras is not set).",
                param="model",
                code="lora_disabled",
            )
        self._adapters[adapter.name] = adapter.source
        self._adapters.move_to_end(adapter.name)
        while len(self._adapters) > self._max_loras:
            self._adapters.popitem(last=False)

    async def start(self) -> None:
        if self._core is not None:
            await self._core.start()
        await asyncio.sleep(self._options.load_delay_s)
        if self._options.fail_load:
            raise RuntimeError(self._options.fail_load)

    async def generate(self, request: TextRequest) -> AsyncIterator[TextDelta]:
        # One "token" per whitespace-separated word of the prompt.
        prompt_tokens = sum(len(m.content.split()) + 4 for m in request.messages) + 1
        s = request.sampling
        check_prompt_fits(prompt_tokens, s.max_tokens, self._info.context_length)
        check_token_ids(s.stop_token_ids, s.logit_bias, FAKE_VOCAB)
        refuse_tools_and_logprobs(request, "fake")
        if s.json_schema is not None or s.regex is not None:
            raise BadRequest("The fake engine has no structured output.", param="response_format")
        if request.request_id in self._running:
            raise Conflict(f"Request id {request.request_id!r} is already running.")
        max_tokens = s.max_tokens or min(16, self._info.context_length - prompt_tokens)
        first_word = s.seed or 0
        if request.adapter is not None:
            await self.load_adapter(request.adapter)
            first_word += zlib.crc32(request.adapter.name.encode())
        # Resumed by token ids (one id per word, its index in WORDS): the
        # answer goes on from the next word, after the text of the ids the
        # client has not read (none: the fake holds nothing back).
        unread = ""
        if request.resume is not None:
            ids = request.resume.token_ids
            decoded = "".join(WORDS[i % len(WORDS)] + " " for i in ids)
            rest = resume.unread(decoded, request.resume.text, s.stop, parsed=False)
            if rest is None:
                request = resume.as_text(request)
            else:
                unread = rest
        # Continuing the final assistant message: its words are this
        # answer's first tokens, so the text goes on from the next word (a
        # resumed request counts them as its own completion tokens).
        written = len(request.messages[-1].content.split()) if request.continue_final else 0
        counted = written if request.resumed else 0
        if request.resume is not None:
            written = counted = len(request.resume.token_ids)
        if counted:
            if request.resume is None:
                prompt_tokens -= written + 4
            max_tokens = max(1, max_tokens - counted)
        self._running.add(request.request_id)
        try:
            text = ""
            for i in range(written, written + max_tokens):
                await asyncio.sleep(self._token_delay)
                token = (i + first_word) % len(WORDS)
                word = WORDS[token] + " "
                text += word
                for stop in s.stop:
                    if stop in text:
                        yield TextDelta(
                            text=word[: max(0, len(word) - (len(text) - text.index(stop)))],
                            completion_tokens=i + 1 - written + counted,
                            prompt_tokens=prompt_tokens,
                            finish_reason="stop",
                            token_ids=(token,),
                        )
                        return
                last = i == written + max_tokens - 1
                yield TextDelta(
                    text=unread + word,
                    completion_tokens=i + 1 - written + counted,
                    prompt_tokens=prompt_tokens,
                    finish_reason="length" if last else None,
                    token_ids=(token,),
                )
                unread = ""
        finally:
            self._running.discard(request.request_id)

    def load(self) -> EngineLoad:
        return EngineLoad(
            running=len(self._running),
            waiting=0,
            kv_cache_usage=None,
            adapters=tuple(self._adapters),
        )

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        if self._core is not None:
            await self._core.stop()


class FakeImageEngine:
    kind = ModelKind.IMAGE

    def __init__(self, name: str, options: EngineOptions) -> None:
        self._options = fake_options(options)
        self._info = ImageModelInfo(
            name=name,
            default_size=(1024, 1024),
            max_n=4,
            min_side=64,
            max_side=2048,
            side_multiple=8,
            default_steps=1,
        )
        self._delay = self._options.image_delay_s
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._running = 0

    @property
    def info(self) -> ImageModelInfo:
        return self._info

    async def start(self) -> None:
        await asyncio.sleep(self._options.load_delay_s)
        if self._options.fail_load:
            raise RuntimeError(self._options.fail_load)

    async def generate(self, request: ImageRequest) -> list[bytes]:
        validate_image_request(self._info, request)
        self._waiting += 1
        waiting = True
        try:
            async with self._lock:  # like a real pipeline: one call at a time
                self._waiting -= 1
                waiting = False
                self._running += 1
                try:
                    await asyncio.sleep(self._delay * request.n)
                    seed = hashlib.sha256(f"{request.prompt}/{request.seed}".encode()).digest()
                    return [
                        solid_png(request.width, request.height, seed[i % 8 : i % 8 + 3])
                        for i in range(request.n)
                    ]
                finally:
                    self._running -= 1
        finally:
            if waiting:  # cancelled while queued for the lock
                self._waiting -= 1

    def load(self) -> EngineLoad:
        return EngineLoad(running=self._running, waiting=self._waiting)

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None


def solid_png(width: int, height: int, rgb: bytes) -> bytes:
    """A valid PNG of one colour, without PIL."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + tag
            + data
            + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    row = b"\x00" + rgb[:3] * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 6))
        + chunk(b"IEND", b"")
    )
