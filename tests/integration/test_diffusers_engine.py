"""The diffusers engine on the real tiny-sdxl pipeline, on the CPU."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.engines.base import EngineOptions, ImageEngine, ImageRequest
from inferd.errors import BadRequest, ServiceUnavailable
from inferd.testing import LoopThread
from tests.support import needs

pytestmark = needs("diffusers")


class CountingPipeline:
    """Wraps the real pipeline; records how many calls overlap."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)

    def __call__(self, **kwargs: Any) -> Any:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
        try:
            return self._pipeline(**kwargs)
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(tiny_sdxl_dir: Path, loop: LoopThread) -> Iterator[Any]:
    from inferd.engines.diffusers import DiffusersImageEngine, load_pipeline

    def loader(path: Path, device: str, dtype: Any) -> CountingPipeline:
        return CountingPipeline(load_pipeline(path, device, dtype))

    engine = DiffusersImageEngine(
        "tiny-sdxl",
        tiny_sdxl_dir,
        # Batching as on CUDA, so the tests below exercise it (the CPU default is 1).
        EngineOptions(device="cpu", extra={"max_batch_images": 4}),
        loader=loader,
    )
    loop.run(engine.start())
    yield engine
    loop.run(engine.shutdown())


@pytest.fixture
def run(loop: LoopThread) -> Any:
    return loop.run


def decode(png: bytes) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    image.load()
    return image


def small(request_id: str, **kw: Any) -> ImageRequest:
    return ImageRequest(request_id, kw.pop("prompt", "a cat"), width=256, height=256, **kw)


def test_is_an_image_engine_with_the_models_defaults(engine: Any, run: Any) -> None:
    assert isinstance(engine, ImageEngine)
    info = engine.info
    assert info.default_size == (1024, 1024)
    assert info.default_steps == 2
    assert info.side_multiple == 64  # VAE factor 8 x three UNet downsamplings


def test_default_request_gives_one_1024_png(engine: Any, run: Any) -> None:
    pngs = run(engine.generate(ImageRequest("default", "a lighthouse")))
    assert len(pngs) == 1
    image = decode(pngs[0])
    assert (image.format, image.size, image.mode) == ("PNG", (1024, 1024), "RGB")


def test_n_images_of_the_requested_size(engine: Any, run: Any) -> None:
    request = ImageRequest("n3", "a cat", n=3, width=512, height=256)
    pngs = run(engine.generate(request))
    assert len(pngs) == 3
    assert all(decode(p).size == (512, 256) for p in pngs)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 5}, "n"),  # max_n is 4
        ({"width": 1000, "height": 1000}, "size"),  # not a multiple of 64
        ({"width": 128, "height": 256}, "size"),  # below the smallest side
        ({"width": 4096, "height": 1024}, "size"),  # above the largest
        ({"num_inference_steps": 0}, "steps"),
    ],
)
def test_bad_requests_are_refused(
    engine: Any, run: Any, fields: dict[str, Any], param: str
) -> None:
    request = ImageRequest("bad", "a cat", **{"width": 256, "height": 256, **fields})
    with pytest.raises(BadRequest) as caught:
        run(engine.generate(request))
    assert caught.value.param == param
    assert engine.load().waiting == 0


def test_the_engine_serves_after_bad_requests(engine: Any, run: Any) -> None:
    with pytest.raises(BadRequest):
        run(engine.generate(small("bad", n=99)))
    assert len(run(engine.generate(small("after-bad")))) == 1


def test_concurrent_requests_never_overlap_in_the_pipeline_and_are_batched(
    engine: Any, run: Any
) -> None:
    pipeline = engine.pipeline
    calls_before = pipeline.calls

    async def burst() -> list[list[bytes]]:
        return await asyncio.gather(
            *(engine.generate(small(f"c{i}", prompt=f"cat number {i}")) for i in range(8))
        )

    results = run(burst())
    assert [len(r) for r in results] == [1] * 8
    assert all(decode(r[0]).size == (256, 256) for r in results)
    assert pipeline.peak == 1
    # Queued requests of the same shape share pipeline calls.
    assert pipeline.calls - calls_before < 8
    assert max(list(engine.batch_sizes)[-8:]) > 1
    assert engine.load().running == 0 and engine.load().waiting == 0


