"""Text-to-image through a diffusers pipeline (SDXL-style), in this process.

One pipeline, one thread. A diffusers pipeline keeps per-call state on
itself (scheduler timesteps, guidance scale, the interrupt flag), so two
requests must never drive it at once. Every pipeline call, the load
included, runs on one dedicated worker thread fed by a queue; the event loop
only waits on futures. PNG encoding runs in the default executor, so the
encoding of one batch overlaps the denoising of the next.

Batching (on CUDA): the worker takes the oldest queued job and adds the
queued jobs that share its size, steps, guidance and negative prompt (up to
`max_batch_images` images, 4 by default on CUDA), then makes one pipeline
call with a prompt list.
Seeded jobs run alone with one `torch.Generator` on the CPU, as a direct
`pipeline(prompt, generator=torch.Generator().manual_seed(seed))` call would:
their images are reproducible whatever else is queued. A client that goes
away cancels its queued job; a batch whose jobs have all gone is stopped at
the next step. On the CPU the default is one image per call: there one
image already keeps every core busy, and a prompt list only makes larger
tensors (benchmarks/replica_vs_pipeline.py, tiny-sdxl on a 2-core CPU: one
call of 4 prompts gave 0.70-0.73x the images/s of 4 calls at 1024x1024 and
0.77-0.86x at 512x512). Batching pays where one image leaves the device idle:
GPUs.

Defaults (size, steps, guidance, limits) come from, in order:
`options.serving` (the catalog's `ServingDefaults`), an `inferd.json` in the model
directory (written by the tiny-model builder), then the pipeline itself
(`default_sample_size * vae_scale_factor`) and the constants below.

Fast settings (`options.optimize` on CUDA), after diffusers' SDXL guide:
SDPA attention (the default with torch 2), fused QKV projections,
channels-last UNet and VAE, and `torch.compile` of the UNet and the VAE
decoder. The first call at each size compiles, which the replica's warm-up
pays for the default size. The compile mode is `DiffusersOptions.compile_mode`
(`default`, `reduce-overhead`, `max-autotune`, `max-autotune-no-cudagraphs`,
or `none` for the other settings without compiling). It is `default`, not the
guide's `max-autotune`, because of what benchmarks/gpu_images.py measured on
an H100 (full-size SDXL, fp16, 1024x1024, 30 steps): `default` compiles in
134 s and gives 1.50 s per image against 2.59 s uncompiled; `max-autotune`
(with the guide's coordinate-descent tuning) had not finished compiling after
330 s, a warm-up no scale-from-zero wake-up should wait for. On the CPU none
of these pays for the tiny test model, so they are not applied there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import io
import json
import logging
import queue
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd.engines.base import (
    EngineLoad,
    EngineOptions,
    ImageModelInfo,
    ImageRequest,
    engine_options,
    refuse_settings,
    validate_image_request,
)
from inferd.errors import ServiceUnavailable
from inferd.quiet_warnings import drop_torchvision_fallback_warning
from inferd.tracing import CURRENT_TRACEPARENT, StepSpans, tracer
from inferd.vocab import ModelKind

logger = logging.getLogger(__name__)

FALLBACK_STEPS = 30  # SDXL base's usual count; the catalog normally says.
FALLBACK_GUIDANCE = 5.0  # the SDXL pipeline's own default
DEFAULT_MAX_N = 4
DEFAULT_MAX_BATCH_IMAGES = {"cuda": 4, "cpu": 1}  # by device; see "Batching"
# zlib level 1: several times faster than PIL's default (6) on 1024x1024
# images, for files a little larger.
PNG_COMPRESS_LEVEL = 1
COMPILE_MODE = "default"
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class DiffusersOptions:
    # Images per pipeline call; None: by device (DEFAULT_MAX_BATCH_IMAGES).
    max_batch_images: int | None = None
    compile_mode: str = COMPILE_MODE


class _Aborted(Exception):
    """Raised inside the pipeline's step callback when nobody waits any more."""


@dataclass(eq=False)
class _Job:
    request: ImageRequest
    steps: int
    guidance: float
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    # Set from the event loop when the waiting request is cancelled.
    abandoned: threading.Event = field(default_factory=threading.Event)
    # The replica's span of this request, the parent of the pipeline's spans.
    traceparent: str | None = field(default_factory=CURRENT_TRACEPARENT.get)

    def batch_key(self) -> tuple[Any, ...] | None:
        if self.request.seed is not None:
            return None  # runs alone
        r = self.request
        return (r.width, r.height, self.steps, self.guidance, r.negative_prompt)


