"""The transformers text engine on the real tiny-chat model, on the CPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.engines.base import (
    ChatMessage,
    EngineOptions,
    SamplingOptions,
    TextDelta,
    TextEngine,
    TextRequest,
)
from inferd.errors import BadRequest
from inferd.testing import LoopThread
from tests.support import needs

pytestmark = needs("transformers")

HELLO = (ChatMessage("system", "You are terse."), ChatMessage("user", "Hello there"))


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(tiny_chat_dir: Path, loop: LoopThread) -> Iterator[Any]:
    from inferd.engines.transformers import TransformersTextEngine

    engine = TransformersTextEngine("tiny-chat", tiny_chat_dir, EngineOptions(device="cpu"))
    loop.run(engine.start())
    yield engine
    loop.run(engine.shutdown())


@pytest.fixture
def run(loop: LoopThread) -> Any:
    return loop.run


def request(rid: str, messages: tuple[ChatMessage, ...] = HELLO, **sampling: Any) -> TextRequest:
    return TextRequest(rid, messages, SamplingOptions(**sampling))


async def collect(engine: Any, req: TextRequest) -> list[TextDelta]:
    return [delta async for delta in engine.generate(req)]


def text_of(deltas: list[TextDelta]) -> str:
    return "".join(d.text for d in deltas)


def test_is_a_text_engine(engine: Any) -> None:
    assert isinstance(engine, TextEngine)
    assert engine.info.context_length == 2048
    assert engine.info.vocab_size > 0


def test_greedy_text_is_what_the_model_decodes(engine: Any, run: Any, tiny_chat_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    deltas = run(collect(engine, request("greedy", max_tokens=24, temperature=0, ignore_eos=True)))
    assert deltas[-1].completion_tokens == 24
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_chat_dir)
    conversation = [{"role": m.role, "content": m.content} for m in HELLO]
    ids = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None)
    assert deltas[-1].prompt_tokens == len(ids)
    assert text_of(deltas) == tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_seeded_sampling_is_reproducible(engine: Any, run: Any) -> None:
    def sample(seed: int) -> str:
        return text_of(run(collect(engine, request(f"s{seed}", max_tokens=32, seed=seed))))

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_max_tokens_is_honoured(engine: Any, run: Any) -> None:
    deltas = run(collect(engine, request("len", max_tokens=17, ignore_eos=True)))
    assert (deltas[-1].completion_tokens, deltas[-1].finish_reason) == (17, "length")


def test_stop_string_ends_the_text_without_it(engine: Any, run: Any) -> None:
    greedy = {"temperature": 0, "ignore_eos": True}
    full = text_of(run(collect(engine, request("full", max_tokens=40, **greedy))))
    stop = full[10:13]
    deltas = run(collect(engine, request("stop", max_tokens=40, stop=(stop,), **greedy)))
    assert deltas[-1].finish_reason == "stop"
    assert text_of(deltas) == full[: full.find(stop)]


def test_stop_token_ids_and_logit_bias(engine: Any, run: Any) -> None:
    token = 300
    forced = run(
        collect(
            engine,
            request("bias", max_tokens=5, temperature=0, logit_bias=((token, 100.0),)),
        )
    )
    assert forced[-1].completion_tokens == 5
    stopped = run(
        collect(
            engine,
            request(
                "stop-id",
                max_tokens=5,
                temperature=0,
                logit_bias=((token, 100.0),),
                stop_token_ids=(token,),
            ),
        )
    )
    assert (stopped[-1].completion_tokens, stopped[-1].finish_reason) == (1, "stop")
    held = run(
        collect(
            engine,
            request(
                "min",
                max_tokens=5,
                temperature=0,
                logit_bias=((token, 100.0),),
                stop_token_ids=(token,),
                min_tokens=3,
            ),
        )
    )
    assert (held[-1].completion_tokens, held[-1].finish_reason) == (4, "stop")


@pytest.mark.parametrize(
    ("messages", "sampling", "param"),
    [
        (HELLO, {"max_tokens": 2048}, "max_tokens"),
        ((ChatMessage("user", "word " * 3000),), {}, "messages"),
        (HELLO, {"logit_bias": ((10**6, 1.0),)}, "logit_bias"),
        (HELLO, {"stop_token_ids": (-1,)}, "stop_token_ids"),
        (HELLO, {"json_object": True}, "response_format"),
    ],
)
def test_bad_requests_raise_before_the_first_delta(
    engine: Any, run: Any, messages: tuple[ChatMessage, ...], sampling: dict[str, Any], param: str
) -> None:
    stream = engine.generate(request("bad", messages, **sampling))
    with pytest.raises(BadRequest) as caught:
        run(anext(stream))
    assert caught.value.param == param
    assert engine.load().running == 0 and engine.load().waiting == 0
    assert run(collect(engine, request("after", max_tokens=2)))[-1].completion_tokens == 2


def test_concurrent_requests_are_batched_and_greedy_rows_match_alone(engine: Any, run: Any) -> None:
    def ask(i: int) -> TextRequest:
        # Prompts of different lengths: left padding must not change the text.
        messages = (ChatMessage("user", "tell me " * (i + 1)),)
        return request(f"b{i}", messages, max_tokens=16, temperature=0, ignore_eos=True)

    alone = [text_of(run(collect(engine, ask(i)))) for i in (0, 5)]

    async def burst() -> list[list[TextDelta]]:
        return await asyncio.gather(*(collect(engine, ask(i)) for i in range(8)))

    before = len(engine.batch_sizes)
    results = run(burst())
    assert all(r[-1].completion_tokens == 16 for r in results)
    sizes = list(engine.batch_sizes)[before:]
    assert max(sizes) > 1 and sum(sizes) == 8
    assert [text_of(results[0]), text_of(results[5])] == alone


def test_closing_the_stream_aborts_the_request(engine: Any, run: Any) -> None:
    async def scenario() -> tuple[int, int]:
        stream = engine.generate(request("long", max_tokens=2000, ignore_eos=True))
        await anext(stream)
        running = engine.load().running
        await stream.aclose()
        # No wait: an aborted row stops counting at once, where one that
        # ran on would count until its 2,000 tokens were done.
        return running, engine.load().running

    running, after_close = run(scenario())
    assert (running, after_close) == (1, 0)
    # The worker is free again: a short request completes quickly.
    assert run(collect(engine, request("next", max_tokens=2)), timeout=10)


def test_multibyte_characters_are_never_split(tiny_chat_dir: Path) -> None:
    from transformers import AutoTokenizer

    from inferd.engines.transformers import IncrementalDecoder

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_dir)
    text = "héllo wörld — 東京 🚀"
    decoder = IncrementalDecoder(tokenizer)
    seen = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        decoder.add(token)
        seen.append(decoder.text)
    assert all("\ufffd" not in s for s in seen)
    assert decoder.text == text


def test_engine_settings_it_can_apply_and_those_it_refuses(
    tiny_chat_dir: Path, loop: LoopThread
) -> None:
    from inferd.api.engine_settings import EngineSettings
    from inferd.engines.base import UnknownEngineOption
    from inferd.engines.transformers import TransformersTextEngine

    short = EngineSettings(maxModelLen=64, dtype="bfloat16")
    engine = TransformersTextEngine(
        "tiny-chat", tiny_chat_dir, EngineOptions(device="cpu", max_model_len=1024, settings=short)
    )
    loop.run(engine.start())
    try:
        assert engine.info.context_length == 64  # the endpoint's, over the server's 1024
        with pytest.raises(BadRequest, match="context"):
            loop.run(collect(engine, request("long", max_tokens=60)))
    finally:
        loop.run(engine.shutdown())
    with pytest.raises(UnknownEngineOption, match="maxNumSeqs"):
        TransformersTextEngine(
            "tiny-chat", tiny_chat_dir, EngineOptions(settings=EngineSettings(maxNumSeqs=2))
        )