def test_seed_reproduces_the_images_of_a_direct_pipeline_call(engine: Any, run: Any) -> None:
    import numpy as np
    import torch
    from PIL import Image

    first = run(engine.generate(small("s1", seed=7, n=2)))
    second = run(engine.generate(small("s2", seed=7, n=2)))
    other = run(engine.generate(small("s3", seed=8, n=2)))
    assert first == second
    assert first != other
    # The engine is idle: calling its pipeline here cannot overlap.
    direct = engine.pipeline(
        prompt="a cat",
        width=256,
        height=256,
        num_images_per_prompt=2,
        num_inference_steps=engine.info.default_steps,
        guidance_scale=5.0,
        generator=torch.Generator("cpu").manual_seed(7),
        output_type="pil",
    ).images
    for png, image in zip(first, direct, strict=True):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), np.asarray(image))


def test_a_cancelled_request_leaves_the_queue(engine: Any, run: Any) -> None:
    async def scenario() -> tuple[int, list[bytes]]:
        slow = asyncio.ensure_future(engine.generate(ImageRequest("slow", "a")))
        queued = asyncio.ensure_future(engine.generate(small("queued", seed=1)))
        await asyncio.sleep(0.1)
        queued.cancel()
        await asyncio.sleep(0.05)
        waiting = engine.load().waiting
        return waiting, await slow

    waiting, pngs = run(scenario())
    assert waiting == 0
    assert len(pngs) == 1
    assert engine.load().running == 0


def test_a_client_gone_mid_generation_frees_the_pipeline_at_the_next_step(
    engine: Any, run: Any
) -> None:
    async def scenario() -> float:
        # 200 steps at 1024x1024 would take a minute on this CPU.
        long = asyncio.ensure_future(
            engine.generate(ImageRequest("long", "a", num_inference_steps=200))
        )
        for _ in range(1000):  # until the worker has started it
            if engine.load().running:
                break
            await asyncio.sleep(0.01)
        long.cancel()
        cancelled = time.monotonic()
        await engine.generate(small("next"))
        return time.monotonic() - cancelled

    assert run(scenario(), timeout=30) < 5
    assert engine.load().running == 0


def test_shutdown_stops_the_worker(tiny_sdxl_dir: Path) -> None:
    from inferd.engines.diffusers import DiffusersImageEngine

    async def scenario() -> None:
        engine = DiffusersImageEngine("tiny-sdxl", tiny_sdxl_dir, EngineOptions(device="cpu"))
        await engine.start()
        await engine.check_health()
        await engine.shutdown()
        with pytest.raises(RuntimeError):
            await engine.check_health()
        with pytest.raises(ServiceUnavailable):
            await engine.generate(small("late"))

    asyncio.run(scenario())


def test_fast_settings_fuse_qkv_set_channels_last_and_wrap_in_compile(tiny_sdxl_dir: Path) -> None:
    """What `optimize=True` does to a pipeline on CUDA, checked on a fresh CPU
    copy (the compile itself is lazy: wrapping costs nothing until a call)."""
    import torch

    from inferd.engines.diffusers import _optimize_for_cuda, load_pipeline

    unwrapped = load_pipeline(tiny_sdxl_dir, "cpu", torch.float32)
    _optimize_for_cuda(unwrapped, "none")
    conv = unwrapped.unet.conv_in.weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert not conv.is_contiguous()  # really reordered, not a 1x1 no-op
    assert any(name.endswith("to_qkv") for name, _ in unwrapped.unet.named_modules())
    assert not isinstance(unwrapped.unet, torch._dynamo.eval_frame.OptimizedModule)

    compiled = load_pipeline(tiny_sdxl_dir, "cpu", torch.float32)
    _optimize_for_cuda(compiled, "default")
    assert isinstance(compiled.unet, torch._dynamo.eval_frame.OptimizedModule)

    with pytest.raises(ValueError, match="compile_mode 'fastest'"):
        _optimize_for_cuda(load_pipeline(tiny_sdxl_dir, "cpu", torch.float32), "fastest")