def _resolve_device(options: EngineOptions) -> str:
    import torch

    if options.device == "cpu":
        return "cpu"
    if options.device in ("cuda", "auto") and torch.cuda.is_available():
        return f"cuda:{options.gpu_ids[0]}" if options.gpu_ids else "cuda"
    if options.device == "cuda":
        raise RuntimeError("device 'cuda' was asked for, but torch sees no GPU")
    return "cpu"


def _resolve_dtype(options: EngineOptions, device: str) -> Any:
    import torch

    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if options.dtype == "auto":
        return torch.float32 if device == "cpu" else torch.float16
    try:
        return names[options.dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {options.dtype!r} for the diffusers engine") from None


def load_pipeline(model_path: Path, device: str, dtype: Any) -> Any:
    """Load a text-to-image pipeline on `device`; the default loader."""
    drop_torchvision_fallback_warning()
    from diffusers import AutoPipelineForText2Image
    from diffusers.utils import deprecation_utils

    # Newer diffusers take `dtype` and warn about `torch_dtype`; older ones
    # know only `torch_dtype`.
    renamed = hasattr(deprecation_utils, "_TORCH_DTYPE_DEPRECATION_MESSAGE")
    dtype_arg = {"dtype" if renamed else "torch_dtype": dtype}
    pipeline = AutoPipelineForText2Image.from_pretrained(str(model_path), **dtype_arg)
    pipeline.to(device)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def encode_pngs(pipeline_output: Any) -> list[bytes]:
    """float images in [0, 1] (numpy, NHWC) -> PNG bytes, as the pipeline's
    own `output_type="pil"` would round them."""
    import numpy as np
    from diffusers.image_processor import VaeImageProcessor

    images = pipeline_output
    # A half-precision overflow gives NaNs: black pixels, not a cast warning.
    # The check is one cheap pass; the copying fix-up (tens of ms at
    # 1024x1024) is paid only when needed.
    if not np.isfinite(images).all():
        images = np.nan_to_num(images, nan=0.0, posinf=1.0, neginf=0.0)
    out = []
    for image in VaeImageProcessor.numpy_to_pil(images):
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        out.append(buf.getvalue())
    return out


def _optimize_for_cuda(pipeline: Any, compile_mode: str) -> None:
    """The fast settings, applied in place; `torch.compile` is lazy, so the
    compiling happens at the first call (the warm-up)."""
    import torch

    if compile_mode not in COMPILE_MODES:
        raise ValueError(
            f"unknown compile_mode {compile_mode!r} for the diffusers engine; "
            f"one of {', '.join(COMPILE_MODES)}"
        )

    if hasattr(pipeline, "fuse_qkv_projections"):
        pipeline.fuse_qkv_projections()
    pipeline.unet.to(memory_format=torch.channels_last)
    pipeline.vae.to(memory_format=torch.channels_last)
    inductor = torch._inductor.config
    inductor.conv_1x1_as_mm = True
    inductor.epilogue_fusion = False
    if compile_mode.startswith("max-autotune"):
        # The guide's per-kernel tuning: a few percent at run time, many
        # minutes of compiling on a full-size UNet.
        inductor.coordinate_descent_tuning = True
        inductor.coordinate_descent_check_all_directions = True
    if compile_mode == "none":
        return
    pipeline.unet = torch.compile(pipeline.unet, mode=compile_mode, fullgraph=True)
    pipeline.vae.decode = torch.compile(pipeline.vae.decode, mode=compile_mode, fullgraph=True)


class DiffusersImageEngine:
    kind = ModelKind.IMAGE

    def __init__(
        self,
        name: str,
        model_path: Path,
        options: EngineOptions,
        *,
        loader: Any = load_pipeline,
    ) -> None:
        """`loader(model_path, device, dtype) -> pipeline`; tests inject an
        instrumented one."""
        self._name = name
        self._model_path = model_path
        self._options = options
        self._own = engine_options(DiffusersOptions, options.extra, "diffusers")
        # An image pipeline has no context, KV cache or batch scheduler.
        refuse_settings(options, "diffusers", frozenset())
        self._loader = loader
        self._pipeline: Any = None
        self._info: ImageModelInfo | None = None
        self._default_guidance = FALLBACK_GUIDANCE
        self._max_batch_images = 1  # set at load, once the device is known
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running = 0  # requests inside the current pipeline call
        self._pending: set[_Job] = set()  # queued, not yet taken by the worker
        self._stopping = False
        self.batch_sizes: deque[int] = deque(maxlen=1000)  # requests per call, newest last

    @property
    def info(self) -> ImageModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    @property
    def pipeline(self) -> Any:
        """The loaded pipeline (for benchmarks that call it directly)."""
        return self._pipeline

    async def start(self) -> None:
        loaded: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._worker = threading.Thread(
            target=self._work, args=(loaded,), name=f"diffusers-{self._name}", daemon=True
        )
        self._worker.start()
        await asyncio.wrap_future(loaded)

    # -- requests -----------------------------------------------------------

    async def generate(self, request: ImageRequest) -> list[bytes]:
        if self._info is None or self._stopping:
            raise ServiceUnavailable("The model is not loaded.", code="model_loading")
        validate_image_request(self._info, request)
        job = _Job(
            request,
            steps=request.num_inference_steps or self._info.default_steps,
            guidance=(
                request.guidance_scale
                if request.guidance_scale is not None
                else self._default_guidance
            ),
        )
        with self._lock:
            self._pending.add(job)
        self._jobs.put(job)
        try:
            images = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.abandoned.set()
            if job.future.cancelled():  # never started: no longer waiting
                self._take(job)
            raise
        return await asyncio.to_thread(encode_pngs, images)

    def load(self) -> EngineLoad:
        with self._lock:
            return EngineLoad(running=self._running, waiting=len(self._pending))

    async def check_health(self) -> None:
        if self._pipeline is None:
            raise RuntimeError("engine not started")
        if self._worker is None or not self._worker.is_alive():
            raise RuntimeError("the diffusers worker thread has stopped")

    async def shutdown(self) -> None:
        self._stopping = True
        if self._worker is not None and self._worker.is_alive():
            self._jobs.put(None)
            await asyncio.to_thread(self._worker.join)
        self._worker = None

    # -- the worker thread --------------------------------------------------

    def _work(self, loaded: concurrent.futures.Future[None]) -> None:
        try:
            self._load()
        except BaseException as exc:
            loaded.set_exception(exc)
            return
        loaded.set_result(None)
        held: deque[_Job] = deque()  # taken off the queue, not batchable yet
        stop = False
        while not stop:
            if held:
                first = held.popleft()
            else:
                got = self._jobs.get()
                if got is None:
                    break
                first = got
            batch = [first]
            key = first.batch_key()
            images = first.request.n
            if key is not None:
                for job in list(held):
                    if job.batch_key() == key and images + job.request.n <= self._max_batch_images:
                        held.remove(job)
                        batch.append(job)
                        images += job.request.n
                while images < self._max_batch_images:
                    try:
                        got = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if got is None:
                        stop = True
                        break
                    if got.batch_key() == key and images + got.request.n <= self._max_batch_images:
                        batch.append(got)
                        images += got.request.n
                    else:
                        held.append(got)
            self._run_batch(batch)
        self._fail_pending(list(held))

    def _fail_pending(self, held: list[_Job]) -> None:
        while True:
            try:
                got = self._jobs.get_nowait()
            except queue.Empty:
                break
            if got is not None:
                held.append(got)
        for job in held:
            self._take(job)
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ServiceUnavailable("The replica is shutting down."))

    def _take(self, job: _Job) -> None:
        with self._lock:
            self._pending.discard(job)

    def _load(self) -> None:
        device = _resolve_device(self._options)
        dtype = _resolve_dtype(self._options, device)
        own = self._own
        self._max_batch_images = (
            own.max_batch_images or (DEFAULT_MAX_BATCH_IMAGES["cpu" if device == "cpu" else "cuda"])
        )
        pipeline = self._loader(self._model_path, device, dtype)
        if self._options.optimize and device.startswith("cuda"):
            _optimize_for_cuda(pipeline, own.compile_mode)
        self._pipeline = pipeline
        self._info, self._default_guidance = self._model_info(pipeline)
        logger.info("loaded %s on %s (%s): %s", self._model_path, device, dtype, self._info)

    def _model_info(self, pipeline: Any) -> tuple[ImageModelInfo, float]:
        served: dict[str, Any] = {}
        sidecar = self._model_path / "inferd.json"
        if sidecar.is_file():
            served = json.loads(sidecar.read_text())
        served.update(self._options.serving.given())
        vae_factor = int(getattr(pipeline, "vae_scale_factor", 8))
        unet_config = pipeline.unet.config
        unet_factor = 2 ** (len(unet_config.down_block_types) - 1)
        if "default_size" in served:
            width, height = (int(x) for x in served["default_size"])
        else:
            latent = int(getattr(pipeline, "default_sample_size", 0) or unet_config.sample_size)
            width = height = latent * vae_factor
        info = ImageModelInfo(
            name=self._name,
            default_size=(width, height),
            max_n=int(served.get("max_n", DEFAULT_MAX_N)),
            min_side=int(served.get("min_side", 256)),
            max_side=int(served.get("max_side", 2048)),
            side_multiple=vae_factor * unet_factor,
            default_steps=int(served.get("default_steps", FALLBACK_STEPS)),
        )
        guidance = served.get("default_guidance_scale")
        if guidance is None:
            signature = inspect.signature(type(pipeline).__call__)
            parameter = signature.parameters.get("guidance_scale")
            guidance = (
                parameter.default
                if parameter is not None and parameter.default is not inspect.Parameter.empty
                else FALLBACK_GUIDANCE
            )
        return info, float(guidance)

    def _run_batch(self, batch: list[_Job]) -> None:
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        with self._lock:
            self._pending.difference_update(batch)
            self._running = len(live)
        if not live:
            return
        self.batch_sizes.append(len(live))
        traces = self._traces(live)
        try:
            images = self._call_pipeline(live, traces)
        except _Aborted as exc:
            _end_traces(traces, exc)
            for job in live:
                job.future.set_exception(ServiceUnavailable("The request was abandoned."))
        except Exception as exc:
            _end_traces(traces, exc)
            for job in live:
                job.future.set_exception(exc)
        else:
            _end_traces(traces)
            start = 0
            for job in live:
                job.future.set_result(images[start : start + job.request.n])
                start += job.request.n
        finally:
            with self._lock:
                self._running = 0

    def _traces(self, jobs: list[_Job]) -> list[StepSpans]:
        """A span per traced request in the batch, each with a child per
        denoising step (the steps are shared: one batch, one loop)."""
        found = []
        for job in jobs:
            attributes = {
                "inferd.model": self._name,
                "inferd.batch_size": len(jobs),
                "inferd.images": job.request.n,
                "inferd.width": job.request.width,
                "inferd.height": job.request.height,
                "inferd.steps_asked": job.steps,
            }
            spans = tracer().steps("diffusers.generate", job.traceparent, attributes)
            if spans is not None:
                found.append(spans)
        return found

    def _call_pipeline(self, jobs: list[_Job], traces: Sequence[StepSpans] = ()) -> Any:
        import torch

        first = jobs[0]
        r = first.request
        prompts = [job.request.prompt for job in jobs for _ in range(job.request.n)]
        kwargs: dict[str, Any] = {
            "width": r.width,
            "height": r.height,
            "num_inference_steps": first.steps,
            "guidance_scale": first.guidance,
            "output_type": "np",
            "callback_on_step_end": self._step_callback(jobs, traces),
        }
        if len(jobs) == 1:
            # As a direct call would: one prompt, n images, one generator.
            kwargs["prompt"] = r.prompt
            kwargs["num_images_per_prompt"] = r.n
            if r.negative_prompt is not None:
                kwargs["negative_prompt"] = r.negative_prompt
            if r.seed is not None:
                kwargs["generator"] = torch.Generator("cpu").manual_seed(r.seed)
        else:
            kwargs["prompt"] = prompts
            if r.negative_prompt is not None:
                kwargs["negative_prompt"] = [r.negative_prompt] * len(prompts)
        with torch.inference_mode():
            return self._pipeline(**kwargs).images

    @staticmethod
    def _step_callback(jobs: list[_Job], traces: Sequence[StepSpans] = ()) -> Any:
        def on_step_end(
            pipeline: Any, step: int, timestep: Any, tensors: dict[str, Any]
        ) -> dict[str, Any]:
            for spans in traces:
                spans.step()
            if all(job.abandoned.is_set() for job in jobs):
                raise _Aborted
            return tensors

        return on_step_end


def _end_traces(traces: Sequence[StepSpans], error: BaseException | None = None) -> None:
    for spans in traces:
        spans.end(error)
