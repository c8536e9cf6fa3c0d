"""One conformance suite for every engine behind the engine contract.

Text: the fake engine, vLLM and transformers on tiny-chat. Image: the fake
engine and diffusers on tiny-sdxl. Each real engine is loaded once for the
session on a shared event-loop thread.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.engines.base import (
    ChatMessage,
    EngineOptions,
    ImageEngine,
    ImageRequest,
    SamplingOptions,
    TextDelta,
    TextEngine,
    TextRequest,
)
from inferd.engines.factory import create_engine
from inferd.errors import BadRequest
from inferd.testing import LoopThread
from inferd.vocab import ModelKind
from tests.support import require

TEXT_ENGINES = ["fake", "transformers", pytest.param("vllm", marks=pytest.mark.slow)]
IMAGE_ENGINES = ["fake", "diffusers"]
_started: dict[str, Any] = {}


def _start(loop: LoopThread, name: str, kind: ModelKind, path: Path | None) -> Any:
    key = f"{kind.value}:{name}"
    if key not in _started:
        options = EngineOptions(engine=name, device="cpu")
        engine = create_engine(f"tiny-{kind.value}", kind, path or Path("."), options)
        loop.run(engine.start(), timeout=600)
        _started[key] = engine
    return _started[key]


@pytest.fixture(scope="module", autouse=True)
def _shutdown_engines(loop_thread: LoopThread) -> Iterator[None]:
    yield
    for engine in _started.values():
        loop_thread.run(engine.shutdown(), timeout=120)
    _started.clear()


@pytest.fixture(params=TEXT_ENGINES)
def text_engine(request: Any, loop_thread: LoopThread) -> TextEngine:
    name = request.param
    if name != "fake":
        require(name, "the engine conformance suite runs against every real engine")
    path = None if name == "fake" else request.getfixturevalue("tiny_chat_dir")
    return _start(loop_thread, name, ModelKind.CHAT, path)  # type: ignore[no-any-return]


@pytest.fixture(params=IMAGE_ENGINES)
def image_engine(request: Any, loop_thread: LoopThread) -> ImageEngine:
    name = request.param
    if name != "fake":
        require(name, "the engine conformance suite runs against every real engine")
    path = None if name == "fake" else request.getfixturevalue("tiny_sdxl_dir")
    return _start(loop_thread, name, ModelKind.IMAGE, path)  # type: ignore[no-any-return]


def text_request(rid: str, **sampling: Any) -> TextRequest:
    return TextRequest(
        request_id=rid,
        messages=(
            ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Tell me about the sea."),
        ),
        sampling=SamplingOptions(**sampling),
    )


async def collect(engine: TextEngine, request: TextRequest) -> list[TextDelta]:
    return [delta async for delta in engine.generate(request)]


def joined(deltas: list[TextDelta]) -> str:
    return "".join(d.text for d in deltas)


# -- text ---------------------------------------------------------------------


def test_info(text_engine: TextEngine) -> None:
    assert text_engine.kind is ModelKind.CHAT
    assert text_engine.info.context_length >= 1024
    assert text_engine.info.vocab_size > 0


def test_generation_is_a_stream_of_deltas_ending_with_a_reason(
    text_engine: TextEngine, loop_thread: LoopThread
) -> None:
    deltas = loop_thread.run(collect(text_engine, text_request("c-1", max_tokens=12)))
    assert deltas[-1].finish_reason in ("stop", "length")
    assert all(d.finish_reason is None for d in deltas[:-1])
    counts = [d.completion_tokens for d in deltas]
    assert counts == sorted(counts) and 1 <= counts[-1] <= 12
    assert len({d.prompt_tokens for d in deltas}) == 1 and deltas[0].prompt_tokens > 0


def test_max_tokens_is_exact_with_ignore_eos(
    text_engine: TextEngine, loop_thread: LoopThread
) -> None:
    deltas = loop_thread.run(
        collect(text_engine, text_request("c-2", max_tokens=9, ignore_eos=True))
    )
    assert deltas[-1].completion_tokens == 9
    assert deltas[-1].finish_reason == "length"


def test_same_seed_same_text(text_engine: TextEngine, loop_thread: LoopThread) -> None:
    first = loop_thread.run(collect(text_engine, text_request("c-3a", max_tokens=16, seed=11)))
    second = loop_thread.run(collect(text_engine, text_request("c-3b", max_tokens=16, seed=11)))
    assert joined(first) == joined(second)


def test_stop_string_ends_output_before_it(
    text_engine: TextEngine, loop_thread: LoopThread
) -> None:
    sampling = {"max_tokens": 40, "seed": 5, "ignore_eos": True}
    full = joined(loop_thread.run(collect(text_engine, text_request("c-4a", **sampling))))
    visible = full.replace("\ufffd", "")
    assert len(visible) >= 12
    stop = visible[6:9]
    deltas = loop_thread.run(collect(text_engine, text_request("c-4b", **sampling, stop=(stop,))))
    assert deltas[-1].finish_reason == "stop"
    text = joined(deltas)
    assert stop not in text
    assert full.startswith(text) and full[len(text) :].startswith(stop)


@pytest.mark.parametrize(
    "sampling,param",
    [
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"stop_token_ids": (10**7,)}, "stop_token_ids"),
        ({"logit_bias": ((10**7, 1.0),)}, "logit_bias"),
    ],
)
def test_invalid_requests_raise_before_the_first_delta(
    text_engine: TextEngine, loop_thread: LoopThread, sampling: dict[str, Any], param: str
) -> None:
    async def first() -> None:
        stream = text_engine.generate(text_request("c-5", **sampling))
        try:
            await anext(stream)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    with pytest.raises(BadRequest) as info:
        loop_thread.run(first())
    assert info.value.param == param
    assert text_engine.load().running == 0


def test_closing_the_stream_aborts_the_request(
    text_engine: TextEngine, loop_thread: LoopThread
) -> None:
    async def start_then_close() -> None:
        stream = text_engine.generate(text_request("c-6", max_tokens=1000, ignore_eos=True))
        await anext(stream)
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]

    loop_thread.run(start_then_close())
    deadline = time.monotonic() + 2
    while text_engine.load().running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert text_engine.load().running == 0


def test_concurrent_requests_all_complete(text_engine: TextEngine, loop_thread: LoopThread) -> None:
    async def many() -> list[list[TextDelta]]:
        return list(
            await asyncio.gather(
                *(collect(text_engine, text_request(f"c-7-{i}", max_tokens=8, ignore_eos=True))
                  for i in range(6))
            )
        )  # fmt: skip

    results = loop_thread.run(many())
    assert [r[-1].completion_tokens for r in results] == [8] * 6


# -- images --------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image.size


def small_side(engine: ImageEngine) -> int:
    """The smallest side the model accepts (fast on a CPU)."""
    info = engine.info
    return -(-info.min_side // info.side_multiple) * info.side_multiple


def image_request(rid: str, **fields: Any) -> ImageRequest:
    return ImageRequest(request_id=rid, prompt="a lighthouse", **fields)


def test_image_info(image_engine: ImageEngine) -> None:
    info = image_engine.info
    assert image_engine.kind is ModelKind.IMAGE
    assert info.default_size[0] % info.side_multiple == 0
    assert info.max_n >= 1 and info.min_side <= info.default_size[0] <= info.max_side


def test_n_images_of_the_requested_size(image_engine: ImageEngine, loop_thread: LoopThread) -> None:
    side = small_side(image_engine)
    pngs = loop_thread.run(
        image_engine.generate(image_request("i-1", n=2, width=side, height=side * 2))
    )
    assert [png_size(p) for p in pngs] == [(side, side * 2)] * 2


@pytest.mark.parametrize(
    "fields,param", [({"n": 99}, "n"), ({"width": 1001}, "size"), ({"width": 100_000}, "size")]
)
def test_image_limits(
    image_engine: ImageEngine, loop_thread: LoopThread, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as info:
        loop_thread.run(image_engine.generate(image_request("i-2", **fields)))
    assert info.value.param == param


def test_seeded_images_repeat(image_engine: ImageEngine, loop_thread: LoopThread) -> None:
    side = small_side(image_engine)
    req = {"width": side, "height": side, "seed": 3}
    first = loop_thread.run(image_engine.generate(image_request("i-3a", **req)))
    second = loop_thread.run(image_engine.generate(image_request("i-3b", **req)))
    assert first == second


def test_concurrent_image_requests(image_engine: ImageEngine, loop_thread: LoopThread) -> None:
    side = small_side(image_engine)

    async def many() -> list[list[bytes]]:
        requests = [image_request(f"i-4-{i}", width=side, height=side) for i in range(4)]
        return list(await asyncio.gather(*(image_engine.generate(r) for r in requests)))

    results = loop_thread.run(many())
    assert [len(r) for r in results] == [1] * 4
    assert image_engine.load().running == 0 and image_engine.load().waiting == 0