def test_optimize_is_not_applied_on_the_cpu(tiny_sdxl_dir: Path) -> None:
    """`--optimize` on a CPU replica serves the plain pipeline (compiling the
    tiny model costs more than it saves), and an unknown compile mode is
    never reached there."""
    import torch

    from inferd.engines.diffusers import DiffusersImageEngine

    async def scenario() -> Any:
        options = EngineOptions(device="cpu", optimize=True, extra={"compile_mode": "fastest"})
        engine = DiffusersImageEngine("tiny-sdxl", tiny_sdxl_dir, options)
        await engine.start()
        try:
            (png,) = await engine.generate(small("optimize-on-cpu"))
            return engine.pipeline.unet, decode(png).size
        finally:
            await engine.shutdown()

    unet, size = asyncio.run(scenario())
    assert not isinstance(unet, torch._dynamo.eval_frame.OptimizedModule)
    assert size == (256, 256)


def test_on_the_cpu_each_image_gets_its_own_pipeline_call_by_default(tiny_sdxl_dir: Path) -> None:
    """Batching is the CUDA default only: on the CPU one image already keeps
    every core busy, and a prompt list measured slower than one call each."""
    from inferd.engines.diffusers import DiffusersImageEngine

    async def scenario() -> list[int]:
        engine = DiffusersImageEngine("tiny-sdxl", tiny_sdxl_dir, EngineOptions(device="cpu"))
        await engine.start()
        try:
            results = await asyncio.gather(
                *(engine.generate(small(f"cpu{i}", prompt=f"dog {i}")) for i in range(4))
            )
            assert [len(r) for r in results] == [1] * 4
            return list(engine.batch_sizes)
        finally:
            await engine.shutdown()

    assert asyncio.run(scenario()) == [1, 1, 1, 1]


def test_a_traced_request_has_a_span_per_denoising_step_under_the_replicas_span(
    engine: Any, run: Any
) -> None:
    """The replica's span (set by the answering path as the current
    traceparent) is the parent of the pipeline's span, and that of one span
    per step; an untraced request in the same engine makes none."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferd import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(tracing.TracingSettings("http://unused:4318"), "inferd-replica", exporter)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

    async def generate(traceparent: str | None) -> list[bytes]:
        tracing.CURRENT_TRACEPARENT.set(traceparent)  # as the answering path does
        request = ImageRequest("traced", "a fox", width=256, height=256, num_inference_steps=3)
        return await engine.generate(request)

    try:
        assert len(run(generate(None))) == 1
        assert exporter.get_finished_spans() == ()
        assert len(run(generate(f"00-{trace_id}-{parent_id}-01"))) == 1
    finally:
        tracing.configure(tracing.NO_TRACING, "inferd")
    spans = exporter.get_finished_spans()
    call = next(s for s in spans if s.name == "diffusers.generate")
    steps = sorted(
        (s for s in spans if s.name == "diffusers.generate step"), key=lambda s: s.start_time
    )
    assert f"{call.context.trace_id:032x}" == trace_id
    assert f"{call.parent.span_id:016x}" == parent_id
    assert [s.attributes["inferd.step"] for s in steps] == [0, 1, 2]
    assert all(s.parent.span_id == call.context.span_id for s in steps)
    assert call.attributes["inferd.steps"] == 3
    assert call.start_time <= steps[0].start_time and steps[-1].end_time <= call.end_time
